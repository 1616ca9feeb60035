"""Refused connections and frames: every one counted, the log kept to a few lines however many there are.

A flood of refusals (idle sockets from one address, a wrong token retried in a tight loop, garbage frames)
used to write one log line each. Now each refusal increments ``sentinel_ingest_rejected_total{reason}``
(watched by the ``SentinelIngestRefusing`` alert) and the log gets, per interval, the *first* refusal of
each reason with its details (peer, host, why) and one ``connections_refused`` summary line with the counts
by reason of the ones that were not logged. The summary is written by the next refusal after the interval or
by :meth:`RefusalLog.flush`, which the aggregator's tick loop calls, so a flood that stops is still summed up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Literal

from sentinel.aggregator.metrics import AggregatorMetrics
from sentinel.log import get_logger

Level = Literal["info", "warning", "error"]


def log() -> Any:
    return get_logger(module="aggregator.refusals")


class RefusalLog:
    """Counts every refusal by reason and logs the first of each reason per ``every_s`` plus one summary."""

    def __init__(
        self, metrics: AggregatorMetrics, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.metrics = metrics
        self.every_s = every_s
        self.clock = clock
        self._window_end = -math.inf
        self._logged: set[str] = set()  # reasons whose first refusal of this window was logged
        self._suppressed: dict[str, int] = {}  # reason → refusals of this window not logged

    def refused(self, reason: str, event: str, *, level: Level = "warning", **fields: Any) -> bool:
        """Count one refusal; log it (``event`` with ``fields``) when it is the first of its reason in this
        window. True when it was logged."""
        self.metrics.rejected(reason)
        now = self.clock()
        if now >= self._window_end:
            self._summarize()
            self._window_end = now + self.every_s
        if reason in self._logged:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return False
        self._logged.add(reason)
        getattr(log(), level)(event, reason=reason, **fields)
        return True

    def flush(self) -> None:
        """Write the summary of a window that is over (the tick loop calls this)."""
        now = self.clock()
        if now >= self._window_end and (self._suppressed or self._logged):
            self._summarize()
            self._window_end = -math.inf

    def _summarize(self) -> None:
        if self._suppressed:
            counts = dict(sorted(self._suppressed.items()))
            log().warning(
                "connections_refused",
                not_logged=counts,
                total=sum(counts.values()),
                interval_s=self.every_s,
                detail="the first refusal of each reason was logged; all are in sentinel_ingest_rejected_total",
            )
        self._suppressed = {}
        self._logged = set()
