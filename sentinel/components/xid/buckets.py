"""NVIDIA's resolution buckets and what sentinel does for each: the one table behind every Xid action.

NVIDIA's catalog files every Xid code under an immediate-action bucket (:mod:`~sentinel.components.xid.nvidia`).
:data:`BUCKET_ACTIONS` says which of sentinel's actions carries each bucket out, with the severity it implies,
the follow-up when the first remedy does not clear it, and -- where sentinel departs from NVIDIA on purpose --
why. :func:`resolve` adds the context rules NVIDIA gives (Xid 45 solo or with other Xids, CHECK_UVM, the
NVLink5 decode, Xid 154's recovery value) and the codes without a bucket. The agent's classifier, the
aggregator's Xid verdicts, ``sentinel health`` and the docs table all read this module.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

import msgspec

from sentinel.components.vocab import Action, Severity
from sentinel.components.xid.decode import decode_nvlink5, decode_xid74, parse_recovery
from sentinel.components.xid.nvidia import NVIDIA_XIDS, XID154_LINKAGE


class Bucket(StrEnum):
    """NVIDIA's resolution buckets (immediate action), as the catalog spells them."""

    IGNORE = "IGNORE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"
    RESTART_VM = "RESTART_VM"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    CHECK_UVM = "CHECK_UVM"
    UPDATE_SWFW = "UPDATE_SWFW"
    XID_154 = "XID_154"
    XID_154_EVAL = "XID_154_EVAL"
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
    #: NVIDIA's cell is empty (codes 162-172) or the code is not in NVIDIA's catalog.
    NONE = ""


class BucketAction(msgspec.Struct, frozen=True, kw_only=True):
    """What sentinel does for one bucket (or one code, in :data:`CODE_ACTIONS`)."""

    severity: Severity
    action: Action
    #: The next remedy when the first one does not clear the condition (``None``: nothing further).
    follow_up: Action | None = None
    #: NVIDIA's meaning of the bucket, in short.
    nvidia: str = ""
    #: Why sentinel departs from NVIDIA here; empty when it does what NVIDIA says.
    why: str = ""


#: NVIDIA bucket -> sentinel's action. Any Xid is at least a warning: the driver saw something go wrong.
BUCKET_ACTIONS: Final[dict[Bucket, BucketAction]] = {
    Bucket.IGNORE: BucketAction(severity="warning", action="none", nvidia="no action required"),
    Bucket.RESTART_APP: BucketAction(
        severity="warning", action="restart_app", nvidia="restart the application; no GPU reset needed"
    ),
    Bucket.RESET_GPU: BucketAction(
        severity="critical", action="reset_gpu", nvidia="reset the GPU; a node restart is not needed"
    ),
    Bucket.RESTART_BM: BucketAction(
        severity="critical", action="reboot", nvidia="restart the bare-metal node"
    ),
    Bucket.RESTART_VM: BucketAction(
        severity="critical",
        action="reboot",
        nvidia="restart the VM that owns the GPU",
        why="sentinel has no VM restart; rebooting the (virtual) node is the nearest remedy",
    ),
    Bucket.CONTACT_SUPPORT: BucketAction(
        severity="warning",
        action="drain",
        follow_up="rma",
        nvidia="contact support for further investigation",
        why="a person investigates: the GPU takes no new work meanwhile; not critical, most of these codes "
        "are unused by current drivers and the GPU may be healthy",
    ),
    Bucket.CHECK_MECHANICALS: BucketAction(
        severity="critical",
        action="rma",
        nvidia="check the device's seating and connections",
        why="rma is sentinel's word for 'out of service for physical inspection'",
    ),
    Bucket.CHECK_UVM: BucketAction(
        severity="warning",
        action="none",
        nvidia="reset the GPU if UVM/vGPU is in use, otherwise ignore",
        why="sentinel's fleets run bare metal without vGPU: ignore unless told the GPU serves UVM/vGPU",
    ),
    Bucket.UPDATE_SWFW: BucketAction(
        severity="warning", action="none", nvidia="update firmware and software to the latest versions"
    ),
    Bucket.XID_154: BucketAction(
        severity="warning",
        action="none",
        nvidia="informational: the recovery action the other Xids need, printed in the line",
    ),
    Bucket.XID_154_EVAL: BucketAction(
        severity="warning",
        action="restart_app",
        nvidia="evaluate the Xid 154 that follows for the GPU's recovery",
        why="the line's own traffic was lost: restart the application; the Xid 154 line carries the GPU's "
        "recovery",
    ),
    Bucket.WORKFLOW_XID_45: BucketAction(
        severity="warning",
        action="none",
        nvidia="with other Xids: follow them; solo: restart the fabric manager",
        why="sentinel does not restart the fabric manager (it watches it separately); a solo Xid 45 is "
        "usually a killed or aborted application",
    ),
    Bucket.WORKFLOW_XID_48: BucketAction(
        severity="critical",
        action="reset_gpu",
        follow_up="rma",
        nvidia="solo: reset the GPU; with Xid 63/64: drain and reset; SRAM threshold exceeded: RMA flow",
    ),
    Bucket.WORKFLOW_NVLINK_ERR: BucketAction(
        severity="critical",
        action="reset_gpu",
        follow_up="rma",
        nvidia="decode the registers; a GPU reset or node reboot clears it; if it persists, contact the vendor",
    ),
    Bucket.WORKFLOW_NVLINK5_ERR: BucketAction(
        severity="critical",
        action="reset_gpu",
        nvidia="decode IntrInfo/ErrorStatus: per decode row RESET_GPU, IGNORE or XID_154_EVAL",
        why="a line without a decodable row or a Fatal/Nonfatal word is taken as fatal",
    ),
    Bucket.NONE: BucketAction(
        severity="warning", action="none", nvidia="no bucket", why="NVIDIA gives no action: report it"
    ),
}

