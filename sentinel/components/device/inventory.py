"""Inventory rules: a host that cannot use its GPUs, a host with fewer GPUs than expected, one GPU whose
driver or VBIOS differs from its identical peers across the fleet (a mismatched VBIOS is a classic cause of
one odd GPU), and a host whose inventory is not what is expected of it: GPU count, GPU model, and each GPU's
PCIe link capability (maximum width and generation).

Expected values come from the configuration (``[[detect.inventory.expected]]``, per host glob) or, where it
says nothing, are learned from the fleet: the strict majority of identical hosts (same matched profile, same
GPU model), once there are ``min_hosts`` of them. Every fleet-learned value (the firmware majority too) is
voted by hosts, one vote each, split evenly over the host's GPUs — a host claiming 64 GPUs weighs what a host
with 8 does — and each learned value names the hosts that hold it, so a verdict says how many hosts other
than its subject back it (remediation acts on a learned verdict only with a quorum of them). The PCIe *maximum* is compared, never the current
generation: GPUs lower their link generation at idle to save power (normal); the maximum is what the GPU and
its slot can train at, so an x8 riser or a Gen4 slot in a Gen5 fleet shows there whether the GPU is busy or
not. (A current width below the maximum is the PCIe component's own rule.)

Pure: host facts in, findings out. The aggregator's inventory detector gathers the facts from the fleet.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Generic, TypeVar

import msgspec

from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.vocab import Finding


def evaluate_source(health: GpuSourceHealth) -> Finding | None:
    if not health.ok:
        return Finding(
            state="faulty",
            severity="critical",
            action="reboot",
            reason="nvml_unusable",
            evidence=(f"NVML cannot be used on this host: {health.error or 'unknown error'}",),
        )
    if health.expected and health.found < health.expected:
        return Finding(
            state="faulty",
            severity="critical",
            action="reboot",
            reason="gpus_missing",
            evidence=(
                f"NVML sees {health.found} of the {health.expected} GPUs this host is expected to have",
            ),
        )
    return None


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    host: str
    gpu: int
    model: str
    driver: str
    vbios: str


V = TypeVar("V", bound=Hashable)


@dataclass(frozen=True, slots=True)
class HostMajority(Generic[V]):
    """A value a strict majority of hosts hold, and the hosts that hold it (most of their GPUs do)."""

    value: V
    holders: frozenset[str]
    hosts: int  # hosts that voted

    def backing(self, subject: str) -> int:
        """Hosts other than ``subject`` that hold the value: what a verdict against ``subject`` rests on."""
        return len(self.holders) - (subject in self.holders)


def host_majority(votes: Mapping[str, Sequence[V]], min_hosts: int) -> HostMajority[V] | None:
    """The value held by a strict majority of hosts, each host one vote split evenly over its values (one per
    GPU), once at least ``min_hosts`` distinct hosts vote. However many GPUs a host claims, it moves the
    majority by one host at most."""
    weights: dict[V, float] = {}
    hosts = 0
    for values in votes.values():
        if not values:
            continue
        hosts += 1
        share = 1.0 / len(values)
        for value in values:
            weights[value] = weights.get(value, 0.0) + share
    if hosts < min_hosts or not weights:
        return None
    value, weight = max(weights.items(), key=lambda item: item[1])
    if weight * 2 <= hosts + 1e-9:
        return None
    holders = frozenset(
        host for host, values in votes.items() if values and sum(v == value for v in values) * 2 > len(values)
    )
    return HostMajority(value, holders, hosts)


@dataclass(frozen=True, slots=True)
class FirmwareOutlier:
    """What differs on one GPU, and how many hosts other than its own hold the version it differs from."""

    evidence: list[str]
    backing: int


def firmware_outliers(
    gpus: Iterable[GpuIdentity], min_hosts: int = 3
) -> dict[tuple[str, int], FirmwareOutlier]:
    """GPUs whose driver or VBIOS differs from the version most hosts with that model run: what differs, each.

    Only models on at least ``min_hosts`` distinct hosts are judged, each host one vote (see
    :func:`host_majority`), and only a strict majority of hosts counts as the fleet's version.
    """
    by_model: dict[str, dict[str, list[GpuIdentity]]] = {}
    for g in gpus:
        if g.model:
            by_model.setdefault(g.model, {}).setdefault(g.host, []).append(g)
    out: dict[tuple[str, int], FirmwareOutlier] = {}
    for model, hosts in by_model.items():
        if len(hosts) < min_hosts:
            continue
        for attr in ("vbios", "driver"):
            votes = {
                host: [getattr(g, attr) for g in peers if getattr(g, attr)] for host, peers in hosts.items()
            }
            if len({v for values in votes.values() for v in values}) < 2:
                continue
            common = host_majority(votes, min_hosts)
            if common is None:
                continue
            for host, peers in hosts.items():
                backing = common.backing(host)
                for g in peers:
                    value = getattr(g, attr)
                    if value and value != common.value:
                        known = out.get((host, g.gpu))
                        text = (
                            f"{attr} {value} differs from {common.value}, the version of {len(common.holders)} "
                            f"of {common.hosts} {model} hosts (one vote per host)"
                        )
                        out[(host, g.gpu)] = FirmwareOutlier(
                            [*known.evidence, text] if known else [text],
                            max(backing, known.backing) if known else backing,
                        )
    return out


# -- inventory vs expected -------------------------------------------------------------------------------


class ExpectedInventory(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What every host matching ``hosts`` must have; a key left at 0 / empty is learned from the fleet."""

    hosts: Annotated[
        str, msgspec.Meta(min_length=1, max_length=256, description="host name glob, e.g. gpu-h100-*")
    ]
    gpus: Annotated[int, msgspec.Meta(ge=0, le=1024, description="GPU count (0: learn it)")] = 0
    model: Annotated[
        str,
        msgspec.Meta(
            max_length=256,
            description="GPU model as NVML names it, e.g. NVIDIA H100 80GB HBM3 (empty: the host's majority)",
        ),
    ] = ""
    pcie_width: Annotated[
        int,
        msgspec.Meta(ge=0, le=32, description="PCIe lanes each GPU's link must be capable of (0: learn it)"),
    ] = 0
    pcie_gen: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=16,
            description="PCIe generation each GPU's link must be capable of: its maximum, never the current "
            "one, which GPUs lower at idle (0: learn it)",
        ),
    ] = 0


class InventoryConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A host's inventory against what is expected of it (a mismatch: a degraded verdict naming what differs)."""

    expected: Annotated[
        list[ExpectedInventory],
        msgspec.Meta(max_length=256, description="per host glob, the first that matches a host applies"),
    ] = []
    learn: Annotated[
        bool,
        msgspec.Meta(
            description="learn what the configuration leaves out from the majority of identical hosts, each "
            "host one vote however many GPUs it claims"
        ),
    ] = True
    min_hosts: Annotated[
        int,
        msgspec.Meta(
            ge=2,
            le=100000,
            description="the quorum: distinct identical hosts needed before their majority (GPU count, PCIe "
            "link capability, a GPU model's driver and VBIOS) is learned",
        ),
    ] = 3


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """One GPU as its inventory and latest slow sample describe it (None: not reported)."""

    index: int
    model: str
    pcie_width_max: int | None
    pcie_gen_max: int | None


@dataclass(frozen=True, slots=True)
class HostFacts:
    host: str
    gpus: tuple[GpuFacts, ...]

    @property
    def model(self) -> str:
        """The host's GPU model: what most of its GPUs are (the odd one out is a mismatch)."""
        models = Counter(g.model for g in self.gpus if g.model)
        return models.most_common(1)[0][0] if models else ""


@dataclass(frozen=True, slots=True)
class Expectation:
    """One expected value and where it came from (for the evidence): configured (``holders`` None) or
    learned from the fleet, then held by ``holders``."""

    value: int | str
    source: str
    holders: frozenset[str] | None = None

    def backing(self, subject: str) -> int | None:
        """None when configured; else the hosts other than ``subject`` that hold the value."""
        if self.holders is None:
            return None
        return len(self.holders) - (subject in self.holders)


@dataclass(frozen=True, slots=True)
class Expected:
    gpus: Expectation | None = None
    model: Expectation | None = None
    pcie_width: Expectation | None = None
    pcie_gen: Expectation | None = None


def profile_of(host: str, profiles: list[ExpectedInventory]) -> int | None:
    """Index of the first profile whose glob matches the host."""
    for i, profile in enumerate(profiles):
        if fnmatch.fnmatchcase(host, profile.hosts):
            return i
    return None


def _learned(majority: HostMajority[int] | None, source: str) -> Expectation | None:
    if majority is None:
        return None
    return Expectation(
        majority.value,
        f"{source}: {len(majority.holders)} of {majority.hosts} hosts, one vote per host",
        majority.holders,
    )


