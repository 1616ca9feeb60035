"""Kernel-log lines around the GPU that are not Xids: NVSwitch SXids, other NVRM messages, PCIe link
training, InfiniBand HCA events, hung tasks, nvidia-peermem and UCX crashes.

These become ``kind: other`` events. Their severity tells the agent whether the line is worth waking
someone for: an NVRM "RmInitAdapter failed" or "PMU has halted" is critical even without an Xid number,
while "GSP RPC buffer contains function ..." is just detail.
"""

from __future__ import annotations

import re
from typing import Final

from sentinel.components.ecc import rule as ecc_rule
from sentinel.components.ib.hca import hca_condition
from sentinel.components.vocab import Severity
from sentinel.components.xid.parse import parse_sxid
from sentinel.components.xid.sxid import judge_sxid, sxid_fatal
from sentinel.signals.record import Classified, finding_event, make_event
from sentinel.text import bounded, clip, normalize_pci, parse_int

_NVRM_RE: Final = re.compile(r"\bNVRM: ?(?P<msg>.*)")
_NVRM_BAD_WORDS: Final = (
    "fail",
    "error",
    "halt",
    "reset",
    "assert",
    "exception",
    "fault",
    "timeout",
    "timed out",
    "unable",
    "cannot",
    "lost",
    "hang",
    "not supported",
    "not responding",
    "unresponsive",
    "mismatch",
    "corrupt",
)
#: Of the NVRM failures, those that leave the GPU unable to go on (the README's "GPU initialisation,
#: firmware ... failures"): its init or probe, a client/kernel-module version mismatch, an assertion, the
#: GSP/PMU firmware halting or missing its heartbeat, a reset being required, the GPU lost, its memory. Any other NVRM failure (a register read,
#: an NVLink peer query that failed) is something wrong the GPU works on with: a warning.
_NVRM_FATAL_WORDS: Final = (
    "initadapter",
    "init_adapter",
    "initializ",
    "probe",
    "attach",
    "mismatch",
    "assert",
    "halt",
    "reset",
    "gsp",
    "firmware",
    "heartbeat",
    "lost",
    "fallen",
    "hang",
    "timeout",
    "timed out",
    "not responding",
    "unresponsive",
    "corrupt",
    "memory",
    "fatal",
)
_NON_FATAL_RE: Final = re.compile(r"\bnon[- ]?fatal\b")
_PCIE_BW_RE: Final = re.compile(
    r"(?P<dev>\S{1,40}) (?P<bdf>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): [\d.]{1,10} Gb/s available PCIe "
    r"bandwidth, limited by [\d.]{1,8} GT/s PCIe x(?P<width>\d{1,2}) link.{0,80}?capable of [\d.]{1,10} Gb/s with "
    r"[\d.]{1,8} GT/s PCIe x(?P<cap>\d{1,2}) link"
)
_MLX_DOWN_RE: Final = re.compile(r"mlx5\w{0,20}.{0,120}?(?:Link DOWN|link down)")
_HUNG_TASK_RE: Final = re.compile(r"\btask \S{1,80} blocked for more than \d{1,6} seconds")
_PEERMEM_RE: Final = re.compile(r"(?:nvidia-peermem|nv_peer_mem)\b.{0,200}?\bERROR\b")
_SIGNAL_RE: Final = re.compile(
    r"Caught signal \d{1,3} \(|Segmentation fault|Bus error \(|core dumped|segfault at |general protection fault"
)
# nvidia-smi / NVML failures: the driver lost the GPU or cannot talk to it.
_SMI_ERROR_RE: Final = re.compile(
    r"Unable to (?:determine|detect) the device handle for GPU ?(?P<bdf>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})?|"
    r"Failed to initialize NVML|NVIDIA-SMI has failed|GPU is lost|GPU_IS_LOST\b|No devices were found"
)
#: nvidia-smi's default table, a GPU's first row as its cells read (``0  NVIDIA A100 ...  Off |
#: 00000000:01:00.0  On | N/A``): index, name, persistence | bus id, display | volatile uncorrected ECC.
_SMI_GPU_ROW_RE: Final = re.compile(
    r"^\s{0,4}\d{1,3}\s{1,8}\S[^|\n]{0,80}?\s(?:On|Off) \| (?P<bdf>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])"
    r"\s{1,8}(?:On|Off) \| (?P<ecc>N/A|\d{1,10})\s{0,4}$"
)
#: nvidia-persistenced naming the GPU it (un)registers: ``nvidia-persistenced[19176]: device 0000:3d:00.0 -
#: registered``.
_PERSISTENCED_DEVICE_RE: Final = re.compile(
    r"nvidia-persistenced(?:\[\d{1,10}\])?: device (?P<bdf>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]) - "
)
_HOST_TROUBLE: Final[tuple[tuple[str, Severity, str], ...]] = (
    ("Out of memory: Killed process", "critical", "host_oom_kill"),
    ("invoked oom-killer", "critical", "host_oom_kill"),
    ("soft lockup", "warning", "cpu_lockup"),
    ("hard LOCKUP", "critical", "cpu_lockup"),
    ("detected stalls", "warning", "rcu_stall"),
    # kernel/irq/spurious.c: an interrupt line nobody handles is disabled (a device misbehaving).
    (": nobody cared", "warning", "irq_disabled"),
)
_HW_ERROR_FATAL_RE: Final = re.compile(r"[Uu]ncorrected|[Ff]atal")
#: A machine-check record the hardware already corrected (``Error Status: Corrected error, no action
#: required.``): counted, nothing to do.
_HW_ERROR_CORRECTED_RE: Final = re.compile(r"(?<![Uu]n)[Cc]orrected error|no action required")
#: The kernel's EDAC memory-controller count of host DRAM errors: ``EDAC MC3: 1 UE memory read error``
#: (uncorrected) or ``... 3 CE memory read error`` (corrected). Host memory, not a GPU's.
_EDAC_COUNT_RE: Final = re.compile(r"\bEDAC\b[^:\n]{0,40}: \d{1,9} (?P<kind>UE|CE) ")
_IB_ERROR_RE: Final = re.compile(r"WC error|CQE error|syndrome 0x|transport retry counter exceeded")
_GPU_DEVICES: Final = ("pci", "nvidia")
#: An AER error message, in the kernel's older (``Corrected error received: 0000:3b:00.0``) and newer
#: (``Correctable error message received from 0000:00:00.0``) spellings.
_AER_RE: Final = re.compile(
    r"AER: (?P<what>Multiple |)(?P<kind>Correct(?:ed|able)|Uncorrect(?:ed|able) \((?:Non-)?Fatal\)) error(?:s)? "
    r"(?:message )?received(?:: | from )(?P<src>\S{7,20})"
)
_AER_SEVERITY_RE: Final = re.compile(
    r"severity=(?P<kind>Correct(?:ed|able)|Uncorrect(?:ed|able) \((?:Non-)?Fatal\)|Uncorrectable)"
)
#: The AER driver giving up on a device: no driver callback, or recovery of the link below a port failed.
_AER_UNRECOVERED_RE: Final = re.compile(r"AER: (?:can't recover|device recovery failed)")
#: The AER driver resetting a link to recover: a link re-initialising.
_AER_LINK_RESET_RE: Final = re.compile(r"AER: [\w ]{0,40}link has been reset")
#: One status bit of an AER error's detail lines (``pcieport 0000:00:03.0:    [14] CmpltTO  (First)``): the
#: error itself, and its severity, are on the line before.
_AER_BIT_RE: Final = re.compile(r"\.[0-7]: {2,12}\[ ?\d{1,2}\] [A-Za-z]")
_DEVICE_PREFIX_RE: Final = re.compile(
    r"(?:^|[\s\]])(?P<dev>nvidia|pci|pcieport) (?P<bdf>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): "
)
_FABRIC_RE: Final = re.compile(
    r"NVSwitch (?P<kind>non[- ]?fatal|fatal) error (?P<code>\d{1,6})(?P<rest>.{0,120}?)pci bus id (?P<bdf>[0-9A-Fa-f:.]{7,20})",
    re.IGNORECASE,
)


