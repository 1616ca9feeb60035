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
import sys
from typing import Annotated, Any

from sentinel.fr.errors import FrFormatError, entry_at

# msgspec is imported without typing_extensions where nothing has imported that yet: msgspec reads from it
# only what Python 3.11's own typing has (``get_type_hints``, ``Required``, ``NotRequired``) and falls back
# to those when its import fails, while typing_extensions imports ``inspect`` (with ``ast``, ``dis``,
# ``tokenize``): a large part of what msgspec costs ``fr analyze`` before its first worker starts. A process
# that imported either already (a daemon: aiohttp imports typing_extensions) is left as it is, and a later
# import of typing_extensions works as always.
_WITHOUT_TYPING_EXTENSIONS = "msgspec" not in sys.modules and "typing_extensions" not in sys.modules
if _WITHOUT_TYPING_EXTENSIONS:
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # importing it raises ImportError
try:
    import msgspec
finally:
    if _WITHOUT_TYPING_EXTENSIONS:
        del sys.modules["typing_extensions"]

INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
Int64 = Annotated[int, msgspec.Meta(ge=INT_MIN, le=INT_MAX)]


class _FastEntry(msgspec.Struct, kw_only=True, gc=False):
    """The fields of a ring-buffer entry the analysis reads, typed; the others untyped.

    Declared in the order PyTorch writes an entry's keys, the ones the analysis does not read (frames,
    thread names) included: msgspec then finds each key at the field it tries first, where a key out of
    order or undeclared costs it a scan of every field.

    ``process_group`` is left untyped: converting it built a new tuple per entry, where the pickle shares
    one per group, which :func:`sentinel.fr.summary.summarize` checks once by identity; an entry it does
    not accept sends the dump through :class:`_Entry`. Not tracked by the cyclic collector (``gc=False``):
    an entry struct is made from a dict and never referenced from the data it holds, so it is in no cycle.
    """

    frames: Any = None
    record_id: Any = None
    pg_id: Int64 = -1
    process_group: Any = None
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


class _Entry(_FastEntry, kw_only=True, gc=False):
    """:class:`_FastEntry` with ``process_group`` typed (the field keeps its place): what a dump whose
    entries the fast way does not accept is read with, so that the error names the first field in the
    file that is wrong."""

    process_group: tuple[str, str] | None = None


_ENTRIES = list[_Entry]
_FAST_ENTRIES = list[_FastEntry]


#: What must agree across ranks (sizes, dtypes) as bytes, for the summary's cache of match keys.
pack = msgspec.msgpack.Encoder().encode


def coerce_entries_fast(entries: list[Any], source: str, first: int = 0) -> list[Any] | None:
    """Every entry as a :class:`_FastEntry` (converted as :func:`coerce_entries` converts them); None when
    any field or key cannot be read as the format says (:func:`coerce_entries` then names it)."""
    try:
        return _convert(entries, source, first, _FAST_ENTRIES)
    except (FrFormatError, _KeyNotStr):
        return None


def coerce_entries(entries: list[Any], source: str, first: int = 0) -> list[Any]:
    """Every entry as a struct of exactly typed fields (absent ones at their defaults); FrFormatError
    naming the first entry (``FILE: entries[N] (record_id R)``, see :func:`~sentinel.fr.errors.entry_at`;
    ``first``: the file index of ``entries[0]``) and field that cannot be read as the format says.

    A key that is not a string is ignored, as an unknown string key is (the direct reading in
    :func:`sentinel.fr.summary.summarize` looks fields up by name and never sees it): PyTorch writes
    only string keys, a pickle can hold others, and a key that names no field carries nothing the
    analysis reads — refusing it would refuse a dump whose every field is sound. msgspec refuses any
    key but an exact ``str``, so such entries are rebuilt without them (a key of a ``str`` subclass as
    its plain text) and the whole list converted again: the cost is paid only by such a dump."""
    try:
        return _convert(entries, source, first)
    except _KeyNotStr:
        pass
    try:
        return _convert(_string_keys(entries), source, first)
    except _KeyNotStr:  # cannot happen (every key is a str now); never a traceback if it did
        raise FrFormatError(f"{source}: entries: a key is not a string") from None


