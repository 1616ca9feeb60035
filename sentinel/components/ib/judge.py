"""The ib signal's judgement of one host: its unhealthy ports joined to what they serve
(:mod:`.causes`), as the network detector's host findings — one per port, keyed by device and port."""

from __future__ import annotations

from typing import Protocol

from sentinel.components.ib.causes import PortHost, host_causes
from sentinel.components.ib.rule import PortRuleConfig
from sentinel.components.signal import HostJudged


class PortSettings(Protocol):
    """The ``[detect]`` section the port rule reads."""

    @property
    def network(self) -> PortRuleConfig: ...


def judge_host(host: PortHost, detect: PortSettings, now: float) -> list[HostJudged]:
    """One finding per unhealthy port of ``host`` (``now``: the aggregator clock)."""
    out: list[HostJudged] = []
    for cause in host_causes(host, detect.network, now):
        f = cause.finding
        jobs = sorted({job for job, _ in cause.ranks})
        out.append(
            HostJudged(
                subject=(f.device, str(f.port)),
                kind=f.kind,
                reason=f.reason,
                action=f.action,
                evidence=cause.evidence,
                evidence_t=cause.evidence_t,
                gpu=cause.gpus[0] if len(cause.gpus) == 1 else None,
                job=jobs[0] if len(jobs) == 1 else None,
                rank=cause.ranks[0][1] if len(cause.ranks) == 1 else None,
            )
        )
    return out


def reading_t(host: PortHost) -> float:
    """Agent time of the host's latest port reading."""
    return host.ports_t
