"""NVLink rule: error counters climbing faster than a threshold, and which link and counter rose.

Pure: the link records (and the error rate the aggregator measured from their history) in, findings out.
Error rates that climb mean a marginal link (replays cost bandwidth) before it fails.
"""

from __future__ import annotations

from sentinel.components.nvlink.record import COUNTERS, ERROR_COUNTERS, NvLink
from sentinel.components.vocab import Finding

_KIND = dict(COUNTERS)
#: rises named in a finding's evidence at most (an 18-link GPU can rise on every link)
MAX_RISES = 6


def error_total(links: list[NvLink]) -> int:
    """Every error counter that costs bandwidth (:data:`ERROR_COUNTERS`) over every link: the counter whose
    rate the aggregator tracks. Counters this GPU does not report count as 0."""
    return sum(getattr(link, attr) or 0 for link in links for attr in ERROR_COUNTERS)


def rises(before: list[NvLink], after: list[NvLink]) -> tuple[str, ...]:
    """Which link and which counter rose between two readings, largest first: ``link 3 replay +120``.

    A counter that went backwards (driver reload) is not a rise; a link missing from ``before`` is compared
    with zero.
    """
    old = {link.link: link for link in before}
    found: list[tuple[int, str]] = []
    for link in after:
        prev = old.get(link.link)
        for attr in ERROR_COUNTERS:
            now = getattr(link, attr)
            was = (getattr(prev, attr) if prev is not None else 0) or 0
            if now is not None and now > was:
                found.append((now - was, f"link {link.link} {_KIND[attr]} +{now - was}"))
    found.sort(key=lambda item: -item[0])
    return tuple(text for _, text in found[:MAX_RISES])


def evaluate_error_rate(
    rate_per_s: float, threshold_per_s: float, rose: tuple[str, ...] = ()
) -> Finding | None:
    """Error counters climbing at ``rate_per_s`` or more; ``rose`` (from :func:`rises`) names the links and
    counters of the latest rise, so the operator knows which cable or switch port to look at."""
    if threshold_per_s <= 0 or rate_per_s < threshold_per_s:
        return None
    evidence = [f"NVLink errors at {rate_per_s:.1f}/s (threshold {threshold_per_s:g}/s)"]
    if rose:
        evidence.append("latest rise: " + ", ".join(rose))
    return Finding(
        state="suspect",
        severity="warning",
        action="reset_gpu",
        reason="nvlink_errors",
        evidence=tuple(evidence),
    )
