"""A rank's compute time per step, from frequent samples of its Flight Recorder's per-group counters.

The probe samples ``pg_status`` (last enqueued / started / completed collective per process group, no
entries: microseconds) every ``sample_s``. A *step* ends when the step group (the default group, pg 0: the
world's gradient allreduce) completes a collective; the rank then computes until it starts its next
collective in any group. That gap — measured on the rank's own clock, to about one sample interval — is
what :class:`~sentinel.fr.heads.StepTime` carries. A rank slowed by its own GPU, input or host computes
longer; a peer that waits for it waits *inside* a collective, so its gap is unchanged.

Pure: samples (time, counters) in, step times out; no torch, no clock of its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from sentinel.fr.heads import MAX_STEPS, StepTime

STEP_GROUP = "0"  # torch's default process group id


def _counters(status: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """pg id → (entered, completed); entered is the started count where the build reports it."""
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
        out[str(pg_id)] = (started if started >= 0 else enqueued, completed)
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

    def observe(self, t: float, status: Mapping[str, Any]) -> None:
        now = _counters(status)
        step = now.get(self.step_group)
        prev_t = self._prev_t if self._prev_t is not None else t
        mid = (prev_t + t) / 2.0
        if self._done_at is not None:  # computing since the last step: did it enter a collective?
            for pg, (entered, _) in now.items():
                if entered > self._entered_at_done.get(pg, entered):
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
