"""Decode JSON dump text into plain dicts that hold only the entry fields the analysis reads.

``_dump_fr_trace_json`` writes every entry's stack frames in full, so most of a JSON dump's text is
frames that the analysis never reads. msgspec decodes each entry into a struct of the fields that are
read and skips every other key while it parses, building no objects for it. The structs then become
plain dicts of the keys that were present. Their values are the ones :func:`json.loads` gives (the
fields are untyped), so the reduction sees the same dicts without the keys it ignores. Nesting, size and
syntax stay as bounded as in a full decode: the skipped values are parsed too, and msgspec refuses what
nests too deeply. Only imported where msgspec already is (see :func:`sentinel.fr.recent_json._json_loads`).
"""

from __future__ import annotations

from typing import Any

import msgspec

_UNSET: Any = msgspec.UNSET


class _Entry(msgspec.Struct, gc=False):
    """The entry keys any part of the analysis reads, in the order torch writes them (sorted), so that
    msgspec finds each key at the field it tries first. A key absent from the text stays UNSET, and
    :func:`msgspec.to_builtins` leaves it out of the dict."""

    collective_seq_id: Any = _UNSET
    duration_ms: Any = _UNSET
    input_dtypes: Any = _UNSET
    input_sizes: Any = _UNSET
    is_p2p: Any = _UNSET
    op_id: Any = _UNSET
    output_dtypes: Any = _UNSET
    output_sizes: Any = _UNSET
    p2p_seq_id: Any = _UNSET
    pg_id: Any = _UNSET
    process_group: Any = _UNSET
    profiling_name: Any = _UNSET
    record_id: Any = _UNSET
    retired: Any = _UNSET
    seq_id: Any = _UNSET
    state: Any = _UNSET
    time_created_ns: Any = _UNSET
    time_discovered_completed_ns: Any = _UNSET
    time_discovered_started_ns: Any = _UNSET


class _Dump(msgspec.Struct, gc=False):
    """The top-level keys :func:`sentinel.fr.loader.parse_dump` reads."""

    entries: list[_Entry] | msgspec.UnsetType = msgspec.UNSET
    pg_config: Any = _UNSET
    pg_status: Any = _UNSET
    version: Any = _UNSET


#: The entry keys kept.
ENTRY_KEYS = frozenset(_Entry.__struct_fields__)

_decode_dump = msgspec.json.Decoder(_Dump).decode
_decode_entry = msgspec.json.Decoder(_Entry).decode
_to_builtins = msgspec.to_builtins


def loads_dump(text: bytes) -> dict[str, Any]:
    """The dump document as :func:`json.loads` reads it, with only the keys the analysis reads.
    Raises msgspec's errors where the text is not JSON or a value is not of the shape read (a top level
    that is not an object, an entry that is not one); the caller then decodes it with :mod:`json`."""
    out: dict[str, Any] = _to_builtins(_decode_dump(text))
    return out


def loads_entry(text: bytes) -> dict[str, Any]:
    """One entry, as :func:`loads_dump` reads each of them."""
    out: dict[str, Any] = _to_builtins(_decode_entry(text))
    return out