def _aer_events(text: str) -> list[Classified]:
    """PCIe Advanced Error Reporting: fatal uncorrected errors take a GPU off the bus.

    Only a GPU's address is recorded: the device an error message names as its source when it is
    downstream of the reporting port (a port's own address, or one on its bus or before it, is the root
    complex side, not a GPU), or the device that reports a severity or a failed recovery itself when it is
    not a port (a root port or a bridge is not a GPU; a USB or audio function is not in the prefixes).
    """
    device = _DEVICE_PREFIX_RE.search(text)
    own = (
        normalize_pci(device.group("bdf"))
        if device is not None and device.group("dev") != "pcieport"
        else None
    )
    if _AER_UNRECOVERED_RE.search(text) is not None:
        return [
            make_event("other", "critical", pci_bus=own, reason="pcie_aer_unrecovered", message=clip(text))
        ]
    if _AER_LINK_RESET_RE.search(text) is not None:
        return [make_event("other", "warning", pci_bus=own, reason="pcie_aer_link_reset", message=clip(text))]
    aer = _AER_RE.search(text)
    if aer is not None:
        kind, pci = aer.group("kind"), normalize_pci(aer.group("src"))
        if device is not None and device.group("dev") == "pcieport" and pci is not None:
            port = normalize_pci(device.group("bdf")) or ""
            if pci[:4] == port[:4] and pci[5:7] <= port[5:7]:
                pci = None
    else:
        level = _AER_SEVERITY_RE.search(text)
        if level is None:
            return []
        kind, pci = level.group("kind"), own
    severity: Severity = (
        "info" if kind.startswith("Correct") else "warning" if "Non-Fatal" in kind else "critical"
    )
    return [make_event("other", severity, pci_bus=pci, reason="pcie_aer", message=clip(text))]


