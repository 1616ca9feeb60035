"""Inventory rules: a host that cannot use its GPUs, a host with fewer GPUs than expected, and one GPU whose
driver or VBIOS differs from its identical peers across the fleet (a mismatched VBIOS is a classic cause of
one odd GPU).

Pure: host facts in, findings out. The aggregator's inventory detector gathers the facts from the fleet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

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
