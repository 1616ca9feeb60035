"""PCIe rules: replays climbing faster than a threshold (a marginal link retransmitting)."""

from __future__ import annotations

from sentinel.components.pcie.record import PcieLink
from sentinel.components.vocab import Finding


def evaluate_replay_rate(rate_per_s: float, threshold_per_s: float) -> Finding | None:
    if threshold_per_s <= 0 or rate_per_s < threshold_per_s:
        return None
    return Finding(
        state="suspect",
        severity="warning",
        action="drain",
        reason="pcie_replays",
        evidence=(f"PCIe replays at {rate_per_s:.1f}/s (threshold {threshold_per_s:g}/s)",),
    )


def evaluate_link(link: PcieLink) -> Finding | None:
    """Width below the maximum is a mistrained link (reseat / replace the riser); generation is only
    evidence, since GPUs lower it at idle."""
    if link.width is None or link.width_max is None or link.width >= link.width_max or link.width <= 0:
        return None
    gen = f", gen {link.gen} of {link.gen_max}" if link.gen is not None and link.gen_max is not None else ""
    return Finding(
        state="suspect",
        severity="warning",
        action="drain",
        reason="pcie_link_degraded",
        evidence=(f"PCIe link trained at x{link.width} of x{link.width_max}{gen}",),
    )