#: Codes whose action is not their bucket's: no NVIDIA bucket (162-173) or a follow-up NVIDIA names.
CODE_ACTIONS: Final[dict[int, BucketAction]] = {
    64: BucketAction(
        severity="critical",
        action="reset_gpu",
        follow_up="rma",
        nvidia="reset the GPU (the remapping is retried at reset)",
        why="rma only if the remapping fails again after the reset (row-remap rule)",
    ),
    162: BucketAction(
        severity="warning",
        action="none",
        nvidia="no bucket; power smoothing re-engaged",
        why="clears an earlier Xid 163 on the GPU",
    ),
    163: BucketAction(
        severity="warning",
        action="none",
        follow_up="reset_gpu",
        nvidia="no bucket; no GPU reset required, if disabled by a timeout reload the driver or reset the GPU",
    ),
    164: BucketAction(
        severity="warning", action="none", nvidia="no bucket; monitor power swings, expect to replace GPUs"
    ),
    165: BucketAction(
        severity="warning",
        action="none",
        follow_up="rma",
        nvidia="no bucket; replace GPUs if power swings are not acceptable",
    ),
    166: BucketAction(
        severity="warning",
        action="none",
        nvidia="no bucket; CC traffic before the link was set up for encryption",
        why="a confidential-computing setup event, not a GPU fault",
    ),
    167: BucketAction(
        severity="critical",
        action="reset_gpu",
        nvidia="no bucket; fatal PCIe timeout",
        why="the GPU's PCIe link timed out fatally: reset it like the RESET_GPU codes",
    ),
    168: BucketAction(
        severity="critical",
        action="reboot",
        nvidia="no bucket; errors in the write-protected region, boot re-attempted with a shifted WPR",
    ),
    169: BucketAction(
        severity="critical",
        action="reset_gpu",
        nvidia="no bucket; internal micro-controller (SEC2) halt",
        why="treated like the PMU halt, Xid 62 (RESET_GPU)",
    ),
    170: BucketAction(
        severity="warning",
        action="none",
        nvidia="no bucket; interrupt seen in CC mode",
        why="a confidential-computing event, not a GPU fault",
    ),
    171: BucketAction(
        severity="critical",
        action="reset_gpu",
        nvidia="no bucket; details of an Xid 48 (DRAM)",
        why="follows its Xid 48 (WORKFLOW_XID_48), in case the 48 line was lost",
    ),
    172: BucketAction(
        severity="critical",
        action="reset_gpu",
        nvidia="no bucket; details of an Xid 48 (SRAM)",
        why="follows its Xid 48 (WORKFLOW_XID_48), in case the 48 line was lost",
    ),
    173: BucketAction(
        severity="critical",
        action="reboot",
        nvidia="not in NVIDIA's catalog; C2C fatal link failure",
        why="the chip-to-chip link joins the GPU to its CPU: a GPU reset cannot retrain it",
    ),
}

