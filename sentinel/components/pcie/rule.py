"""PCIe rules: replays climbing faster than a threshold (a marginal link retransmitting)."""

from __future__ import annotations

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
