"""The one vocabulary of GPU health that verdicts, metrics, alerts and rules share.

Every component's rule speaks these types, the aggregator's verdicts carry them, the agent's metrics put
them in labels and the alert rules match those labels — so "critical" or "reset_gpu" means the same thing
in a Python rule, a Prometheus series and a page. Adding a value here is the only way to add one anywhere.

Orders matter: :data:`ACTIONS` runs from the cheapest remedy to the most drastic, and a verdict that
gathers several findings keeps the most drastic one; :data:`VERDICT_KINDS` likewise from least to most
urgent.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, get_args

import msgspec

#: How an operator should feel when it shows up: ``warning`` look at it, ``critical`` trouble now.
Severity = Literal["info", "warning", "critical"]
SEVERITIES: Final[tuple[Severity, ...]] = get_args(Severity)

#: The first remedy, cheapest that fixes the usual cause (ordered: later = more drastic).
Action = Literal["none", "restart_app", "drain", "reset_gpu", "reboot", "rma"]
ACTIONS: Final[tuple[Action, ...]] = get_args(Action)

#: What the aggregator concludes about a GPU, a rank or a host (ordered: later = more urgent).
VerdictKind = Literal["host_silent", "straggler", "degraded", "stuck", "faulty"]
VERDICT_KINDS: Final[tuple[VerdictKind, ...]] = get_args(VerdictKind)

#: A verdict's or a classified line's machine-readable reason: a snake_case code (``row_remap_pending``,
#: ``xid_79``, ``fr_hang``, ``nccl_comm_abort``). The set is open by design — one code per Xid, per
#: Flight Recorder analysis verdict, per log rule — so it is a constrained string rather than a Literal:
#: the wire refuses anything that is not a short code (no free text, no spaces, no markup), which keeps
#: alert labels and dashboards one series per cause.
REASON_PATTERN: Final = r"^[a-z][a-z0-9_]{0,63}$"
ReasonCode = Annotated[str, msgspec.Meta(pattern=REASON_PATTERN, max_length=64)]

#: A rule's view of one GPU: ``suspect`` becomes a degraded verdict, ``faulty`` a faulty one.
GpuHealth = Literal["ok", "suspect", "faulty"]

#: Severity → its position in :data:`SEVERITIES` (higher = more severe): the one severity order.
SEVERITY_RANK: Final[dict[str, int]] = {s: i for i, s in enumerate(SEVERITIES)}
_ACTION_RANK: Final = {a: i for i, a in enumerate(ACTIONS)}


def worse_action(a: Action, b: Action) -> Action:
    """The more drastic of two actions."""
    return a if _ACTION_RANK[a] >= _ACTION_RANK[b] else b


def action_rank(action: str) -> int:
    """Position of ``action`` in :data:`ACTIONS` (0 for an unknown string)."""
    return _ACTION_RANK.get(action, 0)  # type: ignore[call-overload,no-any-return]


def severity_rank(severity: str) -> int:
    return SEVERITY_RANK.get(severity, 0)


def verdict_kind(health: GpuHealth) -> VerdictKind:
    """The verdict a rule's GPU health maps to (``ok`` has none; callers filter it out first)."""
    return "faulty" if health == "faulty" else "degraded"


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """What one component rule concludes from its records (row remap, ECC, NVLink, fabric, ...)."""

    state: GpuHealth
    severity: Severity
    action: Action
    #: Short machine-readable code, e.g. ``row_remap_pending``, ``ecc_uncorrected_volatile``.
    reason: ReasonCode
    #: Human-readable facts that led to the decision.
    evidence: tuple[str, ...] = ()

    def because(self, *evidence: str) -> Finding:
        """This finding (a rule's outcome, declared once) with the evidence of one case."""
        return msgspec.structs.replace(self, evidence=evidence)