#: Paired codes: the later code clears the condition the earlier one reported (power smoothing re-engaged
#: after it was disengaged), so the earlier code's occurrences stop counting.
CLEARED_BY: Final[dict[int, int]] = {162: 163}

#: Xid 154's recovery values -> sentinel's action.
RECOVERY_ACTIONS: Final[dict[str, BucketAction]] = {
    "None": BucketAction(severity="warning", action="none", nvidia="no recovery needed"),
    "GPU Reset Required": BucketAction(severity="critical", action="reset_gpu", nvidia="reset the GPU"),
    "Node Reboot Required": BucketAction(severity="critical", action="reboot", nvidia="reboot the node"),
    "Drain P2P": BucketAction(
        severity="critical",
        action="drain",
        nvidia="stop peer-to-peer work on the GPU",
        why="sentinel drains the GPU: no new peer-to-peer work, no reset",
    ),
    "Drain and Reset": BucketAction(
        severity="critical", action="reset_gpu", nvidia="drain the GPU, then reset it"
    ),
}

#: Codes NVIDIA names as the context of Xid 48 (drain and reset) and of Xid 45 (follow the other Xid).
_XID48_PARTNERS: Final = frozenset({63, 64})
_LINK_FATAL_IGNORE: Final = BucketAction(
    severity="critical",
    action="reset_gpu",
    nvidia="IGNORE, but Link Fatal",
    why="NVIDIA: a link-fatal event leaves the GPU in the drain-and-reset state",
)

_CONTAINED: Final = 94
_CONTAINED_RESET: Final = BucketAction(
    severity="critical",
    action="reset_gpu",
    nvidia="RESTART_APP, but the line says RST: Yes",
    why="the driver says the contained error needs a GPU reset",
)

_NVIDIA: Final[dict[int, tuple[Bucket, str]]] = {row[0]: (Bucket(row[3]), row[4]) for row in NVIDIA_XIDS}


class Resolution(msgspec.Struct, frozen=True, kw_only=True):
    """What NVIDIA says about one Xid occurrence and what sentinel does."""

    code: int
    bucket: Bucket
    investigatory: str
    severity: Severity
    action: Action
    follow_up: Action | None
    #: NVIDIA's words for this occurrence: bucket, decode row or recovery value, context.
    nvidia: str
    why: str = ""

    def evidence(self) -> str:
        """The bucket as an Xid verdict's evidence shows it."""
        text = f"NVIDIA: {self.bucket.value or 'no bucket'}"
        if self.investigatory:
            text += f" (investigate: {self.investigatory})"
        if self.nvidia:
            text += f"; {self.nvidia}"
        return text


def nvidia_buckets(code: int) -> tuple[Bucket, str]:
    """NVIDIA's immediate and investigatory bucket for ``code`` (``NONE``/"" for a code NVIDIA lacks)."""
    return _NVIDIA.get(code, (Bucket.NONE, ""))


