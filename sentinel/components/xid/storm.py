"""Xid storms: a burst of application or sympathetic Xids across the GPUs of one job is one event.

A job's teardown raises Xid 45 (preemptive cleanup) on every GPU it ran on; one GPU's uncontained memory
error (Xid 95) is reported again by the GPUs that shared the work, which NVIDIA's catalog marks "IGNORE
(sympathetic)". Judged GPU by GPU, each report would be a verdict and a drain. :class:`XidStorms` groups the
reports of one scope (the job, else the host) that follow each other within ``storm_window_s``: the burst's
*origin* is the first report of its strongest kind (a non-sympathetic error over a sympathetic hardware
report over an application error), judged as usual. An application report on any other GPU of the scope is
the origin's echo and is not judged on its own. A sympathetic report is an echo only of its own host's
first hardware report (the GPUs that shared its memory): nothing one host reports can keep another host's
GPU from being judged. A burst that reached ``storm_min_gpus`` GPUs is a storm.

Pure (times passed in) and bounded: at most ``max_storms`` bursts, each counting at most ``MAX_MEMBERS``
GPUs by name (the rest only in its counts).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final, Literal

import msgspec

from sentinel.components.vocab import Finding
from sentinel.components.xid.buckets import nvidia_buckets
from sentinel.components.xid.catalog import APPLICATION_CODES
from sentinel.components.xid.nvidia import NVIDIA_XIDS

#: codes NVIDIA's catalog marks as sympathetic reports of another GPU's error (investigatory bucket)
SYMPATHETIC_CODES: Final = frozenset(row[0] for row in NVIDIA_XIDS if "SYMPATHETIC" in row[4].upper())
#: GPUs a burst names one by one; beyond, they are counted only
MAX_MEMBERS: Final = 16384
#: a storm's verdict: informational, on its origin GPU; never a drain
STORM: Final = Finding(state="suspect", severity="warning", action="none", reason="xid_storm")

Role = Literal["origin", "sympathetic", "own"]


def strength(code: int) -> int:
    """How strongly a report speaks for its own GPU: 0 an application error (13, 31, 43, 45), 1 a report
    NVIDIA calls sympathetic (94, 95, ...), 2 any other Xid (the GPU's own error)."""
    if code in APPLICATION_CODES:
        return 0
    if code in SYMPATHETIC_CODES:
        return 1
    return 2


class StormOrigin(msgspec.Struct, frozen=True, kw_only=True):
    host: str
    gpu: int
    code: int
    t: float


def _stronger(a: StormOrigin, b: StormOrigin) -> bool:
    """``a`` outranks ``b``: a stronger kind, or of the same kind, earlier."""
    mine, theirs = strength(a.code), strength(b.code)
    return mine > theirs or (mine == theirs and a.t < b.t)


def _leads(ahead: StormOrigin | None, here: StormOrigin) -> bool:
    """``ahead`` (a host's first hardware report) is another GPU's and ``here`` cannot outrank it."""
    return ahead is not None and ahead.gpu != here.gpu and not _stronger(here, ahead)


class Burst(msgspec.Struct, kw_only=True):
    """The Xid reports of one scope within the window of each other."""

    scope: str
    job: str | None
    first_t: float
    last_t: float
    #: the aggregator's time of the latest report (a burst is over ``window`` after it)
    seen_at: float
    origin: StormOrigin
    #: per host, its first report of the strongest hardware kind (what its sympathetic reports echo)
    host_origins: dict[str, StormOrigin] = {}
    #: "host/gpu" → reports
    gpus: dict[str, int] = {}
    hosts: dict[str, int] = {}
    codes: dict[int, int] = {}
    reports: int = 0
    #: reports not judged on their own GPU (the origin's echoes)
    sympathetic: int = 0

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def echoed(self, host: str, code: int) -> StormOrigin:
        """The report that an echo with ``code`` on ``host`` repeats."""
        if strength(code) == 1:
            return self.host_origins.get(host, self.origin)
        return self.origin

    def evidence(self, window_s: float) -> list[str]:
        """What a storm's verdict says: the origin, the spread, the codes."""
        codes = ", ".join(f"Xid {code} x{n}" for code, n in sorted(self.codes.items()))
        where = f"job {self.job}" if self.job else self.scope
        origin = self.origin
        bucket, investigatory = nvidia_buckets(origin.code)
        kind = ("an application error", "a sympathetic report", "its own error")[strength(origin.code)]
        return [
            f"Xid storm in {where}: {self.reports} reports from {self.gpu_count} GPUs on {len(self.hosts)} "
            f"hosts within {self.last_t - self.first_t:.1f}s ({codes})",
            f"origin: {origin.host} GPU {origin.gpu}, Xid {origin.code} ({kind}; NVIDIA: "
            f"{bucket.value or 'no bucket'}{f', investigate: {investigatory}' if investigatory else ''})",
            f"{self.sympathetic} reports on other GPUs are the origin's echoes (application or sympathetic "
            f"Xids within {window_s:g}s of each other): no GPU is judged or drained for them",
        ]


class XidStorms:
    """The bursts in progress, by scope (the job, else ``host:<name>``)."""

    def __init__(self, *, window_s: float, min_gpus: int, max_storms: int = 1024) -> None:
        self.window_s = window_s
        self.min_gpus = min_gpus
        self.max_storms = max_storms
        self.bursts: OrderedDict[str, Burst] = OrderedDict()

    def observe(
        self, scope: str, job: str | None, *, host: str, gpu: int, code: int, t: float, now: float
    ) -> tuple[Role, Burst]:
        """One Xid report: ``origin`` (judged: it is, or is now, the burst's origin), ``sympathetic`` (an
        echo on another GPU: not judged on its own; :meth:`Burst.echoed` says of what) or ``own`` (judged:
        the GPU's own error, or the first hardware report of its host)."""
        burst = self.bursts.get(scope)
        if burst is not None and not (burst.first_t - self.window_s <= t <= burst.last_t + self.window_s):
            del self.bursts[scope]
            burst = None
        here = StormOrigin(host=host, gpu=gpu, code=code, t=t)
        if burst is None:
            burst = Burst(scope=scope, job=job, first_t=t, last_t=t, seen_at=now, origin=here)
            self.bursts[scope] = burst
            while len(self.bursts) > self.max_storms:
                self.bursts.popitem(last=False)
            role: Role = "origin"
        else:
            self.bursts.move_to_end(scope)
            origin = burst.origin
            mine, theirs = strength(code), strength(origin.code)
            if (origin.host, origin.gpu) == (host, gpu):
                role = "origin"
                if mine > theirs or (mine == theirs and t < origin.t):
                    burst.origin = here
            elif mine > theirs or (mine == theirs and mine < 2 and t < origin.t):
                burst.origin, role = here, "origin"  # a stronger (or, of the same kind, earlier) report
            elif mine == 0 or (mine == 1 and _leads(burst.host_origins.get(host), here)):
                role = "sympathetic"
                burst.sympathetic += 1
            else:
                role = "own"
            burst.first_t, burst.last_t = min(burst.first_t, t), max(burst.last_t, t)
            burst.seen_at = max(burst.seen_at, now)
        if strength(code) >= 1 and (host in burst.host_origins or len(burst.host_origins) < MAX_MEMBERS):
            ahead = burst.host_origins.get(host)
            if ahead is None or _stronger(here, ahead):
                burst.host_origins[host] = here
        name = f"{host}/{gpu}"
        if name in burst.gpus or len(burst.gpus) < MAX_MEMBERS:
            burst.gpus[name] = burst.gpus.get(name, 0) + 1
        if host in burst.hosts or len(burst.hosts) < MAX_MEMBERS:
            burst.hosts[host] = burst.hosts.get(host, 0) + 1
        if code in burst.codes or len(burst.codes) < 64:
            burst.codes[code] = burst.codes.get(code, 0) + 1
        burst.reports += 1
        return role, burst

    def storms(self, now: float) -> list[Burst]:
        """The bursts in progress that reached ``min_gpus`` GPUs; bursts over are forgotten."""
        for scope in [s for s, b in self.bursts.items() if now - b.seen_at > self.window_s]:
            del self.bursts[scope]
        return [b for b in self.bursts.values() if b.gpu_count >= self.min_gpus]

    def forget_host(self, host: str) -> None:
        for scope in [s for s in self.bursts if s == f"host:{host}"]:
            del self.bursts[scope]
