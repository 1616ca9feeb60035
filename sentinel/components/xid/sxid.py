"""Which NVSwitch SXids are fatal: the line's own word first, then the severity number of the driver's
continuation line, then NVIDIA's list of non-fatal SXids (Fabric Manager user guide, "Non-Fatal NVSwitch
SXid Errors" and the notable ones it says can be ignored).

A fatal SXid stops the NVLink traffic through that switch port (NVIDIA: the GPUs behind it see Xid 74 or
45); a non-fatal one is corrected or retried by the hardware and work goes on.
"""

from __future__ import annotations

import re
from typing import Final

#: SXids NVIDIA lists as non-fatal: single-bit ECC errors the switch corrects, TX replays, and the
#: Minion DLREQ interrupt NVIDIA says can be ignored.
NON_FATAL_SXIDS: Final = frozenset(
    {
        11004,
        11012,
        11021,
        11022,
        11023,
        12021,
        12023,
        15008,
        15011,
        19049,
        19055,
        19057,
        19059,
        19062,
        19065,
        19068,
        19071,
        20001,
        22013,
        24001,
        24002,
        24003,
    }
)

#: the line's own word; the first one wins (``Fatal``/``Non-fatal``, any case for the latter)
_WORD_RE: Final = re.compile(r"\b(?:(?P<non>(?i:Non-?fatal))|Fatal)\b")
#: the driver's second line of an SXid: ``Severity 1 Engine instance 60 Sub-engine instance 00`` (the
#: driver's severity enum: 0 non-fatal, 1 fatal)
_SEVERITY_RE: Final = re.compile(r"^\s*Severity (?P<n>\d) Engine instance\b")


def sxid_fatal(code: int, rest: str) -> bool | None:
    """Whether an SXid line reports a fatal error; ``None`` when neither the line nor NVIDIA's list says."""
    head = rest[:40]
    word = _WORD_RE.search(head)
    if word is not None:
        return word.group("non") is None
    severity = _SEVERITY_RE.match(head)
    if severity is not None:
        return severity.group("n") != "0"
    if code in NON_FATAL_SXIDS:
        return False
    return None
