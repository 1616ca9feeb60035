"""The NVLink domain as a failure unit (GB200 NVL72 and later): GPUs grouped by the fabric's cluster UUID and
clique id (``nvmlDeviceGetGpuFabricInfo``), and the rule that turns GPUs of several hosts losing their fabric
together into one domain finding naming its hosts, and a domain with fewer GPUs or hosts than expected into an
inventory finding.

Pure: the members' losses (host, GPU, when the loss began) and the settings in, a decision out. A domain
verdict needs losses reported by ``min_hosts`` distinct hosts within ``window_s`` of each other, so nothing one
host says can name (and drain) the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec

from sentinel.components.fabric.health import CONDITIONS as HEALTH_CONDITIONS
from sentinel.components.fabric.record import FabricInfo
from sentinel.components.fabric.rule import NOT_REGISTERED
from sentinel.components.vocab import Finding

#: (cluster UUID, clique id): one NVLink domain
DomainKey = tuple[str, int]
#: the per-GPU fabric reasons that are the domain's when it loses its fabric as a whole: registration not
#: completed or failed, and every health-mask condition that asks for an action (a route unhealthy, the
#: bandwidth degraded; a recovery in progress asks for none)
DOMAIN_REASONS: Final = frozenset(
    {NOT_REGISTERED, *(reason for _, reason, _, _, action, _ in HEALTH_CONDITIONS if action != "none")}
)
#: a domain that lost its fabric: one failure unit, drained whole (per ``remediation.drain_domains``)
DOMAIN_DOWN: Final = Finding(state="faulty", severity="critical", action="drain", reason="fabric_domain_down")
#: a domain with fewer GPUs or hosts reporting than expected: jobs sized for it cannot run, nothing to act on
DOMAIN_INCOMPLETE: Final = Finding(
    state="suspect", severity="warning", action="none", reason="fabric_domain_incomplete"
)
#: hosts named in a domain finding's evidence line (every one is in ``hosts``)
EVIDENCE_HOSTS = 24
#: an all-zero cluster UUID: the GPU belongs to no fabric cluster (nothing to group by)
NO_CLUSTER: Final = "00000000-0000-0000-0000-000000000000"


class FabricDomainConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The NVLink domain (GPUs sharing a fabric cluster UUID and clique id) judged as one failure unit."""

    window_s: Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=3600,
            description="GPUs whose fabric loss (registration not completed or failed, route unhealthy, "
            "degraded bandwidth) began within this many seconds of each other lost it together",
        ),
    ] = 120.0
    min_hosts: Annotated[
        int,
        msgspec.Meta(
            ge=2,
            le=4096,
            description="distinct hosts of one domain that must report such a loss within window_s for one "
            "domain verdict (fabric_domain_down) instead of one verdict per GPU; at least 2, so nothing one "
            "host says names, or drains, another",
        ),
    ] = 3
    expected_gpus: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=65536,
            description="GPUs a domain should have (72 for GB200 NVL72; 0: no expectation); the inventory "
            "detector reports a domain with fewer GPUs reporting (fabric_domain_incomplete)",
        ),
    ] = 0
    expected_hosts: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=4096,
            description="hosts a domain should have (18 for GB200 NVL72; 0: no expectation), reported as "
            "expected_gpus is",
        ),
    ] = 0


def domain_of(info: FabricInfo | None) -> DomainKey | None:
    """The domain a GPU's fabric reading places it in; None without a fabric cluster."""
    if (
        info is None
        or info.state == "not_supported"
        or not info.cluster_uuid
        or info.cluster_uuid == NO_CLUSTER
    ):
        return None
    return info.cluster_uuid, info.clique_id


def domain_name(key: DomainKey) -> str:
    return f"cluster {key[0]} clique {key[1]}"


@dataclass(frozen=True, slots=True)
class Loss:
    """One GPU of a domain that lost its fabric, and the agent time its loss was first reported."""

    host: str
    gpu: int
    t: float
    reason: str


@dataclass(frozen=True, slots=True)
class DomainDown:
    """A domain whose GPUs lost their fabric together: the losses that show it, and every host of it."""

    key: DomainKey
    losses: tuple[Loss, ...]
    hosts: tuple[str, ...]
    began: float

    def evidence(self) -> tuple[str, ...]:
        reporting = sorted({loss.host for loss in self.losses})
        reasons = sorted({loss.reason for loss in self.losses})
        named = ", ".join(self.hosts[:EVIDENCE_HOSTS]) + (
            f" and {len(self.hosts) - EVIDENCE_HOSTS} more" if len(self.hosts) > EVIDENCE_HOSTS else ""
        )
        return (
            f"NVLink domain {domain_name(self.key)}: {len(self.losses)} GPUs on {len(reporting)} hosts lost "
            f"their fabric together ({', '.join(reasons)})",
            f"the domain's hosts: {named}",
        )


def domain_down(
    key: DomainKey, losses: Iterable[Loss], hosts: Iterable[str], cfg: FabricDomainConfig
) -> DomainDown | None:
    """The domain is down when some ``window_s`` span holds losses of ``cfg.min_hosts`` distinct hosts; the
    finding carries the losses of the earliest such span and after it (the outage as it grew) and every
    host of the domain (``hosts``: its members, the reporting ones included)."""
    ordered = sorted(losses, key=lambda loss: loss.t)
    start = 0
    per_host: dict[str, int] = {}
    for loss in ordered:
        per_host[loss.host] = per_host.get(loss.host, 0) + 1
        while loss.t - ordered[start].t > cfg.window_s:
            gone = ordered[start].host
            per_host[gone] -= 1
            if per_host[gone] == 0:
                del per_host[gone]
            start += 1
        if len(per_host) >= cfg.min_hosts:
            together = tuple(ordered[start:])
            members = sorted(set(hosts) | {x.host for x in together})
            return DomainDown(key=key, losses=together, hosts=tuple(members), began=together[0].t)
    return None


@dataclass(frozen=True, slots=True)
class DomainSize:
    """A domain with fewer GPUs or hosts reporting than expected."""

    key: DomainKey
    gpus: int
    hosts: tuple[str, ...]

    def shortfall(self, cfg: FabricDomainConfig) -> tuple[str, ...]:
        """What the domain lacks against ``cfg`` (empty: nothing)."""
        out: list[str] = []
        if cfg.expected_gpus and self.gpus < cfg.expected_gpus:
            out.append(f"{self.gpus} of the {cfg.expected_gpus} GPUs expected report in this domain")
        if cfg.expected_hosts and len(self.hosts) < cfg.expected_hosts:
            out.append(f"{len(self.hosts)} of the {cfg.expected_hosts} hosts expected report in this domain")
        return tuple(out)


def domain_sizes(members: Iterable[tuple[str, int, Any]]) -> list[DomainSize]:
    """(host, GPU index, FabricInfo) of every GPU → each domain's size, in domain order."""
    gpus: dict[DomainKey, int] = {}
    hosts: dict[DomainKey, set[str]] = {}
    for host, _index, info in members:
        key = domain_of(info)
        if key is None:
            continue
        gpus[key] = gpus.get(key, 0) + 1
        hosts.setdefault(key, set()).add(host)
    return [DomainSize(key=key, gpus=gpus[key], hosts=tuple(sorted(hosts[key]))) for key in sorted(gpus)]
