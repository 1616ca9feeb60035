"""Small text helpers shared by the signal parsers.

Everything here is pure and bounded: regexes have no nested quantifiers, numbers are parsed with a length
limit, and nothing reads a clock or a file.
"""

from __future__ import annotations

import re
from typing import Final

#: Longest text one parser call looks at. Longer input is truncated first, so a single pathological line
#: (a binary blob, a minified JSON dump) costs bounded time.
MAX_TEXT: Final = 16_384

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_UINT64_MAX: Final = (1 << 64) - 1

# A PCI address as printed by the kernel, NVRM, nvidia-smi and NCCL: optional domain (4 or 8 hex digits),
# bus, device, optional function. Hex digits only, so "0x22:0x56:894" is not an address.
_BDF_RE: Final = re.compile(
    r"(?<![0-9A-Za-z:])(?:([0-9A-Fa-f]{8}|[0-9A-Fa-f]{4}):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})(?:\.[0-7])?(?![0-9A-Za-z]|:[0-9A-Za-z])"
)


# ``PCI:`` before an address, also as OCR misreads it (``PCl:``, ``PC1:``).
_PCI_TAG_RE: Final = re.compile(r"PC[Il1|]:")


def bounded(text: str) -> str:
    """Cut ``text`` to :data:`MAX_TEXT` characters so every regex runs in bounded time."""
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT]


def parse_int(digits: str | None) -> int | None:
    """Parse a printed integer into something every JSON consumer can hold (int64).

    Logs print uint64 values such as ``NumelIn=18446744073709551615`` (a ``-1`` stored unsigned); those are
    read back as the signed value they came from. Anything beyond 64 bits (OCR noise, glued digits) is
    ``None`` rather than a huge number that breaks downstream encoders.
    """
    if digits is None:
        return None
    text = digits.strip()
    if not text or len(text) > 21:
        return None
    try:
        value = int(text, 10)
    except ValueError:
        return None
    if _INT64_MIN <= value <= _INT64_MAX:
        return value
    if _INT64_MAX < value <= _UINT64_MAX:
        return value - (1 << 64)
    return None


def normalize_pci(text: str | None) -> str | None:
    """Return the ``dddd:bb:dd`` form (lower case, no function) of the first PCI address in ``text``.

    ``None`` when there is no address, e.g. a user redacted it as ``PCI:...``.
    """
    if not text:
        return None
    match = _BDF_RE.search(_PCI_TAG_RE.sub("PCI ", text) if "PC" in text else text)
    if match is None:
        return None
    domain, bus, device = match.group(1), match.group(2), match.group(3)
    domain = "0000" if domain is None else domain[-4:]
    return f"{domain}:{bus}:{device}".lower()


def pci_from_nccl_busid(busid: str | None) -> str | None:
    """Turn NCCL's integer bus id (``busId 9b000``) into ``0000:9b:00``.

    NCCL prints the PCI address with its punctuation removed, as hex: domain, bus (2), device (2),
    function (1). Leading zeros of the domain are dropped, so ``109b000`` is domain ``0001``.
    """
    if not busid:
        return None
    digits = busid.lower()
    if digits.startswith("0x"):
        digits = digits[2:]
    if not digits or len(digits) > 13 or any(c not in "0123456789abcdef" for c in digits):
        return None
    digits = digits.rjust(9, "0")
    domain = digits[:-5][-4:].rjust(4, "0")
    return f"{domain}:{digits[-5:-3]}:{digits[-3:-1]}"


def clip(text: str, limit: int = 300) -> str:
    """A one-line excerpt for evidence and ``message`` fields."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
