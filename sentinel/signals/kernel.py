"""Kernel-log lines around the GPU that are not Xids: NVSwitch SXids, other NVRM messages, PCIe link
training, InfiniBand HCA events, hung tasks, nvidia-peermem and UCX crashes.

These become ``kind: other`` events. Their severity tells the agent whether the line is worth waking
someone for: an NVRM "RmInitAdapter failed" or "PMU has halted" is critical even without an Xid number,
while "GSP RPC buffer contains function ..." is just detail.
"""

from __future__ import annotations

import re
from typing import Final

from sentinel.components.vocab import Severity
from sentinel.components.xid.parse import parse_sxid
from sentinel.signals.record import Classified, make_event
from sentinel.text import bounded, clip, normalize_pci

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
_PCIE_BW_RE: Final = re.compile(
    r"(?P<dev>\S{1,40}) (?P<bdf>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): [\d.]{1,10} Gb/s available PCIe "
    r"bandwidth, limited by [\d.]{1,8} GT/s PCIe x(?P<width>\d{1,2}) link.{0,80}?capable of [\d.]{1,10} Gb/s with "
    r"[\d.]{1,8} GT/s PCIe x(?P<cap>\d{1,2}) link"
)
_MLX_BAD_RE: Final = re.compile(
    r"Cable error|High Temperature|module event\[error\]|Port module event.{0,40}error"
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
_IB_ERROR_RE: Final = re.compile(r"WC error|CQE error|syndrome 0x|transport retry counter exceeded")
_GPU_DEVICES: Final = ("pci", "nvidia")
_AER_RE: Final = re.compile(
    r"AER: (?P<what>Multiple |)(?P<kind>Corrected|Uncorrected \((?:Non-)?Fatal\)) error(?:s)? received: (?P<src>\S{7,20})"
)
_AER_SEVERITY_RE: Final = re.compile(
    r"severity=(?P<kind>Corrected|Uncorrected \((?:Non-)?Fatal\)|Uncorrectable)"
)
_DEVICE_PREFIX_RE: Final = re.compile(
    r"(?:^|[\s\]])(?P<dev>nvidia|pci|pcieport) (?P<bdf>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]): "
)
_FABRIC_RE: Final = re.compile(
    r"NVSwitch (?P<kind>non-fatal|fatal) error (?P<code>\d{1,6}).{0,120}?pci bus id (?P<bdf>[0-9A-Fa-f:.]{7,20})",
    re.IGNORECASE,
)


def _aer_events(text: str) -> list[Classified]:
    """PCIe Advanced Error Reporting: fatal uncorrected errors take a GPU off the bus."""
    aer = _AER_RE.search(text)
    if aer is not None:
        kind, pci = aer.group("kind"), normalize_pci(aer.group("src"))
    else:
        level = _AER_SEVERITY_RE.search(text)
        if level is None:
            return []
        kind = level.group("kind")
        device = _DEVICE_PREFIX_RE.search(text)
        # A root port's (bridge's) own address is not a GPU's: only a GPU reporting is recorded.
        pci = (
            normalize_pci(device.group("bdf"))
            if device is not None and device.group("dev") != "pcieport"
            else None
        )
    severity: Severity = "info" if kind == "Corrected" else "warning" if "Non-Fatal" in kind else "critical"
    return [make_event("other", severity, pci_bus=pci, reason="pcie_aer", message=clip(text))]


def _maybe_crash(text: str) -> bool:
    return "signal" in text or "fault" in text or "Bus error" in text or "core dumped" in text


def kernel_events(text: str) -> list[Classified]:
    """Non-Xid kernel and crash events in one line (SXid, NVRM, PCIe, IB HCA, hung tasks, signals)."""
    text = bounded(text)
    events: list[Classified] = []
    if "SXid" in text:
        sxid = parse_sxid(text)
        if sxid is not None:
            severity: Severity = "warning" if sxid.fatal is False else "critical"
            events.append(
                make_event(
                    "other",
                    severity,
                    pci_bus=sxid.pci_bus,
                    sxid=sxid.sxid,
                    reason=f"sxid_{sxid.sxid}",
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
            # on another line (an Xid), so this line is the follow-up, not the failure.
            nvrm_severity: Severity = "critical" if bad else "warning" if dump else "info"
            events.append(
                make_event(
                    "other",
                    nvrm_severity,
                    pci_bus=normalize_pci(msg),
                    reason="nvrm_error" if bad else "nvrm_crash_dump" if dump else "nvrm_info",
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
        if _MLX_BAD_RE.search(text) is not None:
            events.append(make_event("other", "critical", reason="ib_port_hardware", message=clip(text)))
        elif ("Link DOWN" in text or "link down" in text) and _MLX_DOWN_RE.search(text) is not None:
            events.append(make_event("other", "warning", reason="ib_link_down", message=clip(text)))
        else:
            events.append(make_event("other", "info", reason="ib_port_info"))
    if "AER" in text:
        events.extend(_aer_events(text))
    if "NVSwitch" in text and "rror" in text:
        fabric = _FABRIC_RE.search(text)
        if fabric is not None:
            fatal = fabric.group("kind").lower() == "fatal"
            events.append(
                make_event(
                    "other",
                    "critical" if fatal else "warning",
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
        hw_severity: Severity = "critical" if _HW_ERROR_FATAL_RE.search(text) else "warning"
        events.append(make_event("other", hw_severity, reason="machine_check", message=clip(text)))
    if ("mlx5" in text or "infiniband" in text) and _IB_ERROR_RE.search(text) is not None:
        events.append(make_event("other", "critical", reason="ib_completion_error", message=clip(text)))
    if "peer" in text and _PEERMEM_RE.search(text) is not None:
        events.append(make_event("other", "warning", reason="peermem_error", message=clip(text)))
    if _maybe_crash(text) and _SIGNAL_RE.search(text) is not None:
        events.append(make_event("other", "critical", reason="process_crash", message=clip(text)))
    return events