def _aer_detail_events(text: str) -> list[Classified]:
    """One status bit of an AER error's detail block: the error is on the line before, so a warning."""
    device = _DEVICE_PREFIX_RE.search(text)
    if device is None or _AER_BIT_RE.match(text, device.end() - 4) is None:
        return []
    pci = normalize_pci(device.group("bdf")) if device.group("dev") != "pcieport" else None
    return [make_event("other", "warning", pci_bus=pci, reason="pcie_aer_detail", message=clip(text))]


def _gpu_tool_events(text: str) -> list[Classified]:
    """GPU daemons and nvidia-smi naming a GPU by its address: nvidia-smi's table row (whose volatile
    uncorrected-ECC cell counts uncorrectable memory errors since the driver loaded) and
    nvidia-persistenced registering a device."""
    row = _SMI_GPU_ROW_RE.search(text) if "On | " in text or "Off | " in text else None
    if row is not None:
        pci = normalize_pci(row.group("bdf"))
        ecc = parse_int(row.group("ecc")) if row.group("ecc") != "N/A" else None
        if ecc:
            return [finding_event("ecc", ecc_rule.REPORTED_UNCORRECTABLE, pci_bus=pci, message=clip(text))]
        return [make_event("other", "info", pci_bus=pci, reason="nvsmi_gpu_row")]
    device = _PERSISTENCED_DEVICE_RE.search(text) if "persistenced" in text else None
    if device is not None:
        return [
            make_event(
                "other", "info", pci_bus=normalize_pci(device.group("bdf")), reason="persistenced_device"
            )
        ]
    return []


def _maybe_crash(text: str) -> bool:
    return "signal" in text or "fault" in text or "Bus error" in text or "core dumped" in text


