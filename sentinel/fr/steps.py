"""A rank's compute time per step, from frequent samples of its Flight Recorder's per-group counters.

A step ends when the step group (pg 0) completes a collective; the rank computes until it enters its next
collective in any group. A rank slowed by its own GPU or input computes longer, while a peer waiting for it
waits *inside* a collective, so this gap names the straggler. Samples come at random instants so a median
over steps converges on the compute time. Where NCCL's counters mix collectives and send/recv, only a
change of the enqueued value is read, and step times come from entries (:func:`steps_from_entries`).
Pure: samples or entries in, step times out; no torch, no clock of its own.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from sentinel.fr.heads import MAX_STEPS, StepTime
from sentinel.fr.ops import P2P, entry_completed, op_name, reads_as_p2p

#: the longest compute gap a StepTime carries (its schema's bound)
_MAX_COMPUTE_S = 86400.0

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

    def add(self, steps: Iterable[StepTime]) -> None:
        """Step times measured elsewhere (:func:`steps_from_entries`, for a step group whose counters mix):
        those after the newest kept, in seq order (a dump repeats the steps the previous one held)."""
        newest = self.steps[-1].seq if self.steps else -1
        for step in sorted(steps, key=lambda s: s.seq):
            if step.seq > newest:
                self.steps.append(step)
                newest = step.seq


def _ns(value: Any) -> int | None:
    """A timestamp field as integer nanoseconds (None when absent, null or not an integer)."""
    if type(value) is int:
        return value if value > 0 else None
    if isinstance(value, str) and value.isdigit():
        return int(value) or None
    return None


def steps_from_entries(entries: Any, step_pg: int = int(STEP_GROUP)) -> list[StepTime]:
    """The compute gaps of the step collectives in a dump of every entry (oldest first): for each completed
    collective of group ``step_pg`` (seq k), the time from its ``time_discovered_completed_ns`` to the
    first time after it that the rank entered any op of any group — step k+1's compute, as
    :class:`StepClock` measures it from counters.

    *Entered* is ``time_discovered_started_ns`` (the device reached the op) when the dump records start
    times (``TORCH_NCCL_ENABLE_TIMING``), else ``time_created_ns`` (the CPU enqueued it): the started and
    enqueued counts of :func:`_counters`. With start times recorded, an entry without one has not started
    (scheduled) or has no work of its own (a batch's member: its closer carries the time). Send/recv and a
    batch's closer (:func:`sentinel.fr.ops.reads_as_p2p`) end a compute gap but never end a step; an
    entry of another shape, or without the times, is passed over."""
    if not isinstance(entries, list):
        return []
    timed = any(isinstance(e, dict) and _ns(e.get("time_discovered_started_ns")) for e in entries)
    entered: list[int] = []
    done: list[tuple[int, int]] = []  # (completed ns, collective seq) of the step group's collectives
    last_p2p: dict[Any, int] = {}  # group -> p2p seq of its previous entry when that was a send/recv
    for e in entries:
        if not isinstance(e, dict):
            continue
        start = _ns(e.get("time_discovered_started_ns" if timed else "time_created_ns"))
        if start is not None:
            entered.append(start)
        pg_id, seq, p2p_seq = e.get("pg_id"), e.get("collective_seq_id"), e.get("p2p_seq_id", -1)
        if type(pg_id) is not int or type(seq) is not int or type(p2p_seq) is not int:
            continue
        op = op_name(str(e.get("profiling_name", "")))
        p2p = reads_as_p2p(op, e.get("is_p2p"), p2p_seq, last_p2p.get(pg_id))
        if op in P2P:
            last_p2p[pg_id] = p2p_seq
        else:
            last_p2p.pop(pg_id, None)
        completed = _ns(e.get("time_discovered_completed_ns"))
        if pg_id == step_pg and not p2p and completed is not None and entry_completed(e):
            done.append((completed, seq))
    entered.sort()
    out: dict[int, StepTime] = {}
    for completed, seq in done:
        at = bisect.bisect_right(entered, completed)
        if at < len(entered):
            compute = (entered[at] - completed) / 1e9
            if compute <= _MAX_COMPUTE_S:
                out[seq + 1] = StepTime(seq=seq + 1, compute_s=compute)
    return [out[k] for k in sorted(out)]
