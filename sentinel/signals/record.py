"""The classified-event record every signal parser produces (docs/contracts.md §2).

The eight contract fields are always present (``null`` when unknown); the extra fields appear only when a
parser found them, so JSON output stays small for the common case.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

import msgspec

from sentinel.components.vocab import SEVERITY_RANK, Action, Finding, Severity

Kind = Literal[
    "nccl_init",
    "nccl_info",
    "nccl_warn_net",
    "nccl_warn_cuda",
    "nccl_warn_other",
    "torch_watchdog_timeout",
    "torch_other_error",
    "xid",
    "row_remap",
    "ecc",
    "other",
]

KINDS: Final[tuple[Kind, ...]] = get_args(Kind)

#: Tie-break between events of equal severity found in one record: the more specific root cause wins
#: (a flattened "Some NCCL operations have failed ... Last error: NET/IB ..." is a network event; a
#: "watchdog thread terminated with exception: ... Watchdog caught collective operation timeout" is a
#: timeout).
KIND_RANK: Final[dict[str, int]] = {
    "xid": 10,
    "row_remap": 9,
    "ecc": 9,
    "nccl_warn_cuda": 8,
    "nccl_warn_net": 7,
    "nccl_warn_other": 6,
    "torch_watchdog_timeout": 5,
    "torch_other_error": 4,
    "nccl_init": 3,
    "nccl_info": 2,
    "other": 1,
}


class Classified(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One event found in a log line or block."""

    kind: Kind
    severity: Severity
    xid: int | None
    pci_bus: str | None
    rank: int | None
    seq: int | None
    op: str | None
    timeout_ms: int | None
    #: Short machine-readable reason, e.g. ``xid_79``, ``nccl_ib_completion_error``, ``watchdog_timeout``.
    reason: str | None = None
    #: First remedy: none, restart_app, reset_gpu, reboot, rma.
    action: Action | None = None
    host: str | None = None
    pid: int | None = None
    process: str | None = None
    cuda_dev: int | None = None
    nranks: int | None = None
    comm: str | None = None
    nccl_version: str | None = None
    peer: str | None = None
    peer_rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    numel_in: int | None = None
    numel_out: int | None = None
    ran_for_ms: int | None = None
    previous_xid: int | None = None
    sxid: int | None = None
    gpu_instance: int | None = None
    #: 1-based line number in the input (raw mode only).
    line: int | None = None
    #: When the line says it happened, as it printed it (syslog, ISO 8601, dmesg), or ISO 8601 UTC for
    #: records read from journald or /dev/kmsg (raw mode only).
    time: str | None = None
    #: One-line excerpt of what the event says.
    message: str | None = None


def make_event(kind: Kind, severity: Severity, **fields: object) -> Classified:
    """Build a :class:`Classified` with the contract fields defaulting to ``None``."""
    base: dict[str, object] = {
        "xid": None,
        "pci_bus": None,
        "rank": None,
        "seq": None,
        "op": None,
        "timeout_ms": None,
    }
    base.update(fields)
    return Classified(kind=kind, severity=severity, **base)  # type: ignore[arg-type]


def finding_event(kind: Kind, finding: Finding, **fields: object) -> Classified:
    """The event for a line that reports what a component's rule decides (``finding``: its severity,
    action and reason), so the classifier never decides a component's fact again."""
    return make_event(kind, finding.severity, action=finding.action, reason=finding.reason, **fields)


def severity_key(event: Classified) -> tuple[int, int]:
    """Sort key: most severe first by severity, then by how specific the kind is."""
    return SEVERITY_RANK[event.severity], KIND_RANK[event.kind]


def most_severe(events: list[Classified]) -> Classified | None:
    """The event that describes a record best (first one wins ties, so order of discovery matters)."""
    best: Classified | None = None
    best_key = (-1, -1)
    for event in events:
        key = severity_key(event)
        if key > best_key:
            best, best_key = event, key
    return best
