"""Decode only the recent part of a JSON Flight Recorder dump (``_dump_fr_trace_json``), as
:mod:`sentinel.fr.recent` does for pickles: read at both ends, the header and first entry from the front,
the newest entries and the trailer from the back, the middle only to show every skipped entry retired.
"""

from __future__ import annotations

import json
import re
import sys

from sentinel.fr.recent import MIN_ENTRIES, ByteView, Recent
from sentinel.fr.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

_JSON_ENTRY = b'{"collective_seq_id":'


def decode_recent_json(data: bytes | ByteView, keep: int, *, fields_only: bool = True) -> Recent | None:
    """The same for ``_dump_fr_trace_json`` output (keys sorted, no memo): the document is spliced to its
    header, the newest ``keep`` entries and its trailer, and parsed once. None when in doubt.
    ``fields_only``: the entries may hold only the keys the analysis reads (see :func:`_json_loads`)."""
    try:
        return _decode_recent_json(data if isinstance(data, ByteView) else ByteView(data), keep, fields_only)
    except Exception:  # any doubt: the caller decodes the whole file
        return None


_JSON_RECORD_ID = re.compile(rb'"record_id":(\d{1,19})[,}]')


def _decode_recent_json(view: ByteView, keep: int, fields_only: bool) -> Recent | None:
    # read at both ends, as a pickle is: the header and first entry from the front, the newest entries and
    # the trailer (pg_config, pg_status, version: keys sorted) from the back; the middle is read only to
    # show every skipped entry retired (skipped_done)
    if not view.front:
        view._grow_front(view.CHUNK)
    start = view.front.find(b'"entries":[' + _JSON_ENTRY, 0, 1 << 16)
    if start < 0:
        return None
    first = start + len(b'"entries":[')
    head_end = view.find(_JSON_ENTRY, first + 1, view.size)  # the first entry, for group names
    if head_end < 0:
        return None
    first_entry = _json_loads(bytes(view.get(first, head_end - 1)), fields_only, entry=True)
    if not isinstance(first_entry, dict):
        return None
    first_id = first_entry.get("record_id")
    # the total from the record ids of the first and the last entry (as for a pickle), the last one read
    # from the bytes first (a guess, checked against the decoded entries below): too few entries to skip,
    # and the newest are not decoded
    while True:  # behind the last entry: the trailer, whose pg_config lists every rank of the world
        back = view.back
        last_at = back.rfind(b'"record_id":')
        if last_at >= 0 or view.size - len(back) <= first:
            break
        view._grow_back(2 * len(back))
    last = None if last_at < 0 else _JSON_RECORD_ID.match(back, last_at)
    if type(first_id) is not int or last is None:
        return None
    total = int(last[1]) - first_id + 1
    if total < max(MIN_ENTRIES, keep + 16):
        return None
    cut = _nth_from_back(view, _JSON_ENTRY, keep, head_end)
    if cut is None:
        return None
    base = view.size - len(view.back)
    if cut < base:  # (cannot be: the back was searched)
        return None
    # one copy: the header, then the newest entries and the trailer as read
    obj = _json_loads(view.front[:first] + memoryview(view.back)[cut - base :], fields_only)
    entries = obj.get("entries") if isinstance(obj, dict) else None
    if not isinstance(entries, list) or len(entries) != keep:
        return None
    ids = [e.get("record_id") if isinstance(e, dict) else None for e in entries]
    if ids != list(range(first_id + total - keep, first_id + total)):
        return None
    names: dict[int, list[str]] = {}
    pg = first_entry.get("process_group")
    if type(first_entry.get("pg_id")) is int and isinstance(pg, list) and len(pg) == 2:
        names[first_entry["pg_id"]] = [str(pg[0]), str(pg[1])]
    skipped = total - keep

    def skipped_done() -> bool:
        """Every skipped entry retired: in JSON a string cannot hold an unescaped quote, so the text
        ``"retired":true`` is the key with the value true and nothing else (torch writes it compact, in
        every entry, keys sorted); as many of those as skipped entries (which also shows that the middle
        holds as many entries as the record ids count), and no other ``"retired"`` (another value,
        spacing, a nested copy), or the caller decodes the whole file."""
        data = view.through(cut)
        ok = data.count(b'"retired":true', first, cut)
        return ok == skipped and data.count(b'"retired"', first, cut) == ok

    return obj, total, names, skipped_done, None


def _nth_from_back(view: ByteView, needle: bytes, n: int, lo: int) -> int | None:
    """Offset of the ``n``-th ``needle`` counted from the end of the file, at ``lo`` or after (None when
    there are fewer); the back of ``view`` grows as the search needs it, and no byte is searched twice
    (a needle across the old start of the back is found once the back holds it)."""
    cut = view.size
    while n:
        back = view.back
        base = view.size - len(back)
        pos = back.rfind(needle, max(lo - base, 0), cut - base)
        if pos >= 0:
            cut = pos + base
            n -= 1
        elif base <= lo:
            return None
        else:
            view._grow_back(2 * len(back))
    return cut


def _json_loads(text: bytes, fields_only: bool = False, *, entry: bool = False) -> Any:
    """:func:`json.loads`, by msgspec's decoder when msgspec is imported already (``fr analyze`` imports
    it for large sets: :data:`sentinel.fr.dumpset.COERCE_FROM`), to the same values; what it refuses
    (NaN, 1e400, lone surrogate escapes) json decodes. ``fields_only``: into the entry keys the analysis
    reads only (:mod:`sentinel.fr.jsonfields`), their stack frames skipped; ``entry``: ``text`` is one
    entry."""
    msgspec = sys.modules.get("msgspec")
    if msgspec is not None:
        try:
            if fields_only:
                from sentinel.fr.jsonfields import loads_dump, loads_entry

                return loads_entry(text) if entry else loads_dump(text)
            return msgspec.json.decode(text)
        except Exception:  # noqa: S110 (json decides, as without msgspec)
            pass
    return json.loads(text)
