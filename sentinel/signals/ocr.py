"""Undo the OCR damage that screenshots of logs suffer, for the key words the parsers anchor on.

Lines copied from screenshots arrive with letters swapped for look-alikes (``Xld``, ``Watchd0g``,
``tirneout``, ``NCCl WARN``, ``err0r``). The parsers match exact words, so such a line would read as
unknown. :func:`repair` rewrites only known key words: every word of the line is reduced to a
*skeleton* in which the usual confusions collapse (``rn``→``m``, ``vv``→``w``, ``cl``→``d``, ``0``→``o``,
``1``/``I``/``|``/``!``→``l``, ``5``→``s``, case folded), and a word whose skeleton is a key word's is
written back in the key word's spelling. The rest of the line, numbers included, is left as it was. Cost:
one C-speed tokenising pass and a dictionary look-up per word.
"""

from __future__ import annotations

import functools
import re
from typing import Final

#: Key words in the spelling the parsers expect.
KEYWORDS: Final = (
    "Xid",
    "SXid",
    "NVRM",
    "NCCL",
    "WARN",
    "INFO",
    "ECC",
    "Watchdog",
    "watchdog",
    "caught",
    "collective",
    "operation",
    "timeout",
    "Timeout",
    "milliseconds",
    "timing",
    "error",
    "Error",
    "failure",
    "failed",
    "Failed",
    "fallen",
    "bus",
    "uncorrectable",
    "Uncorrectable",
    "completion",
    "Connection",
    "reset",
    "closed",
    "refused",
    "peer",
    "exitcode",
    "WorkNCCL",
    "SeqNum",
    "OpType",
    "ProcessGroupNCCL",
    "Segmentation",
    "fault",
    "illegal",
    "memory",
    "access",
    "encountered",
    "terminate",
    "called",
    "throwing",
    "instance",
    "Remapping",
    "aborted",
    "signal",
    "Signal",
    "received",
    "Exception",
    "detected",
    "DistBackendError",
    "ChildFailedError",
)

_TOKEN_RE: Final = re.compile(r"[A-Za-z0-9|!@]{2,40}")
_FOLD: Final = str.maketrans({"0": "o", "1": "l", "i": "l", "|": "l", "!": "l", "5": "s", "@": "a"})


def _skeleton(word: str) -> str:
    low = word.lower().replace("rn", "m").replace("vv", "w").replace("cl", "d")
    return low.translate(_FOLD)


_BY_SKELETON: Final[dict[str, str]] = {}
for _word in KEYWORDS:
    _BY_SKELETON.setdefault(_skeleton(_word), _word)


@functools.lru_cache(maxsize=4096)
def _fixed(token: str) -> str | None:
    """The key word ``token`` is an OCR-damaged spelling of, if any (memoised, bounded: a log repeats
    the same few thousand words, and this runs on every word of every candidate line)."""
    word = _BY_SKELETON.get(_skeleton(token))
    if word is None or word == token:
        return None
    if token[:1].isupper() and word[:1].islower():
        word = word[:1].upper() + word[1:]
    if word == token:
        return None
    if word.isupper():
        # An all-capitals key word (NCCL, NVRM, WARN): the damaged copy must still be mostly capitals.
        return word if sum(char.isupper() for char in token) >= len(token) - 1 else None
    # A mixed-case key word differs by a confusion, never by case alone ("ERROR" is not damaged).
    return word if token.lower() != word.lower() else None


def repair(text: str) -> str:
    """``text`` with every key word that OCR damaged written back in its expected spelling."""
    pieces: list[str] = []
    last = 0
    for match in _TOKEN_RE.finditer(text):
        fixed = _fixed(match.group(0))
        if fixed is not None:
            pieces.append(text[last : match.start()])
            pieces.append(fixed)
            last = match.end()
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)
