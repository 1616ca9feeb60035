"""The one error type the flight-recorder readers raise for bad input.

Everything that reads outside data (dump files, live snapshots) converts every failure into
:class:`FrFormatError` with a one-line message naming the file/field and what is wrong, so commands can
print it and exit 2 and daemons can log and count it — never a traceback.
"""

from __future__ import annotations


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