class _KeyNotStr(Exception):
    """msgspec met an entry key that is not a ``str`` (see :func:`coerce_entries`)."""


#: Keys per entry beyond which entries are converted once per distinct dict (PyTorch writes ~20).
KEYS_PER_ENTRY = 64


def _convert(entries: list[Any], source: str, first: int, types: Any = _ENTRIES) -> list[Any]:
    """The structs of the entries. msgspec reads every key of every entry it is given, so one dict of
    thousands of keys referenced by thousands of entries (the pickle memo makes that a small file) costs
    it quadratic time where the direct reading, which looks fields up by name, stays linear: the answer
    would depend on the set's size. When the entries hold more keys than :data:`KEYS_PER_ENTRY` each on average,
    each distinct dict is converted once (the work stays linear in the file). The count is one C call
    over the list, small against the conversion itself."""
    try:
        keys = sum(map(len, entries))
    except TypeError:  # an entry without a length (msgspec names it below)
        keys = sum(len(e) for e in entries if isinstance(e, dict))
    firsts: list[int] | None = None
    distinct = entries
    if keys > KEYS_PER_ENTRY * len(entries):
        slot: dict[int, int] = {}
        firsts = []
        for i, e in enumerate(entries):
            if slot.setdefault(id(e), len(firsts)) == len(firsts):
                firsts.append(i)
        distinct = [entries[i] for i in firsts]
    try:
        structs: list[Any] = msgspec.convert(distinct, types, strict=False)
    except msgspec.ValidationError as exc:
        if " - at `key` in `$[" in str(exc):
            raise _KeyNotStr from None
        raise _named(exc, entries, source, first, firsts) from None
    except RecursionError:
        raise FrFormatError(f"{source}: entries nest too deeply") from None
    if firsts is None:
        return structs
    return [structs[slot[id(e)]] for e in entries]


def _string_keys(entries: list[Any]) -> list[Any]:
    """The entries with every key that is not a ``str`` dropped (see :func:`coerce_entries`). Each
    distinct dict is rebuilt once, however often it is referenced (a pickle's memo can reference one
    dict of many keys from every entry: the work stays linear in the file)."""
    done: dict[int, Any] = {}
    out = []
    for e in entries:
        clean = done.get(id(e))
        if clean is None:
            clean = e
            if isinstance(e, dict) and not all(type(k) is str for k in e):
                clean = {str.__str__(k): v for k, v in e.items() if isinstance(k, str)}
            done[id(e)] = clean
        out.append(clean)
    return out


_WHERE = re.compile(r" - at `\$\[(\d+)\]\.?([\w.\[\]]*)`$")
_JSON_KIND = {"null": "None", "array": "a list", "str": "a string", "int": "an integer", "float": "a float"}
_MISSING = re.compile(r"Object missing required field `(\w+)`")


def _named(
    exc: msgspec.ValidationError, entries: list[Any], source: str, first: int, firsts: list[int] | None
) -> FrFormatError:
    """msgspec's message (``Expected `int`, got `str` - at `$[17].input_sizes```) as one line naming
    the file, the entry and its field, as the direct reading names them. ``firsts``: where each entry
    msgspec was given first appears in ``entries``, when it was given each distinct dict once."""
    text = str(exc)
    what = text.split(" - at ", 1)[0][:100]
    where = _WHERE.search(text)
    if where is None:
        return FrFormatError(f"{source}: entries: {what}")
    field = where[2]
    missing = _MISSING.match(what)
    if missing:
        field, what = missing[1], "missing (a required field)"
    elif what.startswith(("Expected `int` <=", "Expected `int` >=")):
        what = "out of range, expected a 64-bit integer"
    elif not field and what.startswith("Expected `object`, got `"):
        what = f"is {_JSON_KIND.get(what[24:-1], 'a ' + what[24:-1])}, expected a dict"
    index = int(where[1])
    at = entry_at(source, entries, index if firsts is None else firsts[index], first)
    return FrFormatError(f"{at}: {field}: {what}" if field else f"{at}: {what}")
