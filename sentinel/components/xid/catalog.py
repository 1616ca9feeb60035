"""Sentinel's own table of NVIDIA Xid codes.

The facts (what a code means, NVIDIA's buckets) come from NVIDIA's Xid catalog
(:mod:`~sentinel.components.xid.nvidia`); the wording and the primary cause are ours; severity and action come
from the bucket table (:mod:`~sentinel.components.xid.buckets`), the one place that maps NVIDIA's buckets to
sentinel's actions. The table lives in code so that the agent has no data file to lose and so that reviews
see every change.

Severity is what an operator should feel when the line shows up (``warning``: look at it; ``critical``: the
GPU or the job is in trouble now). ``action`` is the first remedy, the cheapest one that fixes the usual
cause. Application-caused codes never make a GPU faulty on their own; only repetition across different
processes (see :mod:`sentinel.components.xid.rule`) points at the hardware.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from sentinel.components.vocab import Action, Severity
from sentinel.components.xid.buckets import Bucket, resolve
from sentinel.components.xid.nvidia import NVIDIA_XIDS

Cause = Literal["hardware", "driver", "application"]

#: Codes whose typical cause is the application (bad pointer, killed process). By themselves they never
#: make a GPU faulty.
APPLICATION_CODES: Final = frozenset({13, 31, 43, 45})

#: Codes that say the driver lost the GPU (79: fallen off the bus). NVML's GPU_IS_LOST is their symptom, so a
#: lost GPU's verdict is named by the Xid (:mod:`sentinel.aggregator.detectors.hardware`).
GPU_LOST_CODES: Final = frozenset({79})

#: NVLink5 codes whose severity depends on the sub-unit printed in the line ("Nonfatal" vs "Fatal").
NVLINK5_CODES: Final = frozenset({144, 145, 146, 147, 148, 149, 150})


class XidInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What sentinel knows about one Xid code."""

    code: int
    name: str
    meaning: str
    cause: Cause
    severity: Severity
    action: Action
    #: The GPU is taken out of service on the first occurrence (before any repetition logic).
    faulty_at_once: bool
    #: NVIDIA's immediate-action bucket ("" where NVIDIA gives none) and investigatory bucket.
    bucket: str = ""
    investigatory: str = ""


#: (code, name, meaning, cause): our own words for the codes operators meet most.
_TABLE: Final[tuple[tuple[int, str, str, Cause], ...]] = (
    (
        8,
        "channel idle timeout",
        "A GPU channel stopped making progress and the driver timed it out.",
        "driver",
    ),
    (
        13,
        "graphics engine exception",
        "A kernel faulted inside the SM (bad address, illegal instruction); "
        "almost always a bug in the program that ran.",
        "application",
    ),
    (
        31,
        "GPU memory page fault",
        "The GPU MMU saw an access to an unmapped or protected address, usually a "
        "dangling or out-of-range pointer in the program.",
        "application",
    ),
    (
        32,
        "push-buffer stream error",
        "The command stream reaching the GPU was invalid or corrupted, often a PCIe signal problem.",
        "hardware",
    ),
    (38, "FECS watchdog timeout", "Firmware of the context-switch engine stopped answering.", "driver"),
    (
        43,
        "channel torn down",
        "A user channel hit a fault and was shut down; the GPU itself is healthy and the "
        "process is already gone.",
        "application",
    ),
    (44, "fault during context switch", "The graphics engine faulted while switching contexts.", "driver"),
    (
        45,
        "preemptive channel cleanup",
        "The driver cleaned up channels of a process that was killed or hit "
        "an earlier error; look for the primary Xid next to it.",
        "application",
    ),
    (46, "GPU timeout", "The GPU stopped processing and did not recover.", "hardware"),
    (
        48,
        "double-bit ECC error",
        "An uncorrectable ECC error hit GPU memory; the running program is killed "
        "and the row waits for remapping at the next reset.",
        "hardware",
    ),
    (
        54,
        "auxiliary power missing",
        "The board runs without its auxiliary power connector and throttles.",
        "hardware",
    ),
    (61, "PMU breakpoint", "The power-management micro-controller hit an internal breakpoint.", "driver"),
    (62, "PMU halt", "The power-management micro-controller halted.", "hardware"),
    (
        63,
        "memory repair recorded",
        "A failing memory row (or page, before Ampere) was recorded for repair; "
        "the repair takes effect at the next GPU reset.",
        "hardware",
    ),
    (
        64,
        "memory repair failed",
        "Row remapping or page retirement could not record a failing location, "
        "usually because the spare rows of a bank are used up.",
        "hardware",
    ),
    (68, "video decoder exception", "The NVDEC engine raised an exception.", "driver"),
    (69, "graphics class error", "The program used a graphics engine class incorrectly.", "application"),
    (
        74,
        "NVLink error",
        "A fatal error on an NVLink link; the faulty part may be this GPU, the peer or the "
        "switch in between.",
        "hardware",
    ),
    (
        79,
        "fallen off the bus",
        "The driver can no longer reach the GPU over PCIe (link, power or thermal failure).",
        "hardware",
    ),
    (80, "push-buffer CRC mismatch", "Data sent to the GPU arrived corrupted.", "hardware"),
    (
        92,
        "high single-bit ECC rate",
        "Correctable ECC errors arrive at a high rate: memory is degrading.",
        "hardware",
    ),
    (93, "InfoROM wear limit", "The InfoROM exceeded its provisioned erase count.", "hardware"),
    (
        94,
        "contained memory error",
        "An uncorrectable memory error was contained to the program that touched "
        "it; other work on the GPU continues.",
        "hardware",
    ),
    (
        95,
        "uncontained memory error",
        "An uncorrectable memory error could not be contained; all work on the GPU is affected.",
        "hardware",
    ),
    (109, "context switch timeout", "A context switch did not finish in time.", "driver"),
    (110, "security fault", "The GPU raised a security fault.", "driver"),
    (
        119,
        "GSP RPC timeout",
        "The GPU System Processor did not answer a driver request; the process named "
        "in the line is usually just the caller that noticed.",
        "driver",
    ),
    (120, "GSP error", "The GPU System Processor firmware raised an exception.", "driver"),
    (121, "C2C link error", "Error on the chip-to-chip link of a Grace superchip.", "hardware"),
    (122, "SPI PMU read failure", "Reading from the PMU over SPI failed.", "hardware"),
    (123, "SPI PMU write failure", "Writing to the PMU over SPI failed.", "hardware"),
    (136, "NVLink training failure", "An NVLink link failed to train.", "hardware"),
    (
        137,
        "NVLink privilege error",
        "NVLink privilege error, usually a side effect of another fabric event.",
        "hardware",
    ),
    (140, "ECC error escaped", "An ECC error escaped correction and containment.", "hardware"),
    (143, "GPU init error", "The GPU failed to initialise.", "hardware"),
    (144, "NVLink SAW error", "NVLink5 SAW unit error; the line says whether it was fatal.", "hardware"),
    (145, "NVLink RLW error", "NVLink5 RLW unit error; the line says whether it was fatal.", "hardware"),
    (146, "NVLink TLW error", "NVLink5 TLW unit error; the line says whether it was fatal.", "hardware"),
    (147, "NVLink TREX error", "NVLink5 TREX unit error; the line says whether it was fatal.", "hardware"),
    (
        148,
        "NVLink NVLPW error",
        "NVLink5 power/control unit error; the line says whether it was fatal.",
        "hardware",
    ),
    (
        149,
        "NVLink NETIR error",
        "NVLink5 network interface event (link down, bit-error rate); the line says whether it was fatal.",
        "hardware",
    ),
    (150, "NVLink MSE error", "The NVLink5 management engine watchdog fired.", "driver"),
    (
        154,
        "recovery action changed",
        "The driver states which recovery the GPU now needs; the action is printed in the line.",
        "driver",
    ),
    (155, "NVLink software error", "Software-defined NVLink error.", "driver"),
    (
        156,
        "resource retirement event",
        "A hardware resource was retired and needs a reset to take effect.",
        "hardware",
    ),
    (157, "resource retirement failure", "A hardware resource could not be retired.", "hardware"),
    (158, "GPU fatal timeout", "The GPU hit a fatal timeout.", "hardware"),
    (
        173,
        "C2C fatal link failure",
        "The chip-to-chip link between the GPU and its CPU failed (not in NVIDIA's catalog).",
        "hardware",
    ),
)

