"""Which runbook (``docs/runbooks/<name>.md``) the status page links for a verdict.

A verdict's reason names the signal (``gpu_lost``, ``row_remap_failure``, ``xid_79``, ``ib_link_flap``);
its kind says how bad it is. The most specific runbook wins: a reason prefix first, then the kind, then
the runbooks' index (``README.md``) for a reason nobody wrote a runbook for. Every name here is a file in
``docs/runbooks/`` (a test checks each one), so the page never links to a runbook that does not exist.
"""

from __future__ import annotations

from typing import Final

#: The runbooks' index: the link for a verdict no specific runbook covers.
GENERAL_RUNBOOK: Final = "README.md"

#: Reason prefix → runbook, most specific prefix first (the first match wins).
RUNBOOK_OF_REASON_PREFIX: Final[tuple[tuple[str, str], ...]] = (
    ("gpu_lost", "SentinelGpuLost.md"),
    ("gpus_missing", "SentinelGpuLost.md"),
    ("gpu_unresponsive", "SentinelGpuUnresponsive.md"),
    ("gpu_unavailable", "SentinelGpuUnresponsive.md"),
    ("row_remap_failure", "SentinelGpuRowRemapFailed.md"),
    ("row_remap_", "SentinelGpuRowRemapPending.md"),
    ("ecc_uncorrect", "SentinelGpuUncorrectableEcc.md"),
    ("xid_", "SentinelGpuCriticalXid.md"),
    ("fabric_domain_down", "SentinelNvlinkDomainDown.md"),
    ("fabric_domain_incomplete", "SentinelNvlinkDomainIncomplete.md"),
    ("link_slow", "SentinelLinkSlow.md"),
    ("ib_link_flap", "SentinelIbLinkFlapping.md"),
    ("ib_port_down", "SentinelIbPortDown.md"),
    ("ib_link_down", "SentinelIbPortDown.md"),
    ("ib_read_problem", "SentinelIbReadErrors.md"),
    ("ib_state_unreadable", "SentinelIbReadErrors.md"),
    ("ib_", "SentinelIbPortDegraded.md"),
)

#: Verdict kind → runbook, when no reason prefix matched.
RUNBOOK_OF_KIND: Final[dict[str, str]] = {  # keys: every VerdictKind (a test checks)
    "faulty": "SentinelGpuFaulty.md",
    "degraded": "SentinelGpuDegraded.md",
    "stuck": "SentinelJobStalled.md",
    "straggler": "SentinelStraggler.md",
    "host_silent": "SentinelHostSilent.md",
}


def runbook_for(kind: str, reason: str) -> str:
    """The runbook file name for a verdict of ``kind`` with ``reason`` (the index when none fits)."""
    for prefix, name in RUNBOOK_OF_REASON_PREFIX:
        if reason.startswith(prefix):
            return name
    return RUNBOOK_OF_KIND.get(kind, GENERAL_RUNBOOK)


def runbook_table(base: str) -> dict[str, object]:
    """What the page needs to pick a link in the browser: the same rules as :func:`runbook_for`."""
    return {
        "base": base,
        "reason_prefixes": [list(pair) for pair in RUNBOOK_OF_REASON_PREFIX],
        "kinds": dict(RUNBOOK_OF_KIND),
        "general": GENERAL_RUNBOOK,
    }