def expectations(hosts: list[HostFacts], config: InventoryConfig) -> dict[str, Expected]:
    """Host → what is expected of it: configured values first, learned ones for the rest.

    Identical hosts are those matching the same profile (or none) whose GPUs are mostly the same model; a
    value is learned when a strict majority of at least ``min_hosts`` such hosts agree on it, each host one
    vote (for the PCIe link, split evenly over its GPUs: :func:`host_majority`).
    """
    groups: dict[tuple[int | None, str], list[HostFacts]] = {}
    profile_index: dict[str, int | None] = {}
    for facts in hosts:
        index = profile_of(facts.host, config.expected)
        profile_index[facts.host] = index
        groups.setdefault((index, facts.model), []).append(facts)
    learned: dict[tuple[int | None, str], Expected] = {}
    if config.learn:
        for key, members in groups.items():
            if len(members) < config.min_hosts:
                continue
            model = key[1] or "unknown-model"
            source = f"the majority of {len(members)} identical {model} hosts"
            quorum = config.min_hosts
            count = host_majority({m.host: [len(m.gpus)] for m in members}, quorum)
            width = host_majority(
                {m.host: [g.pcie_width_max for g in m.gpus if g.pcie_width_max] for m in members}, quorum
            )
            gen = host_majority(
                {m.host: [g.pcie_gen_max for g in m.gpus if g.pcie_gen_max] for m in members}, quorum
            )
            learned[key] = Expected(
                gpus=_learned(count, source),
                pcie_width=_learned(width, source),
                pcie_gen=_learned(gen, source),
            )
    out: dict[str, Expected] = {}
    for facts in hosts:
        index = profile_index[facts.host]
        base = learned.get((index, facts.model), Expected())
        if index is None:
            out[facts.host] = base
            continue
        profile = config.expected[index]
        source = f"configured for {profile.hosts}"

        def pick(value: int | str, fallback: Expectation | None, src: str = source) -> Expectation | None:
            return Expectation(value, src) if value else fallback  # 0 / "": not configured

        out[facts.host] = Expected(
            gpus=pick(profile.gpus, base.gpus),
            model=pick(profile.model, None),
            pcie_width=pick(profile.pcie_width, base.pcie_width),
            pcie_gen=pick(profile.pcie_gen, base.pcie_gen),
        )
    return out


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One difference: the GPU (None: the host), the evidence, and the expectation's backing (None:
    configured or the host's own GPUs; else the hosts other than this one that hold the learned value)."""

    gpu: int | None
    text: str
    backing: int | None


def inventory_mismatches(facts: HostFacts, expected: Expected) -> list[Mismatch]:
    """What differs from what is expected, each with the GPU it concerns and the expectation's backing."""
    out: list[Mismatch] = []
    host = facts.host
    if expected.gpus is not None and len(facts.gpus) != expected.gpus.value:
        out.append(
            Mismatch(
                None,
                f"{len(facts.gpus)} GPUs, expected {expected.gpus.value} ({expected.gpus.source})",
                expected.gpus.backing(host),
            )
        )
    model = expected.model.value if expected.model is not None else facts.model
    model_source = (
        expected.model.source if expected.model is not None else "the model of the host's other GPUs"
    )
    for g in facts.gpus:
        if model and g.model and g.model != model:
            out.append(
                Mismatch(g.index, f"GPU {g.index} is {g.model}, expected {model} ({model_source})", None)
            )
        width, gen = expected.pcie_width, expected.pcie_gen
        if width is not None and g.pcie_width_max is not None and g.pcie_width_max != width.value:
            out.append(
                Mismatch(
                    g.index,
                    f"GPU {g.index} PCIe link capable of x{g.pcie_width_max}, expected x{width.value} "
                    f"({width.source})",
                    width.backing(host),
                )
            )
        if gen is not None and g.pcie_gen_max is not None and g.pcie_gen_max != gen.value:
            out.append(
                Mismatch(
                    g.index,
                    f"GPU {g.index} PCIe link capable of gen {g.pcie_gen_max}, expected gen {gen.value} "
                    f"({gen.source})",
                    gen.backing(host),
                )
            )
    return out


def learned_backing(mismatches: Iterable[Mismatch]) -> int | None:
    """A verdict over ``mismatches`` rests on the strongest of them: None when one of them is configured or
    the host's own evidence, else the largest number of other hosts behind a learned one."""
    backings = [m.backing for m in mismatches]
    if not backings or any(b is None for b in backings):
        return None
    return max(b for b in backings if b is not None)