def resolve(
    code: int, message: str = "", *, other_codes: frozenset[int] = frozenset(), uvm: bool = False
) -> Resolution:
    """NVIDIA's bucket for one occurrence of ``code`` and sentinel's action for it.

    ``message`` is the line's text after the code (decoded for 74, 144-150 and 154); ``other_codes`` the
    other Xids seen on the GPU since its last reset (context for 45 and 48); ``uvm`` whether the GPU serves
    UVM/vGPU (CHECK_UVM).
    """
    bucket, investigatory = nvidia_buckets(code)
    rule = CODE_ACTIONS.get(code) or BUCKET_ACTIONS[bucket]
    note = rule.nvidia
    if bucket is Bucket.XID_154:
        recovery = parse_recovery(message)
        if recovery is not None:
            rule = RECOVERY_ACTIONS[recovery.after]
            note = f"recovery {recovery.before or '?'} -> {recovery.after}"
        summarised = sorted(other_codes & XID154_LINKAGE.keys())
        if summarised:
            note += f" (for Xid {', '.join(map(str, summarised))})"
    elif bucket is Bucket.WORKFLOW_NVLINK5_ERR:
        rule, note, investigatory = _nvlink5(code, message, rule, investigatory)
    elif bucket is Bucket.WORKFLOW_NVLINK_ERR:
        decoded = decode_xid74(message)
        if decoded is not None:
            link = "?" if decoded.link is None else str(decoded.link)
            note = f"link {link}: {decoded.error_class.replace('_', ' ')}; {rule.nvidia}"
    elif bucket is Bucket.WORKFLOW_XID_45:
        others = sorted(other_codes - {45})
        note = (
            f"not solo (with Xid {', '.join(map(str, others))}): follow the other Xid"
            if others
            else "solo: NVIDIA restarts the fabric manager"
        )
    elif bucket is Bucket.WORKFLOW_XID_48 and other_codes & _XID48_PARTNERS:
        note = "with Xid 63/64: drain and reset"
    elif code == _CONTAINED and "RST: Yes" in message[:400]:
        rule = _CONTAINED_RESET
        note = rule.nvidia
    elif bucket is Bucket.CHECK_UVM and uvm:
        rule = BUCKET_ACTIONS[Bucket.RESET_GPU]
        note = "UVM/vGPU in use: reset the GPU"
    return Resolution(
        code=code,
        bucket=bucket,
        investigatory=investigatory,
        severity=rule.severity,
        action=rule.action,
        follow_up=rule.follow_up,
        nvidia=note,
        why=rule.why,
    )


def _nvlink5(
    code: int, message: str, default: BucketAction, investigatory: str
) -> tuple[BucketAction, str, str]:
    """The rule, NVIDIA's words and the investigatory bucket of an NVLink5 line's decode row."""
    decoded = decode_nvlink5(code, message)
    if decoded is None:
        lowered = message[:200].lower()
        if "nonfatal" in lowered or "non-fatal" in lowered:
            return BUCKET_ACTIONS[Bucket.IGNORE], "no decode row; the line says Nonfatal", investigatory
        return (
            default,
            "no decode row" + ("; the line says Fatal" if "fatal" in lowered else ""),
            investigatory,
        )
    row = f"{decoded.unit} {decoded.bucket}/{decoded.severity} (decode {decoded.driver})"
    if decoded.bucket == "IGNORE" and decoded.severity.startswith("Link Fatal"):
        return _LINK_FATAL_IGNORE, row, decoded.investigatory
    return BUCKET_ACTIONS[Bucket(decoded.bucket)], row, decoded.investigatory


def markdown_table() -> str:
    """The bucket -> action table as docs/signals.md shows it (a test keeps the doc in sync)."""
    lines = [
        "| NVIDIA bucket | NVIDIA says | severity | action | follow-up | why sentinel departs |",
        "|---|---|---|---|---|---|",
    ]
    for bucket, rule in BUCKET_ACTIONS.items():
        name = f"`{bucket.value}`" if bucket.value else "(none)"
        lines.append(_row(name, rule))
    for value, rule in RECOVERY_ACTIONS.items():
        lines.append(_row(f"`XID_154` {value}", rule))
    lines.append(_row("NVLink5 row `IGNORE` + Link Fatal", _LINK_FATAL_IGNORE))
    lines.append(_row("Xid 94 with `RST: Yes`", _CONTAINED_RESET))
    for code, rule in CODE_ACTIONS.items():
        lines.append(_row(f"Xid {code}", rule))
    return "\n".join(lines) + "\n"


def _row(name: str, rule: BucketAction) -> str:
    follow = f"`{rule.follow_up}`" if rule.follow_up else ""
    return f"| {name} | {rule.nvidia} | {rule.severity} | `{rule.action}` | {follow} | {rule.why} |"
