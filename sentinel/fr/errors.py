"""The one error type the flight-recorder readers raise for bad input.

Everything that reads outside data (dump files, live snapshots) converts every failure into
:class:`FrFormatError` with a one-line message naming the file/field and what is wrong, so commands can
print it and exit 2 and daemons can log and count it — never a traceback.
"""

from __future__ import annotations

from sentinel.fr.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


class FrFormatError(ValueError):
    """A flight-recorder dump (or snapshot) is unusable: corrupt, refused, too large or of unknown shape."""


def brief(value: object, limit: int = 30) -> str:
    """A short, safe description of an outside value for an error message: scalars shown (cut to
    ``limit``), containers by type and length — never ``str()`` of a container, which recurses into
    hostile nesting (RecursionError) and can cost time quadratic in huge integers."""
    if value is None or isinstance(value, bool | float):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if -(1 << 64) < value < 1 << 64 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, str | bytes):
        return repr(value[:limit])
    if isinstance(value, list | tuple | dict | set):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def entry_at(source: str, entries: list[Any], index: int, first: int = 0) -> str:
    """``FILE: entries[N] (record_id R)``: where a bad entry is, the same on every decode path.

    ``N`` is the entry's index in the file's ``entries`` list: ``first`` is the file index of
    ``entries[0]`` (the recent-tail decoder, :mod:`sentinel.fr.recent`, hands over only the newest
    entries). ``record_id`` is PyTorch's own running number of the entry (what ``torchfrtrace`` and a
    user's own tools show), shown when the entry has a 64-bit integer one. ``entries`` holds the decoded dicts
    or the structs of :func:`sentinel.fr.coerce.coerce_entries`."""
    entry = entries[index] if 0 <= index < len(entries) else None
    record_id = entry.get("record_id") if isinstance(entry, dict) else getattr(entry, "record_id", None)
    where = f"{source}: entries[{first + index}]"
    if type(record_id) is int and -(1 << 63) <= record_id < 1 << 63:
        where += f" (record_id {record_id})"
    return where
