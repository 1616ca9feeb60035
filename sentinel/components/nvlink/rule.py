"""NVLink rules: a link that went down, and error counters climbing faster than a threshold.

Pure: the link records (and the error rate the aggregator measured from their history) in, findings out.
A link that was up and is now down halves (or worse) the GPU's NVLink bandwidth and usually hangs the
job's NVLink collectives; error rates that climb mean a marginal link (replays cost bandwidth) before it
fails.
"""

from __future__ import annotations

from sentinel.components.nvlink.record import NvLink
from sentinel.components.vocab import Finding


def error_total(links: list[NvLink]) -> int:
    """CRC + replay + recovery errors over every link (the counter whose rate the aggregator tracks)."""
    return sum(link.crc_errors + link.replay_errors + link.recovery_errors for link in links)


def evaluate_links(links: list[NvLink], expected: int | None = None) -> Finding | None:
    """Links down: the GPU had (per its inventory) ``expected`` links, or some report inactive."""
    down = sorted(link.link for link in links if not link.active)
    missing = (expected - len(links)) if expected is not None and expected > len(links) else 0
    if not down and not missing:
        return None
    evidence = []
    if down:
        evidence.append(
            f"NVLink link(s) {', '.join(map(str, down))} down ({len(links) - len(down)}/{len(links)} up)"
        )
    if missing:
        evidence.append(f"{missing} of {expected} NVLink links no longer reported")
    return Finding(
        state="suspect",
        severity="critical",
        action="reset_gpu",
        reason="nvlink_down",
        evidence=tuple(evidence),
    )


def evaluate_error_rate(rate_per_s: float, threshold_per_s: float) -> Finding | None:
    if threshold_per_s <= 0 or rate_per_s < threshold_per_s:
        return None
    return Finding(
        state="suspect",
        severity="warning",
        action="reset_gpu",
        reason="nvlink_errors",
        evidence=(f"NVLink CRC/replay errors at {rate_per_s:.1f}/s (threshold {threshold_per_s:g}/s)",),
    )
