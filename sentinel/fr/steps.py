"""A rank's compute time per step, from frequent samples of its Flight Recorder's per-group counters.

The probe samples ``pg_status`` (last enqueued / started / completed collective per process group, no
entries: microseconds) at random instants ``sample_s`` apart on average. A *step* ends when the step group
(the default group, pg 0: the world's gradient allreduce) completes a collective; the rank then computes
until it starts its next collective in any group. That gap — measured on the rank's own clock, each end
placed at the middle of the sample interval it fell in, so to about one sample interval per step — is what
:class:`~sentinel.fr.heads.StepTime` carries. (At a fixed sample period every gap would read as a whole
number of periods, and so would a median over steps: the instants are random so that each step's error is
continuous and symmetric, and a median over steps converges to the compute time; see
``sentinel.probe.SAMPLE_JITTER``.) A rank slowed by its own GPU, input or host computes
longer; a peer that waits for it waits *inside* a collective, so its gap is unchanged.

ProcessGroupNCCL's counters in a group that posts send/recv (torch 2.5+) mix two sequences: each value is
the seq of the group's last enqueued / started / completed *work*, a collective's from its collective
counter, a send/recv's (or a batch's) from its p2p counter (see :func:`sentinel.fr.summary._apply_status`).
So in such a group a value says only that *some* work moved, not which: a completed recv #57 after
all_reduce #6 reads 6 → 57 (no collective completed), all_reduce #7 enqueued after it reads 57 → 7. The
caller says which groups mix (the probe learns them from its dumps with entries, ``_p2p_groups``): there a
*change* of the enqueued value ends a compute gap (the rank entered a send/recv or a collective: either is
communication, where a peer that waits for it waits), and the completed value never ends a step — a step
group that mixes gives no step times from its counters (none rather than a send/recv read as a step).

Pure: samples (time, counters) in, step times out; no torch, no clock of its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

from sentinel.fr.heads import MAX_STEPS, StepTime

STEP_GROUP = "0"  # torch's default process group id


def _counters(status: Mapping[str, Any], mixed: Collection[str]) -> dict[str, tuple[int, int]]:
    """pg id → (entered, completed); entered is the started count where the build reports it, but in a
    group whose counters mix (``mixed``) the enqueued one: ProcessGroupNCCL's watchdog raises the started
    value only above itself (all_reduce #7 starting after send #57 leaves 57), ``workEnqueue`` sets the
    enqueued one for every work."""
    out: dict[str, tuple[int, int]] = {}
    for pg_id, st in status.items():
        if not isinstance(st, Mapping):
            continue
        try:
            enqueued = int(st.get("last_enqueued_collective", -1))
            started = int(st.get("last_started_collective", -1))
            completed = int(st.get("last_completed_collective", -1))
        except (TypeError, ValueError):
            continue
        # NCCL enqueues asynchronously (the CPU runs ahead of the GPU): when start times are recorded the
        # started count says when the GPU reached the collective; gloo and builds without timing report -1.
        key = str(pg_id)
        out[key] = (started if started >= 0 and key not in mixed else enqueued, completed)
    return out


class StepClock:
    """Turns ``observe(t, pg_status)`` samples into the rank's latest step compute times."""

    def __init__(self, step_group: str = STEP_GROUP, kept: int = MAX_STEPS) -> None:
        self.step_group = step_group
        self.steps: deque[StepTime] = deque(maxlen=kept)
        self._prev_t: float | None = None
        self._prev: dict[str, tuple[int, int]] = {}
        self._done_at: float | None = (
            None  # when the last step collective completed (awaiting the next entry)
        )
        self._done_seq = -1
        self._entered_at_done: dict[str, int] = {}

    def observe(self, t: float, status: Mapping[str, Any], mixed: Collection[str] = ()) -> None:
        """One sample of ``pg_status`` at ``t``; ``mixed``: the pg ids (as in ``status``) of the groups
        whose counters mix send/recv and collective work (see the module docstring)."""
        now = _counters(status, mixed)
        step = now.get(self.step_group) if self.step_group not in mixed else None
        prev_t = self._prev_t if self._prev_t is not None else t
        mid = (prev_t + t) / 2.0
        if self._done_at is not None:  # computing since the last step: did it enter a collective?
            for pg, (entered, _) in now.items():
                was = self._entered_at_done.get(pg, entered)
                if entered > was or (entered != was and pg in mixed):
                    self.steps.append(
                        StepTime(seq=self._done_seq + 1, compute_s=max(0.0, mid - self._done_at))
                    )
                    self._done_at = None
                    break
        if step is not None and self._prev_t is not None:
            before = self._prev.get(self.step_group)
            if before is not None and step[1] > before[1]:  # the step collective completed
                entered_now = {pg: c[0] for pg, c in now.items()}
                if step[0] > step[1]:  # and the next one began within the same interval: compute ~0
                    self.steps.append(StepTime(seq=step[1] + 1, compute_s=0.0))
                else:
                    self._done_at, self._done_seq = mid, step[1]
                    self._entered_at_done = entered_now
        self._prev_t, self._prev = t, now

    def recent(self) -> list[StepTime]:
        return list(self.steps)
