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
#: The straggler's gate (is this host's clock within ``max_clock_rate_error``, 2%, of ours?) needs far less
#: than the 0.05% the reported rate is measured to: two windows one apart already bound it, with what the
#: delivery delays can hide added (:meth:`HostClock.rate_error`). Waiting for MIN_RATE_SPAN_S there kept every
#: rank of a newly heard host (every host, after an aggregator restart) from being judged for most of a
#: minute, which delayed naming a straggler at job scale (bench/aggregator.py --jobs).
GATE_SPAN_S = WINDOW_S
#: how much the least-delayed batch of one window may arrive later than another window's (LAN delivery and
#: an aggregator that keeps up: milliseconds; this allows an aggregator seconds behind on average)
DELAY_JITTER_S = 0.05


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
        """How far the host's clock rate may be from ours: the measured |rate - 1| plus what the windows'
        delivery delays can hide over their span (2 x DELAY_JITTER_S / span: 1% over 10 s, 0.03% over five
        minutes); infinite until two windows GATE_SPAN_S apart (20-30 s after the host is first heard)."""
        if len(self.windows) < 2:
            return math.inf
        (t0, off0), (t1, off1) = self.windows[0], self.windows[-1]
        span = t1 - t0
        if span < GATE_SPAN_S:
            return math.inf
        return abs(off1 - off0) / span + 2 * DELAY_JITTER_S / span
