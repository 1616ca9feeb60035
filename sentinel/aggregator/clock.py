"""An agent host's clock measured against the aggregator's, from the stamps on its own batches.

A rank measures its step compute times on its host's clock. A host whose clock runs 2x fast reports every
step twice as long: without this, it would be named a straggler (or a slow host) for a clock fault. Every
batch carries the agent's time (``Batch.t``) and arrives at a known aggregator time; their difference is the
host's clock offset plus the delivery delay. The delay is never negative (a batch cannot arrive before it was
stamped) and is often near zero, so the *largest* difference seen in a window is the offset with the least
delay in it; spooled batches resent long after they were stamped only lower a window's values and never
raise them. The slope of those per-window maxima over the last few minutes is the rate error.

Pure arithmetic on numbers handed in (agent time, aggregator time): no clock of its own.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

#: one window's largest (agent time - aggregator time)
WINDOW_S = 10.0
#: windows kept: the rate is measured over up to this many windows (about five minutes)
WINDOWS_KEPT = 30
#: the shortest span between the first and the last window for a rate (jitter of ~10 ms: < 0.05%)
MIN_RATE_SPAN_S = 30.0
#: how long after a host is first heard (or heard again after an aggregator restart) its rate is known, at
#: most: the windows spanning MIN_RATE_SPAN_S, the one in progress, and one of margin
RATE_KNOWN_AFTER_S = MIN_RATE_SPAN_S + 2 * WINDOW_S


@dataclass(slots=True)
class HostClock:
    """Offset and rate of one host's clock relative to the aggregator's (rate 1.0: same speed)."""

    windows: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=WINDOWS_KEPT))
    start: float = -math.inf  # aggregator time the current window began
    best: float = -math.inf  # its largest agent - aggregator difference so far

    def observe(self, agent_t: float, now: float) -> None:
        """A batch stamped ``agent_t`` by the agent arrived at aggregator time ``now``."""
        if not (math.isfinite(agent_t) and math.isfinite(now)):
            return
        if now - self.start >= WINDOW_S:
            if math.isfinite(self.best):
                self.windows.append((self.start, self.best))
            self.start, self.best = now, -math.inf
        self.best = max(self.best, agent_t - now)

    def reset(self) -> None:
        """A reboot (new boot id): the clock may have been set again."""
        self.windows.clear()
        self.start = self.best = -math.inf

    @property
    def offset_s(self) -> float | None:
        """Agent clock minus aggregator clock (seconds; None until a window is complete)."""
        if not self.windows:
            return None
        return self.windows[-1][1]

    @property
    def rate(self) -> float | None:
        """Agent seconds per aggregator second over the kept windows (None until they span 30 s)."""
        if len(self.windows) < 2:
            return None
        (t0, off0), (t1, off1) = self.windows[0], self.windows[-1]
        span = t1 - t0
        if span < MIN_RATE_SPAN_S:
            return None
        return 1.0 + (off1 - off0) / span

    def rate_error(self) -> float:
        """|rate - 1|; infinite while not yet measured (about 40 s after the host is first heard)."""
        rate = self.rate
        return math.inf if rate is None else abs(rate - 1.0)