_CAUSES: Final[dict[Bucket, Cause]] = {
    Bucket.RESTART_APP: "driver",
    Bucket.RESET_GPU: "hardware",
    Bucket.RESTART_BM: "hardware",
    Bucket.CHECK_MECHANICALS: "hardware",
    Bucket.WORKFLOW_XID_45: "application",
    Bucket.WORKFLOW_XID_48: "hardware",
    Bucket.WORKFLOW_NVLINK_ERR: "hardware",
    Bucket.WORKFLOW_NVLINK5_ERR: "hardware",
    Bucket.CONTACT_SUPPORT: "hardware",
}


def _from_nvidia(code: int, mnemonic: str, description: str, bucket: str) -> tuple[str, str, Cause]:
    name = mnemonic.lower().replace("_", " ")
    return name, f"{description} (NVIDIA bucket {bucket or 'none'})", _CAUSES.get(Bucket(bucket), "driver")


def _info(code: int, name: str, meaning: str, cause: Cause) -> XidInfo:
    """One entry: our words, NVIDIA's buckets, the bucket table's severity and action."""
    resolution = resolve(code)
    faulty = resolution.severity == "critical" and cause != "application"
    return XidInfo(
        code=code,
        name=name,
        meaning=meaning,
        cause=cause,
        severity=resolution.severity,
        action=resolution.action,
        faulty_at_once=faulty,
        bucket=resolution.bucket.value,
        investigatory=resolution.investigatory,
    )


_WORDS: Final[dict[int, tuple[str, str, Cause]]] = {
    **{row[0]: _from_nvidia(*row[:4]) for row in NVIDIA_XIDS},
    **{row[0]: (row[1], row[2], row[3]) for row in _TABLE},  # our own wording where we have written one
}

XID_TABLE: Final[dict[int, XidInfo]] = {code: _info(code, *words) for code, words in sorted(_WORDS.items())}


def xid_info(code: int) -> XidInfo:
    """The table entry for ``code``; a code NVIDIA's catalog does not list (a newer driver) is a warning
    that names the code — reported, never dropped, never a faulty GPU on its own."""
    info = XID_TABLE.get(code)
    if info is not None:
        return info
    return XidInfo(
        code=code,
        name=f"unknown Xid {code}",
        meaning=f"Xid {code} is not in NVIDIA's catalog as sentinel knows it (a newer driver?); check the catalog.",
        cause="driver",
        severity="warning",
        action="none",
        faulty_at_once=False,
    )
