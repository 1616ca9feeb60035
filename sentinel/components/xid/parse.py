"""Parser for NVIDIA kernel-driver Xid lines (``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., ...``).

The line can arrive behind any prefix (dmesg, ``dmesg -T``, syslog, journald, a health agent quoting it),
with or without ``PCI:``, with a MIG ``GPU-I:`` tag, with ``pid=``/``name=`` in their several forms and
process names that contain ``:`` or ``[]``. The parser anchors on the ``Xid (...)`` token itself, so
numbers in host names, IP addresses or timestamps in the prefix are never read as the code, and a
``caused by previous Xid N`` tail is kept apart from the code of the line. NVSwitch ``SXid`` lines are a
different record type (:class:`SXidRecord`); they are never an Xid.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from sentinel.components.bounds import Short
from sentinel.components.vocab import Action, Severity
from sentinel.components.xid.buckets import resolve
from sentinel.components.xid.catalog import xid_info
from sentinel.components.xid.sxid import sxid_fatal
from sentinel.text import bounded, clip, normalize_pci, parse_int

#: Code NVIDIA uses for "GPU has fallen off the bus"; newer drivers print that text without a number.
XID_FALLEN_OFF_BUS: Final = 79

_XID_RE: Final = re.compile(
    r"(?<![A-Za-z])Xid \((?P<pci>[^()\n]{0,80})\):?[ \t]*(?P<code>\d{1,6})(?!\d)(?P<rest>.*)"
)
_SXID_RE: Final = re.compile(r"SXid \((?P<pci>[^()\n]{0,80})\):?[ \t]*(?P<code>\d{1,6})(?!\d)(?P<rest>.*)")
_REST_RE: Final = re.compile(
    r"^[,:]?[ \t]*(?:pid=(?P<pid>\d{1,10}|'?<unknown>'?|\S{0,32}?),[ \t]*)?"
    r"(?:name=(?P<name>[^\n]{0,128}?)(?:,[ \t]+|$))?(?P<msg>.*)$"
)
_PREVIOUS_RE: Final = re.compile(r"caused by previous Xid (\d{1,6})")
_GPU_INSTANCE_RE: Final = re.compile(r"GPU-I:[ \t]*(\d{1,4})")
_FALLEN_RE: Final = re.compile(r"fallen off the bus", re.IGNORECASE)


class XidRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU Xid event as the kernel printed it."""

    xid: int
    #: ``dddd:bb:dd`` lower case; ``None`` when absent or redacted.
    pci_bus: Short | None
    pid: int | None = None
    process: Short | None = None
    #: Text after the code, pid and name (the driver's own description).
    message: Short = ""
    #: ``caused by previous Xid N``: this line is the consequence of an earlier Xid.
    previous_xid: int | None = None
    #: MIG GPU instance (``GPU-I:NN``) when the line names one.
    gpu_instance: int | None = None
    severity: Severity = "warning"
    action: Action = "none"
    #: True when this single event takes the GPU out of service (catalog + what the line itself says).
    fatal: bool = False


class SXidRecord(msgspec.Struct, frozen=True, kw_only=True):
    """An NVSwitch ``SXid`` event: a switch problem, never a GPU Xid."""

    sxid: int
    pci_bus: str | None
    fatal: bool | None
    message: str = ""


def parse_xid(line: str) -> XidRecord | None:
    """Parse a GPU Xid line (or an un-numbered "fallen off the bus" line, which is Xid 79).

    Returns ``None`` for anything else, including NVSwitch ``SXid`` lines.
    """
    text = bounded(line)
    if "Xid" in text:
        match = _XID_RE.search(text)
        if match is not None:
            return _from_match(match)
    if ("bus" in text or "BUS" in text) and _FALLEN_RE.search(text) is not None and "GPU" in text:
        start = text.find("NVRM")
        pci = normalize_pci(text[start:] if start >= 0 else text)
        return _with_severity(
            XidRecord(xid=XID_FALLEN_OFF_BUS, pci_bus=pci, message=clip(text[max(start, 0) :]))
        )
    return None


def parse_sxid(line: str) -> SXidRecord | None:
    """Parse an NVSwitch ``SXid (PCI:...): N, Fatal|Non-fatal, ...`` line."""
    text = bounded(line)
    if "SXid" not in text:
        return None
    match = _SXID_RE.search(text)
    if match is None:
        return None
    code = parse_int(match.group("code"))
    if code is None:
        return None
    rest = match.group("rest").lstrip(", ")
    fatal = sxid_fatal(code, rest)
    return SXidRecord(sxid=code, pci_bus=normalize_pci(match.group("pci")), fatal=fatal, message=clip(rest))


def _from_match(match: re.Match[str]) -> XidRecord | None:
    code = parse_int(match.group("code"))
    if code is None:
        return None
    pci_text = match.group("pci")
    rest = match.group("rest")
    parts = _REST_RE.match(rest)
    pid: int | None = None
    process: str | None = None
    message = rest
    if parts is not None:
        pid = parse_int(parts.group("pid")) if parts.group("pid") else None
        name = parts.group("name")
        if name and name.strip("'<> ").lower() != "unknown":
            process = name.strip()
        message = parts.group("msg")
    previous = _PREVIOUS_RE.search(rest)
    instance = _GPU_INSTANCE_RE.search(pci_text) or _GPU_INSTANCE_RE.search(rest)
    record = XidRecord(
        xid=code,
        pci_bus=normalize_pci(pci_text),
        pid=pid,
        process=process,
        message=clip(message.strip()),
        previous_xid=parse_int(previous.group(1)) if previous else None,
        gpu_instance=parse_int(instance.group(1)) if instance else None,
    )
    return _with_severity(record)


def _with_severity(record: XidRecord) -> XidRecord:
    """Fill severity/action/fatal from the bucket table, refined by what the line itself says (NVLink5
    decode, Xid 154's recovery value, Xid 94's ``RST: Yes``)."""
    info = xid_info(record.xid)
    resolution = resolve(record.xid, record.message)
    fatal = resolution.severity == "critical" and info.cause != "application"
    return msgspec.structs.replace(
        record, severity=resolution.severity, action=resolution.action, fatal=fatal
    )


def xid_record(code: int, text: str = "", pci_bus: str | None = None) -> XidRecord:
    """The record of one occurrence of Xid ``code``: the kernel line's parse when ``text`` is that line,
    else the catalog's entry (an NVML-only report carries nothing more than the code).

    This is the agent's one classification of an Xid; the aggregator judges the record as sent.
    """
    parsed = parse_xid(text) if "Xid" in text else None
    if parsed is not None and parsed.xid == code:
        return (
            parsed if pci_bus is None or parsed.pci_bus else msgspec.structs.replace(parsed, pci_bus=pci_bus)
        )
    info = xid_info(code)
    return XidRecord(
        xid=code, pci_bus=pci_bus, severity=info.severity, action=info.action, fatal=info.faulty_at_once
    )


def xid_severity(code: int, text: str = "") -> Severity:
    """The severity of one occurrence: the catalog's, refined by the kernel line when ``text`` is one."""
    return xid_record(code, text).severity
