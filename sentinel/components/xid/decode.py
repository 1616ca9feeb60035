"""Decoders for what the driver prints after some Xid codes: Xid 74's NVLink registers, the NVLink5 (Xid
144-150) IntrInfo/ErrorStatus pair, Xid 154's recovery action.

Pure functions of the line's message (outside input: bounded, never raising). The NVLink5 decode uses
NVIDIA's decode sheet (:data:`~sentinel.components.xid.nvidia.NVLINK5_DECODE`), in both driver generations'
IntrInfo layouts (before R575 and from R575 on); the printed ``Fatal``/``Nonfatal`` word picks between them.
"""

from __future__ import annotations

import re
from typing import Final, Literal

import msgspec

from sentinel.components.xid.nvidia import NVLINK5_DECODE, XID154_RECOVERY

#: Xid 74 error classes from the bits set in the first register (NVIDIA's Xid 74 guidance): ECC/parity
#: (bits 4, 5: likely the board), marginal signal integrity (bits 21, 22: check the link's connections),
#: link hardware (bits 8, 9, 12, 16, 17, 24, 28: check and reseat the link's connections, run diagnostics).
Xid74Class = Literal["ecc_parity", "signal_integrity", "link_hardware", "unclassified"]
_XID74_BITS: Final[tuple[tuple[Xid74Class, frozenset[int]], ...]] = (
    ("ecc_parity", frozenset({4, 5})),
    ("signal_integrity", frozenset({21, 22})),
    ("link_hardware", frozenset({8, 9, 12, 16, 17, 24, 28})),
)
_MAX_REGISTERS: Final = 8
_REGISTERS_RE: Final = re.compile(r"\(\s*(0x[0-9A-Fa-f]{1,8}(?:\s*,?\s*0x[0-9A-Fa-f]{1,8}){0,9})\s*\)")
_HEX_RE: Final = re.compile(r"0x([0-9A-Fa-f]{1,8})")
_LINK74_RE: Final = re.compile(r"\blink\s{0,2}(?P<link>\d{1,3})\s{0,2}\(", re.IGNORECASE)
_LINK5_RE: Final = re.compile(r"\bLink\s{1,2}(?P<link>-?\d{1,3})\b")
_UNIT_RE: Final = re.compile(
    r"^\s*(?P<unit>[A-Z][A-Z0-9_/]{1,40})\s{1,4}(?P<word>Nonfatal|Non-fatal|Fatal)\b"
)
_RECOVERY_RE: Final = re.compile(
    r"(?:from 0x[0-9A-Fa-f]{1,8} \((?P<from_v>[^()]{1,40})\) )?to 0x(?P<to_n>[0-9A-Fa-f]{1,8}) "
    r"\((?P<to_v>[^()]{1,40})\)"
)
_RECOVERY_BY_LOWER: Final = {name.lower(): name for name in XID154_RECOVERY}
_BUCKET_RANK: Final = {"IGNORE": 0, "XID_154_EVAL": 1, "RESET_GPU": 2}


class Xid74Decode(msgspec.Struct, frozen=True, kw_only=True):
    """Xid 74's NVLink registers: which link, which error class, which bits of the first register."""

    link: int | None
    error_class: Xid74Class
    bits: tuple[int, ...]
    registers: tuple[int, ...]


class Nvlink5Decode(msgspec.Struct, frozen=True, kw_only=True):
    """The row of NVIDIA's NVLink5 decode sheet that an Xid 144-150 line selects."""

    code: int
    unit: str
    link: int | None
    intr_info: int
    error_status: int
    #: NVIDIA's immediate bucket for this row: ``IGNORE``, ``RESET_GPU`` or ``XID_154_EVAL``.
    bucket: str
    investigatory: str
    #: NVIDIA's severity column: ``Fatal``, ``Link Fatal``, ``Non-fatal`` (a trailing ``*``/``?`` kept).
    severity: str
    #: ``<R575``, ``>=R575`` or ``any`` (both layouts select the same row).
    driver: str


