"""Xid floods: one GPU repeating one Xid thousands of times is sent as one event per window with a count.

A driver in a bad state prints the same Xid line over and over (one site logged 800,000 Xid 95 lines from
one GPU). Sent one by one, each would be an event in the ring, the spool, the wire and the aggregator's
judgement. :class:`XidFlood` lets the first occurrence of a (GPU, code, process, message) through at once —
detection is not delayed — and counts the repeats that follow within ``window_s``; when the window ends
with repeats, their latest occurrence is released with the count and the next window begins. A flood costs
one event per window, whatever its rate.

Pure (times passed in) and bounded: at most ``max_keys`` floods are followed; beyond, the oldest one's
repeats are released at once.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

Report = TypeVar("Report")
#: (GPU index, code, pid, message): what makes two Xid lines the same line again
FloodKey = tuple[int, int, int | None, str]


@dataclass(slots=True)
class _Window(Generic[Report]):
    ends: float
    repeats: int
    last: Report


class XidFlood(Generic[Report]):
    """Repeats of one Xid counted per window; ``offer`` says whether to send a report now."""

    def __init__(self, *, window_s: float = 10.0, max_keys: int = 4096) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        self._windows: OrderedDict[FloodKey, _Window[Report]] = OrderedDict()
        #: repeats counted into a later event instead of sent on their own
        self.coalesced = 0

    def offer(self, key: FloodKey, report: Report, t: float) -> tuple[bool, list[tuple[Report, int]]]:
        """One occurrence at ``t``: (send it now, the floods pushed out by the bound as (report, repeats))."""
        if self.window_s <= 0:
            return True, []
        window = self._windows.get(key)
        if window is not None and t < window.ends:
            window.repeats += 1
            window.last = report
            self.coalesced += 1
            return False, []
        pushed: list[tuple[Report, int]] = []
        if window is not None:  # its window is over: what it counted goes first, then this one opens anew
            del self._windows[key]
            if window.repeats:
                pushed.append((window.last, window.repeats))
        self._windows[key] = _Window(ends=t + self.window_s, repeats=0, last=report)
        while len(self._windows) > self.max_keys:
            _, oldest = self._windows.popitem(last=False)
            if oldest.repeats:
                pushed.append((oldest.last, oldest.repeats))
        return True, pushed

    def due(self, now: float) -> list[tuple[Report, int]]:
        """The repeats of windows that ended by ``now``, as (latest report, repeats); a window that counted
        repeats opens the next one (the flood may go on), one that counted none is forgotten."""
        out: list[tuple[Report, int]] = []
        for key, window in list(self._windows.items()):
            if window.ends > now:
                continue
            if window.repeats:
                out.append((window.last, window.repeats))
            if window.repeats and math.isfinite(now):
                window.repeats, window.ends = 0, now + self.window_s
            else:
                del self._windows[key]
        return out

    def __len__(self) -> int:
        return len(self._windows)
