"""Sentinel's own table of NVIDIA Xid codes.

The facts (what a code means, what usually causes it, what NVIDIA says to do) come from NVIDIA's public Xid
catalog as collected in ``corpus/logs/xid_catalog.json``; the wording and the choice of one primary cause,
a severity and one recommended action per code are ours. The table lives in code so that the agent has no
data file to lose and so that reviews see every change.

Severity is what an operator should feel when the line shows up (``warning``: look at it; ``critical``: the
GPU or the job is in trouble now). ``action`` is the first remedy, the cheapest one that fixes the usual
cause. Application-caused codes never make a GPU faulty on their own; only repetition across different
processes (see :mod:`sentinel.components.xid.rule`) points at the hardware.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from sentinel.components.vocab import Action, Severity
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


def _x(code: int, name: str, meaning: str, cause: Cause, severity: Severity, action: Action) -> XidInfo:  # noqa: PLR0917
    faulty = severity == "critical" and cause != "application"
    return XidInfo(
        code=code,
        name=name,
        meaning=meaning,
        cause=cause,
        severity=severity,
        action=action,
        faulty_at_once=faulty,
    )


_TABLE: Final[tuple[XidInfo, ...]] = (
    _x(
        8,
        "channel idle timeout",
        "A GPU channel stopped making progress and the driver timed it out.",
        "driver",
        "warning",
        "restart_app",
    ),
    _x(
        13,
        "graphics engine exception",
        "A kernel faulted inside the SM (bad address, illegal instruction); "
        "almost always a bug in the program that ran.",
        "application",
        "warning",
        "restart_app",
    ),
    _x(
        31,
        "GPU memory page fault",
        "The GPU MMU saw an access to an unmapped or protected address, usually a "
        "dangling or out-of-range pointer in the program.",
        "application",
        "warning",
        "restart_app",
    ),
    _x(
        32,
        "push-buffer stream error",
        "The command stream reaching the GPU was invalid or corrupted, often a PCIe signal problem.",
        "hardware",
        "warning",
        "restart_app",
    ),
    _x(
        38,
        "FECS watchdog timeout",
        "Firmware of the context-switch engine stopped answering.",
        "driver",
        "warning",
        "none",
    ),
    _x(
        43,
        "channel torn down",
        "A user channel hit a fault and was shut down; the GPU itself is healthy and the "
        "process is already gone.",
        "application",
        "warning",
        "none",
    ),
    _x(
        44,
        "fault during context switch",
        "The graphics engine faulted while switching contexts.",
        "driver",
        "warning",
        "none",
    ),
    _x(
        45,
        "preemptive channel cleanup",
        "The driver cleaned up channels of a process that was killed or hit "
        "an earlier error; look for the primary Xid next to it.",
        "application",
        "warning",
        "none",
    ),
    _x(
        46,
        "GPU timeout",
        "The GPU stopped processing and did not recover.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(
        48,
        "double-bit ECC error",
        "An uncorrectable ECC error hit GPU memory; the running program is killed "
        "and the row waits for remapping at the next reset.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(
        54,
        "auxiliary power missing",
        "The board runs without its auxiliary power connector and throttles.",
        "hardware",
        "critical",
        "rma",
    ),
    _x(
        61,
        "PMU breakpoint",
        "The power-management micro-controller hit an internal breakpoint.",
        "driver",
        "warning",
        "reset_gpu",
    ),
    _x(62, "PMU halt", "The power-management micro-controller halted.", "hardware", "critical", "reset_gpu"),
    _x(
        63,
        "memory repair recorded",
        "A failing memory row (or page, before Ampere) was recorded for repair; "
        "the repair takes effect at the next GPU reset.",
        "hardware",
        "warning",
        "none",
    ),
    _x(
        64,
        "memory repair failed",
        "Row remapping or page retirement could not record a failing location, "
        "usually because the spare rows of a bank are used up.",
        "hardware",
        "critical",
        "rma",
    ),
    _x(
        68,
        "video decoder exception",
        "The NVDEC engine raised an exception.",
        "driver",
        "warning",
        "restart_app",
    ),
    _x(
        69,
        "graphics class error",
        "The program used a graphics engine class incorrectly.",
        "application",
        "warning",
        "restart_app",
    ),
    _x(
        74,
        "NVLink error",
        "A fatal error on an NVLink link; the faulty part may be this GPU, the peer or the "
        "switch in between.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(
        79,
        "fallen off the bus",
        "The driver can no longer reach the GPU over PCIe (link, power or thermal failure).",
        "hardware",
        "critical",
        "reboot",
    ),
    _x(
        80,
        "push-buffer CRC mismatch",
        "Data sent to the GPU arrived corrupted.",
        "hardware",
        "warning",
        "restart_app",
    ),
    _x(
        92,
        "high single-bit ECC rate",
        "Correctable ECC errors arrive at a high rate: memory is degrading.",
        "hardware",
        "warning",
        "none",
    ),
    _x(
        93,
        "InfoROM wear limit",
        "The InfoROM exceeded its provisioned erase count.",
        "hardware",
        "warning",
        "none",
    ),
    _x(
        94,
        "contained memory error",
        "An uncorrectable memory error was contained to the program that touched "
        "it; other work on the GPU continues.",
        "hardware",
        "warning",
        "restart_app",
    ),
    _x(
        95,
        "uncontained memory error",
        "An uncorrectable memory error could not be contained; all work on the GPU is affected.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(
        109,
        "context switch timeout",
        "A context switch did not finish in time.",
        "driver",
        "critical",
        "reset_gpu",
    ),
    _x(110, "security fault", "The GPU raised a security fault.", "driver", "critical", "reset_gpu"),
    _x(
        119,
        "GSP RPC timeout",
        "The GPU System Processor did not answer a driver request; the process named "
        "in the line is usually just the caller that noticed.",
        "driver",
        "critical",
        "reset_gpu",
    ),
    _x(
        120,
        "GSP error",
        "The GPU System Processor firmware raised an exception.",
        "driver",
        "critical",
        "reset_gpu",
    ),
    _x(
        121,
        "C2C link error",
        "Error on the chip-to-chip link of a Grace superchip.",
        "hardware",
        "warning",
        "none",
    ),
    _x(
        122,
        "SPI PMU read failure",
        "Reading from the PMU over SPI failed.",
        "hardware",
        "warning",
        "reset_gpu",
    ),
    _x(
        123,
        "SPI PMU write failure",
        "Writing to the PMU over SPI failed.",
        "hardware",
        "warning",
        "reset_gpu",
    ),
    _x(
        136, "NVLink training failure", "An NVLink link failed to train.", "hardware", "critical", "reset_gpu"
    ),
    _x(
        137,
        "NVLink privilege error",
        "NVLink privilege error, usually a side effect of another fabric event.",
        "hardware",
        "warning",
        "none",
    ),
    _x(
        140,
        "ECC error escaped",
        "An ECC error escaped correction and containment.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(143, "GPU init error", "The GPU failed to initialise.", "hardware", "critical", "reset_gpu"),
    _x(
        144,
        "NVLink SAW error",
        "NVLink5 SAW unit error; the line says whether it was fatal.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(
        145,
        "NVLink RLW error",
        "NVLink5 RLW unit error; the line says whether it was fatal.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(
        146,
        "NVLink TLW error",
        "NVLink5 TLW unit error; the line says whether it was fatal.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(
        147,
        "NVLink TREX error",
        "NVLink5 TREX unit error; the line says whether it was fatal.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(
        148,
        "NVLink NVLPW error",
        "NVLink5 power/control unit error; the line says whether it was fatal.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(
        149,
        "NVLink NETIR error",
        "NVLink5 network interface event (link down, bit-error rate); the line says whether it was fatal.",
        "hardware",
        "critical",
        "reset_gpu",
    ),
    _x(
        150,
        "NVLink MSE error",
        "The NVLink5 management engine watchdog fired.",
        "driver",
        "critical",
        "reset_gpu",
    ),
    _x(
        154,
        "recovery action changed",
        "The driver states which recovery the GPU now needs; the action is printed in the line.",
        "driver",
        "critical",
        "reset_gpu",
    ),
    _x(155, "NVLink software error", "Software-defined NVLink error.", "driver", "critical", "reset_gpu"),
    _x(
        156,
        "resource retirement event",
        "A hardware resource was retired and needs a reset to take effect.",
        "hardware",
        "warning",
        "reset_gpu",
    ),
    _x(
        157,
        "resource retirement failure",
        "A hardware resource could not be retired.",
        "hardware",
        "critical",
        "rma",
    ),
    _x(158, "GPU fatal timeout", "The GPU hit a fatal timeout.", "hardware", "critical", "reset_gpu"),
)

#: NVIDIA's immediate-action bucket → (severity, action, cause) for codes without a hand-written entry.
#: Any Xid is at least a warning (the driver saw something go wrong); buckets that take the GPU or the node
#: out of service are critical.
_BUCKETS: Final[dict[str, tuple[Severity, Action, Cause]]] = {
    "IGNORE": ("warning", "none", "driver"),
    "RESTART_APP": ("warning", "restart_app", "driver"),
    "RESET_GPU": ("critical", "reset_gpu", "hardware"),
    "RESTART_BM": ("critical", "reboot", "hardware"),
    "RESTART_VM": ("critical", "reboot", "driver"),
    "CHECK_MECHANICALS": ("critical", "rma", "hardware"),
    "CHECK_UVM": ("warning", "reboot", "driver"),
    "UPDATE_SWFW": ("warning", "none", "driver"),
    "XID_154": ("critical", "reset_gpu", "driver"),
    "WORKFLOW_XID_45": ("warning", "none", "application"),
    "WORKFLOW_XID_48": ("critical", "reset_gpu", "hardware"),
    "WORKFLOW_NVLINK_ERR": ("critical", "reset_gpu", "hardware"),
    "WORKFLOW_NVLINK5_ERR": ("critical", "reset_gpu", "hardware"),
    "CONTACT_SUPPORT": ("critical", "reset_gpu", "hardware"),
    "": ("warning", "none", "driver"),
}


def _from_nvidia(code: int, mnemonic: str, description: str, bucket: str) -> XidInfo:
    severity, action, cause = _BUCKETS.get(bucket, ("warning", "none", "driver"))
    if description.lower().startswith("unused"):
        # NVIDIA no longer emits it on current GPUs: report it, but do not take the GPU out of service
        severity, action = "warning", "none"
    name = mnemonic.lower().replace("_", " ")
    return _x(code, name, f"{description} (NVIDIA bucket {bucket or 'none'})", cause, severity, action)


XID_TABLE: Final[dict[int, XidInfo]] = {
    **{row[0]: _from_nvidia(*row) for row in NVIDIA_XIDS},
    **{info.code: info for info in _TABLE},  # our own wording and policy win where we have written one
}


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
