"""Entries whose fields are not of the exact types PyTorch writes: coerced by msgspec, or refused by name.

:func:`sentinel.fr.summary.summarize` reads the decoded entry dicts directly, accepting each field only
with the exact type PyTorch writes (an int64 ``int``, a ``str``, ...). An entry with anything else — a
number written as a string, an ``int`` where a ``bool`` belongs, a missing required field, an integer
beyond 64 bits — sends the dump here: ``msgspec.convert`` (lax) coerces what it can, checking every
entry's fields in one C pass, and otherwise names the entry and field that is wrong. Imported only then:
msgspec costs a small set's ``fr analyze`` a fifth of its time to import.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from sentinel.fr.errors import FrFormatError

INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
Int64 = Annotated[int, msgspec.Meta(ge=INT_MIN, le=INT_MAX)]


class _Entry(msgspec.Struct, kw_only=True):
    """The fields of a ring-buffer entry the analysis reads, typed; the others untyped.

    Declared in the order PyTorch writes an entry's keys, the ones the analysis does not read (frames,
    thread names) included: msgspec then finds each key at the field it tries first, where a key out of
    order or undeclared costs it a scan of every field.
    """

    frames: Any = None
    record_id: Any = None
    pg_id: Int64 = -1
    process_group: tuple[str, str] | None = None
    thread_name: Any = None
    thread_id: Any = None
    collective_seq_id: Int64 | None = None
    p2p_seq_id: Int64 = -1
    op_id: Int64 = -1
    profiling_name: str
    time_created_ns: Int64
    input_sizes: Any = None
    input_dtypes: Any = None
    output_sizes: Any = None
    output_dtypes: Any = None
    state: str | None = None
    time_discovered_started_ns: Int64 | None = None
    time_discovered_completed_ns: Any = None
    retired: bool | None = None
    timeout_ms: Any = None
    is_p2p: bool | None = None
    seq_id: Int64 | None = None
    duration_ms: float | None = None


_ENTRIES = list[_Entry]


#: What must agree across ranks (sizes, dtypes) as bytes, for the summary's cache of match keys.
pack = msgspec.msgpack.Encoder().encode


def coerce_entries(entries: list[Any], source: str) -> list[Any]:
    """Every entry as a struct of exactly typed fields (absent ones at their defaults); FrFormatError
    naming the first entry and field that cannot be read as the format says."""
    try:
        return msgspec.convert(entries, _ENTRIES, strict=False)
    except msgspec.ValidationError as exc:
        text = str(exc)
        where = re.search(r"at `\$\[(\d+)\]\.?(\w*)", text)
        what = text.split(" - at ", 1)[0][:100]
        if what.startswith(("Expected `int` <=", "Expected `int` >=")):
            what = "out of range, expected a 64-bit integer"
        if where:
            field = f" field {where[2]!r}:" if where[2] else ""
            raise FrFormatError(f"{source}: entry {where[1]}:{field} {what}") from None
        raise FrFormatError(f"{source}: entries: {what}") from None
    except RecursionError:
        raise FrFormatError(f"{source}: entries nest too deeply") from None
