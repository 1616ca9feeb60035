"""Inventory rules: a host that cannot use its GPUs, a host with fewer GPUs than expected, one GPU whose
driver or VBIOS differs from its identical peers across the fleet (a mismatched VBIOS is a classic cause of
one odd GPU), and a host whose inventory is not what is expected of it: GPU count, GPU model, and each GPU's
PCIe link capability (maximum width and generation).

Expected values come from the configuration (``[[detect.inventory.expected]]``, per host glob) or, where it
says nothing, are learned from the fleet: the strict majority of identical hosts (same matched profile, same
GPU model), once there are ``min_hosts`` of them. The PCIe *maximum* is compared, never the current
generation: GPUs lower their link generation at idle to save power (normal); the maximum is what the GPU and
its slot can train at, so an x8 riser or a Gen4 slot in a Gen5 fleet shows there whether the GPU is busy or
not. (A current width below the maximum is the PCIe component's own rule.)

Pure: host facts in, findings out. The aggregator's inventory detector gathers the facts from the fleet.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

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


def firmware_outliers(gpus: Iterable[GpuIdentity], min_peers: int = 3) -> dict[tuple[str, int], list[str]]:
    """GPUs whose driver or VBIOS differs from the version most of the same model run: what differs, each.

    Only models with at least ``min_peers`` GPUs are judged (with two there is no majority to differ from),
    and only a strict majority counts as the fleet's version.
    """
    by_model: dict[str, list[GpuIdentity]] = {}
    for g in gpus:
        if g.model:
            by_model.setdefault(g.model, []).append(g)
    out: dict[tuple[str, int], list[str]] = {}
    for model, peers in by_model.items():
        if len(peers) < min_peers:
            continue
        for attr in ("vbios", "driver"):
            values = Counter(getattr(g, attr) for g in peers if getattr(g, attr))
            if len(values) < 2:
                continue
            common, count = values.most_common(1)[0]
            if count * 2 <= sum(values.values()):
                continue
            for g in peers:
                value = getattr(g, attr)
                if value and value != common:
                    out.setdefault((g.host, g.gpu), []).append(
                        f"{attr} {value} differs from {common} on {count} of {len(peers)} {model} GPUs"
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
            description="learn what the configuration leaves out from the majority of identical hosts"
        ),
    ] = True
    min_hosts: Annotated[
        int,
        msgspec.Meta(ge=2, le=100000, description="identical hosts needed before their majority is learned"),
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
    """One expected value and where it came from (for the evidence)."""

    value: int | str
    source: str


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


def _majority(values: list[int], min_count: int) -> tuple[int, int] | None:
    """(value, count) held by a strict majority of ``values``, if there are at least ``min_count``."""
    if len(values) < min_count:
        return None
    value, count = Counter(values).most_common(1)[0]
    return (value, count) if count * 2 > len(values) else None


def expectations(hosts: list[HostFacts], config: InventoryConfig) -> dict[str, Expected]:
    """Host → what is expected of it: configured values first, learned ones for the rest.

    Identical hosts are those matching the same profile (or none) whose GPUs are mostly the same model; a
    value is learned when a strict majority of at least ``min_hosts`` such hosts (for the PCIe link: of
    their GPUs) agree on it.
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
            model = key[1] or "unknown-model"
            n = len(members)
            source = f"the majority of {n} identical {model} hosts"
            count = _majority([len(m.gpus) for m in members], config.min_hosts)
            gpus = [g for m in members for g in m.gpus]
            width = _majority([g.pcie_width_max for g in gpus if g.pcie_width_max], config.min_hosts)
            gen = _majority([g.pcie_gen_max for g in gpus if g.pcie_gen_max], config.min_hosts)
            if n < config.min_hosts:
                count = width = gen = None
            learned[key] = Expected(
                gpus=Expectation(count[0], f"{source} ({count[1]} have it)") if count else None,
                pcie_width=Expectation(width[0], f"{source} ({width[1]} of {len(gpus)} GPUs)")
                if width
                else None,
                pcie_gen=Expectation(gen[0], f"{source} ({gen[1]} of {len(gpus)} GPUs)") if gen else None,
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


def inventory_mismatches(facts: HostFacts, expected: Expected) -> list[tuple[int | None, str]]:
    """What differs from what is expected, each as (GPU index or None for the host, evidence)."""
    out: list[tuple[int | None, str]] = []
    if expected.gpus is not None and len(facts.gpus) != expected.gpus.value:
        out.append((None, f"{len(facts.gpus)} GPUs, expected {expected.gpus.value} ({expected.gpus.source})"))
    model = expected.model.value if expected.model is not None else facts.model
    model_source = (
        expected.model.source if expected.model is not None else "the model of the host's other GPUs"
    )
    for g in facts.gpus:
        if model and g.model and g.model != model:
            out.append((g.index, f"GPU {g.index} is {g.model}, expected {model} ({model_source})"))
        width, gen = expected.pcie_width, expected.pcie_gen
        if width is not None and g.pcie_width_max is not None and g.pcie_width_max != width.value:
            out.append(
                (
                    g.index,
                    f"GPU {g.index} PCIe link capable of x{g.pcie_width_max}, expected x{width.value} "
                    f"({width.source})",
                )
            )
        if gen is not None and g.pcie_gen_max is not None and g.pcie_gen_max != gen.value:
            out.append(
                (
                    g.index,
                    f"GPU {g.index} PCIe link capable of gen {g.pcie_gen_max}, expected gen {gen.value} "
                    f"({gen.source})",
                )
            )
    return out