def kernel_events(text: str) -> list[Classified]:
    """Non-Xid kernel and crash events in one line (SXid, NVRM, PCIe, IB HCA, hung tasks, signals)."""
    text = bounded(text)
    events: list[Classified] = []
    if "SXid" in text:
        sxid = parse_sxid(text)
        if sxid is not None:
            judged = judge_sxid(sxid.sxid, sxid.message)
            events.append(
                make_event(
                    "other",
                    judged.severity,
                    pci_bus=sxid.pci_bus,
                    sxid=sxid.sxid,
                    reason=judged.reason,
                    action=judged.action,
                    message=sxid.message,
                )
            )
            return events
    if "NVRM" in text:
        nvrm = _NVRM_RE.search(text)
        if nvrm is not None and "Xid" not in nvrm.group("msg")[:12]:
            msg = nvrm.group("msg")
            lowered = msg.lower()
            bad = any(word in lowered for word in _NVRM_BAD_WORDS)
            dump = "crash dump" in lowered
            # "A GPU crash dump has been created": the driver saved the state of a failure it reported
            # on another line (an Xid), so this line is the follow-up, not the failure. A failure the
            # driver calls "non-fatal" is one the GPU works on through.
            graded = _NON_FATAL_RE.sub(" ", lowered) if "fatal" in lowered else lowered
            fatal = bad and any(word in graded for word in _NVRM_FATAL_WORDS)
            nvrm_severity: Severity = "critical" if fatal else "warning" if bad or dump else "info"
            events.append(
                make_event(
                    "other",
                    nvrm_severity,
                    pci_bus=normalize_pci(msg),
                    reason="nvrm_error"
                    if fatal
                    else "nvrm_failure"
                    if bad
                    else "nvrm_crash_dump"
                    if dump
                    else "nvrm_info",
                    message=clip(msg),
                )
            )
    if "PCIe" in text:
        pcie = _PCIE_BW_RE.search(text)
        if pcie is not None:
            degraded = int(pcie.group("width")) < int(pcie.group("cap"))
            device = pcie.group("dev").lower()
            pci = normalize_pci(pcie.group("bdf")) if device in _GPU_DEVICES else None
            events.append(
                make_event(
                    "other",
                    "warning" if degraded else "info",
                    pci_bus=pci,
                    reason="pcie_link_degraded" if degraded else "pcie_link_info",
                    message=clip(text),
                )
            )
    if "mlx5_core" in text or "mlx5_port" in text or "Cable" in text or "module event" in text:
        hca = hca_condition(text)
        if hca is not None:
            events.append(make_event("other", hca.severity, reason=hca.reason, message=clip(text)))
        elif ("Link DOWN" in text or "link down" in text) and _MLX_DOWN_RE.search(text) is not None:
            events.append(make_event("other", "warning", reason="ib_link_down", message=clip(text)))
        else:
            events.append(make_event("other", "info", reason="ib_port_info"))
    if "AER" in text or "Bus Error: severity=" in text:
        events.extend(_aer_events(text))
    elif "] " in text and ("pcieport " in text or "nvidia " in text or "pci " in text):
        events.extend(_aer_detail_events(text))
    if "NVSwitch" in text and "rror" in text:
        fabric = _FABRIC_RE.search(text)
        if fabric is not None:
            # The fabric manager's report of an SXid: the SXid table decides, as for the kernel's line.
            code = int(fabric.group("code"))
            word = "Fatal" if fabric.group("kind").lower() == "fatal" else "Non-fatal"
            fatal = sxid_fatal(code, f"{word},{fabric.group('rest')}") is not False
            events.append(
                make_event(
                    "other",
                    "critical" if fatal else "warning",
                    sxid=code,
                    pci_bus=normalize_pci(fabric.group("bdf")),
                    reason="nvswitch_fatal" if fatal else "nvswitch_nonfatal",
                    message=clip(text),
                )
            )
    if not events and ("nvidia " in text or "pci " in text):
        device = _DEVICE_PREFIX_RE.search(text)
        if device is not None and device.group("dev") != "pcieport":
            events.append(
                make_event("other", "info", pci_bus=normalize_pci(device.group("bdf")), reason="pci_device")
            )
    if not events and (" | " in text or "persistenced" in text):
        events.extend(_gpu_tool_events(text))
    if "blocked for more than" in text and _HUNG_TASK_RE.search(text) is not None:
        events.append(make_event("other", "warning", reason="hung_task", message=clip(text)))
    if (
        "NVML" in text or "GPU" in text or "NVIDIA-SMI" in text or "devices were found" in text
    ) and not events:
        smi = _SMI_ERROR_RE.search(text)
        if smi is not None:
            bdf = smi.group("bdf")
            events.append(
                make_event(
                    "other",
                    "critical",
                    pci_bus=normalize_pci(bdf) if bdf else None,
                    reason="nvml_error",
                    message=clip(text),
                )
            )
    for needle, severity, reason in _HOST_TROUBLE:
        if needle in text:
            events.append(make_event("other", severity, reason=reason, message=clip(text)))
            break
    if "[Hardware Error]" in text:
        hw_severity: Severity = (
            "critical"
            if _HW_ERROR_FATAL_RE.search(text)
            else "info"
            if _HW_ERROR_CORRECTED_RE.search(text)
            else "warning"
        )
        events.append(make_event("other", hw_severity, reason="machine_check", message=clip(text)))
    if "EDAC" in text:
        edac = _EDAC_COUNT_RE.search(text)
        if edac is not None:
            uncorrected = edac.group("kind") == "UE"
            events.append(
                make_event(
                    "other",
                    "critical" if uncorrected else "info",
                    reason="host_memory_uncorrected" if uncorrected else "host_memory_corrected",
                    message=clip(text),
                )
            )
    if ("mlx5" in text or "infiniband" in text) and _IB_ERROR_RE.search(text) is not None:
        events.append(make_event("other", "critical", reason="ib_completion_error", message=clip(text)))
    if "peer" in text and _PEERMEM_RE.search(text) is not None:
        events.append(make_event("other", "warning", reason="peermem_error", message=clip(text)))
    if _maybe_crash(text) and _SIGNAL_RE.search(text) is not None:
        events.append(make_event("other", "critical", reason="process_crash", message=clip(text)))
    return events