class Recovery(msgspec.Struct, frozen=True, kw_only=True):
    """Xid 154: the recovery action the GPU needed before and needs now (NVIDIA's value names)."""

    before: str
    after: str
    #: NVML's ``nvmlDeviceGpuRecoveryAction_t`` number as printed.
    value: int


def _registers(message: str) -> tuple[int, ...]:
    match = _REGISTERS_RE.search(message)
    if match is None:
        return ()
    return tuple(int(h, 16) for h in _HEX_RE.findall(match.group(1))[:_MAX_REGISTERS])


def decode_xid74(message: str) -> Xid74Decode | None:
    """Decode ``NVLink: fatal error detected on link 6(0x10000, 0x0, ...)``; ``None`` without registers."""
    registers = _registers(message[:400])
    if not registers:
        return None
    first = registers[0]
    bits = tuple(bit for bit in range(32) if first >> bit & 1)
    error_class: Xid74Class = "unclassified"
    for name, wanted in _XID74_BITS:
        if wanted.intersection(bits):
            error_class = name
            break
    link = _LINK74_RE.search(message[:400])
    return Xid74Decode(
        link=int(link.group("link")) if link else None,
        error_class=error_class,
        bits=bits,
        registers=registers,
    )


def _matches(pattern: str, value: int) -> bool:
    if not pattern:
        return True
    bits = format(value & 0xFFFFFFFF, "032b")
    return len(pattern) == 32 and all(p in ("-", b) for p, b in zip(pattern, bits, strict=True))


def _status_matches(row_status: int, status: int) -> bool:
    return row_status < 0 or status == row_status or (row_status != 0 and status & row_status == row_status)


def _fatal(severity: str) -> bool:
    return "Fatal" in severity and not severity.startswith("Non")


def decode_nvlink5(code: int, message: str) -> Nvlink5Decode | None:
    """The decode-sheet row for an Xid 144-150 line's ``(IntrInfo ErrorStatus ...)``; ``None`` when no row
    matches, or when the printed Fatal/Nonfatal word disagrees with every matching row."""
    text = message[:400]
    registers = _registers(text)
    if len(registers) < 2:
        return None
    intr, status = registers[0], registers[1]
    unit = _UNIT_RE.search(text)
    printed = None if unit is None else unit.group("word") == "Fatal"
    found: dict[tuple[str, str, str, str], set[str]] = {}
    for row in NVLINK5_DECODE:
        row_code, name, v1, v2, row_status, bucket, second_v1, second_v2, second, investigatory, severity = (
            row
        )
        if row_code != code or not _status_matches(row_status, status):
            continue
        for driver, pattern, second_pattern in (("<R575", v1, second_v1), (">=R575", v2, second_v2)):
            if not _matches(pattern, intr):
                continue
            chosen = second if second and second_pattern and _matches(second_pattern, intr) else bucket
            found.setdefault((name, chosen, investigatory, severity), set()).add(driver)
    rows = [key for key in found if printed is None or _fatal(key[3]) == printed]
    if not rows:
        return None
    name, bucket, investigatory, severity = max(rows, key=lambda key: _BUCKET_RANK.get(key[1], 0))
    drivers = found[(name, bucket, investigatory, severity)]
    link = _LINK5_RE.search(text)
    return Nvlink5Decode(
        code=code,
        unit=unit.group("unit") if unit is not None else name,
        link=int(link.group("link")) if link else None,
        intr_info=intr,
        error_status=status,
        bucket=bucket,
        investigatory=investigatory,
        severity=severity,
        driver="any" if len(drivers) > 1 else next(iter(drivers)),
    )


def parse_recovery(message: str) -> Recovery | None:
    """Xid 154's ``GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)``; ``None``
    when the line names no recovery value NVIDIA lists."""
    match = _RECOVERY_RE.search(message[:400])
    if match is None:
        return None
    after = _RECOVERY_BY_LOWER.get(match.group("to_v").strip().lower())
    if after is None:
        return None
    raw = (match.group("from_v") or "").strip()
    before = _RECOVERY_BY_LOWER.get(raw.lower(), raw)
    return Recovery(before=before, after=after, value=int(match.group("to_n"), 16))
