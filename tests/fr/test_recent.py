"""Decoding only the newest entries of a large pickle gives the same entries as a full decode."""

from __future__ import annotations

import functools
import gzip
import json
import pickle
import pickletools
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.fr.dumpset import analyze_dir, limited_address_space
from sentinel.fr.errors import FrFormatError
from sentinel.fr.jsonfields import ENTRY_KEYS
from sentinel.fr.loader import load_dump
from sentinel.fr.recent import HEAD, NAMES_HEAD, ByteView, _record_ids, decode_recent
from sentinel.fr.recent_json import decode_recent_json
from sentinel.fr.safepickle import loads_plain
from sentinel.fr.summary import summarize
from tests.fr.synth import entry
from tests.support import TORCH_PROCESS_TIMEOUT_S, need_module

FRAMES = [{"name": f"f{i}", "filename": "train.py", "line": i} for i in range(40)]


def _big_dump(n: int, *, late_frame_at: int | None = None, stuck_at: int | None = None) -> bytes:
    entries: list[dict[str, Any]] = []
    for i in range(n):
        e = entry(str(i % 3), i // 3 + 1, desc="tp", t_ms=i, done=stuck_at is None or i < stuck_at)
        e["record_id"] = i
        frames = [FRAMES[i % 7], FRAMES[7 + i % 5]]
        if late_frame_at is not None and i >= late_frame_at:
            frames.append(FRAMES[30])  # a code path that first ran late: memoized in the middle
        e = {"frames": frames, **e}
        entries.append(e)
    status = {}
    for pg in range(3):
        mine = [e for e in entries if e["pg_id"] == pg]
        done = [e["collective_seq_id"] for e in mine if e["retired"]]
        status[str(pg)] = {
            "last_enqueued_collective": mine[-1]["collective_seq_id"],
            "last_started_collective": -1,
            "last_completed_collective": max(done, default=-1),
        }
    dump = {
        "version": "2.10",
        "pg_config": {},
        "comm_lib_version": "",
        "pg_status": status,
        "entries": entries,
    }
    return pickle.dumps(dump, protocol=2)


def test_newest_entries_equal_a_full_decode() -> None:
    data = _big_dump(2000, late_frame_at=900)
    found = decode_recent(data, 512)
    assert found is not None
    top, total, names = found[:3]
    assert names == {0: ["0", "tp"], 1: ["1", "tp"], 2: ["2", "tp"]}
    full = loads_plain(data)
    assert total == 2000
    assert top["entries"] == full["entries"][-512:]
    assert {k: v for k, v in top.items() if k != "entries"} == {
        k: v for k, v in full.items() if k != "entries"
    }


def test_small_dumps_and_json_are_decoded_in_full() -> None:
    assert decode_recent(_big_dump(300), 512) is None
    assert decode_recent(b"{}", 512) is None


def test_a_wait_older_than_the_newest_entries_reads_everything(tmp_path: Path) -> None:
    path = tmp_path / "t_0"
    path.write_bytes(_big_dump(2000, stuck_at=600))  # group waits since entry 600: far before the newest 512
    dump = load_dump(path, recent=512)
    assert len(dump.entries) == 2000
    path.write_bytes(_big_dump(2000))
    assert len(load_dump(path, recent=512).entries) == 512


def _with_early_group(n: int, first_id: int, at: int = 2) -> bytes:
    """A dump of ``n`` entries whose record ids start at ``first_id`` (0: a buffer that never wrapped),
    with a fourth group that only entry ``at`` names and pg_status reports."""
    top = loads_plain(_big_dump(n))
    for i, e in enumerate(top["entries"]):
        e["record_id"] = first_id + i
    early = top["entries"][at]
    early["pg_id"], early["process_group"] = 3, ("3", "init")
    top["pg_status"]["3"] = {
        "last_enqueued_collective": early["collective_seq_id"],
        "last_started_collective": -1,
        "last_completed_collective": early["collective_seq_id"],
    }
    return pickle.dumps(top, protocol=2)


def test_a_small_file_is_decoded_from_its_newest_entries_as_it_was_written(tmp_path: Path) -> None:
    """Below 64 KiB a file is read in one read. A buffer that wrapped (its first record id above 0) is
    decoded from its first entries and its newest; one that never wrapped (a short job, whose start-up
    entries memoize only part of what the newest refer to) is decoded in full and reduced from its newest
    entries. Either way only when enough would be skipped, with the same group names; gzipped the same."""
    for first_id, at_both_ends in ((5000, True), (0, False)):
        data = _with_early_group(240, first_id)
        assert len(data) < ByteView.CHUNK
        assert _record_ids(ByteView(data), 0) == (first_id, first_id + 239)
        assert (decode_recent(data, 128) is not None) is at_both_ends
        full = loads_plain(data)["entries"]
        (tmp_path / "plain_0").write_bytes(data)
        (tmp_path / "gz_0").write_bytes(gzip.compress(data))
        for name in ("plain_0", "gz_0"):
            dump = load_dump(tmp_path / name, recent=128)
            assert dump.entries == full[-128:]
            assert dump.n_entries == 240
            assert dump.pg_names[3] == ["3", "init"]
        (tmp_path / "few_0").write_bytes(_with_early_group(160, first_id))  # fewer skipped than it costs
        assert len(load_dump(tmp_path / "few_0", recent=128).entries) == 160
    (tmp_path / "stuck_0").write_bytes(_big_dump(240, stuck_at=60))  # a wait the newest entries miss
    assert len(load_dump(tmp_path / "stuck_0", recent=128).entries) == 240


def test_groups_only_the_first_entries_name_are_named(tmp_path: Path) -> None:
    """A wrapped buffer is decoded from its first HEAD entries; a group pg_status reports that neither
    they nor the newest entries name is looked for among the first NAMES_HEAD (decoded for it), as a
    buffer that never wrapped (whose first UNWRAPPED_HEAD entries are decoded) finds it there."""
    for first_id in (5000, 0):
        for at, named in ((HEAD + 3, True), (NAMES_HEAD + 5, False)):
            found = decode_recent(_with_early_group(2000, first_id, at), 128)
            assert found is not None
            assert (3 in found[2]) is named, (first_id, at)
            assert found[0]["entries"] == loads_plain(_with_early_group(2000, first_id, at))["entries"][-128:]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**40), st.integers(140, 400))
def test_record_ids_read_from_the_bytes_only_choose_the_decode(first_id: int, n: int) -> None:
    """The first and last record ids are read from the bytes (one byte, two, four: BININT1/2/BININT; a
    larger id is not read) to choose how to decode; whatever they say, the result is the full decode's."""
    data = _with_early_group(n, first_id)
    ids = _record_ids(ByteView(data), 0)
    if first_id + n - 1 >= 2**31:  # (LONG1: not read, the default decode)
        assert ids is None
    elif ids is not None:  # (the last id is a guess: the same bytes inside the last entry could mislead it)
        assert ids[0] == first_id
    found = decode_recent(data, 128)
    full = loads_plain(data)["entries"]
    if found is not None:
        assert found[0]["entries"] == full[-128:] and found[1] == n
    dump = _load_dump_bytes(data)
    assert dump.entries == full[-len(dump.entries) :]
    assert dump.n_entries == n


def _load_dump_bytes(data: bytes) -> Any:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t_0"
        path.write_bytes(data)
        return load_dump(path, recent=128)


def test_a_collective_across_the_cut_is_read_whole(tmp_path: Path) -> None:
    """Ops of one coalesced collective share its seq and fold into one column: cut between them, the
    newest entries would hold part of it (a false mismatch against a peer). Read whole instead."""
    top = loads_plain(_big_dump(240))  # (record ids from 0: decoded in full, then cut)
    entries = top["entries"]
    cut = entries[-128]
    same = next(i for i in range(len(entries) - 129, -1, -1) if entries[i]["pg_id"] == cut["pg_id"])
    entries[same]["collective_seq_id"] = cut["collective_seq_id"]
    (tmp_path / "t_0").write_bytes(pickle.dumps(top, protocol=2))
    assert len(load_dump(tmp_path / "t_0", recent=128).entries) == 240


@functools.cache
def _base_dump() -> bytes:
    return _big_dump(1200)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_big_pickles_never_decode_to_something_else(data: st.DataObject) -> None:
    _mutated_decodes_as_a_full_decode(_base_dump(), data, lambda rng: rng.randrange(256))


def _mutated_decodes_as_a_full_decode(
    base: bytes, data: st.DataObject, byte: Callable[[random.Random], int]
) -> None:
    """A few bytes of ``base`` replaced by ``byte``: the newest entries, when found, are the full
    decode's."""
    original = bytearray(base)
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = rng.randrange(len(original))
        original[pos] = byte(rng)
    _decodes_as_a_full_decode(bytes(original), 512)


def _decodes_as_a_full_decode(blob: bytes, keep: int) -> None:
    """The newest ``keep`` entries of ``blob`` and its header, when found, are the full decode's (or the
    full decode fails)."""
    with limited_address_space(1 << 30):  # a flipped memo index can ask for gigabytes
        found = decode_recent(blob, keep)
        if found is None:
            return
        try:
            full = loads_plain(blob)
        except FrFormatError:
            return  # the full decode fails elsewhere in the file (e.g. in the skipped middle)
    assert found[0]["entries"] == full["entries"][-keep:]
    assert {k: v for k, v in found[0].items() if k != "entries"} == {
        k: v for k, v in full.items() if k != "entries"
    }


def test_real_torch_dump_of_2000_entries(tmp_path: Path) -> None:
    need_module("torch")
    out = tmp_path / "nccl_trace_rank_0"
    script = (
        "import os, sys\n"
        "os.environ['TORCH_FR_BUFFER_SIZE'] = '2000'\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "g = dist.new_group([0])\n"
        "for i in range(2100):\n"
        "    dist.all_reduce(torch.ones(8), group=g if i % 3 else None)\n"
        "    if i % 50 == 0: dist.broadcast(torch.ones(4), src=0)\n"
        "open(sys.argv[1], 'wb').write(torch._C._distributed_c10d._dump_fr_trace())\n"
        "open(sys.argv[1] + '.json', 'wb').write(torch._C._distributed_c10d._dump_fr_trace_json())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(out)],
        capture_output=True,
        timeout=TORCH_PROCESS_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    raw = out.read_bytes()
    full = loads_plain(raw)
    found = decode_recent(raw, 512)
    assert found is not None
    assert found[1] == len(full["entries"]) == 2000
    assert found[0]["entries"] == full["entries"][-512:]
    raw_json = (tmp_path / "nccl_trace_rank_0.json").read_bytes()
    newest_json = json.loads(raw_json)["entries"][-512:]
    found_json = decode_recent_json(raw_json, 512, fields_only=False)
    assert found_json is not None
    assert found_json[1] == 2000
    assert found_json[0]["entries"] == newest_json
    # by default only the keys the analysis reads (msgspec is imported: sentinel.fr.jsonfields)
    read = decode_recent_json(raw_json, 512)
    assert read is not None
    assert read[0]["entries"] == [{k: v for k, v in e.items() if k in ENTRY_KEYS} for e in newest_json]
    (tmp_path / "nccl_trace_rank_0.json").rename(tmp_path / "elsewhere.json")
    fast = analyze_dir(tmp_path, workers=1).to_json()
    assert fast == analyze_dir(tmp_path, workers=1, recent=None).to_json()
    assert fast["entries"] == 2000


def test_json_newest_entries_equal_a_full_decode() -> None:
    dump = loads_plain(_big_dump(1500))
    raw = json.dumps(dump, sort_keys=True, separators=(",", ":")).encode()
    newest = json.loads(raw)["entries"][-512:]
    found = decode_recent_json(raw, 512, fields_only=False)
    assert found is not None
    assert found[1] == 1500
    assert found[0]["entries"] == newest
    read = decode_recent_json(raw, 512)
    assert read is not None
    assert read[0]["entries"] == [{k: v for k, v in e.items() if k in ENTRY_KEYS} for e in newest]
    assert any(k not in ENTRY_KEYS for e in newest for k in e)
    assert decode_recent_json(raw.replace(b'"collective_seq_id"', b'"seq_id"'), 512) is None


def test_a_file_is_read_at_both_ends_in_small_steps(tmp_path: Path, monkeypatch: Any) -> None:
    """From a file, only the ends are read (pread), growing while a search needs more: the newest
    entries equal a full decode's, whatever the step."""
    from sentinel.fr.recent import ByteView

    path = tmp_path / "t_0"
    raw = _big_dump(3000, late_frame_at=1500)
    path.write_bytes(raw)
    full = loads_plain(raw)["entries"]
    for chunk in (512, 4096, 1 << 16):
        monkeypatch.setattr(ByteView, "CHUNK", chunk)
        dump = load_dump(path, recent=256)
        assert dump.total_entries == 3000
        assert dump.entries == full[-256:]
    # bytes past what the ends hold are never decoded: garbage in the middle changes nothing
    raw = _big_dump(3000)
    full = loads_plain(raw)["entries"]
    middle = len(raw) // 2
    path.write_bytes(raw[:middle] + b"\xff" * 64 + raw[middle + 64 :])
    assert load_dump(path, recent=256).entries == full[-256:]


_SKIP_CHANGES = st.sampled_from(["false", "none", "false_completed", "key_text", "key_copy", "pattern"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 1199), _SKIP_CHANGES), max_size=4))
def test_fuzz_the_skipped_entries_are_shown_retired_only_when_they_are(
    changes: list[tuple[int, str]],
) -> None:
    """The bytes search of the skipped entries (never decoded) against a full decode: whatever entries
    anywhere in the buffer hold — retired False or None (pending), False but state completed, a stack
    frame named with the key's text, a second (non-interned) copy of the key string, the bytes of the
    key's reference followed by NONE inside a frame name — when it says every skipped entry is retired,
    the full decode agrees (it may say "not shown" for entries that are: a full decode then)."""
    dump = loads_plain(_base_dump())
    ref = None
    blob = _base_dump()
    at = blob.index(b"X\x07\x00\x00\x00retired") + 12
    if blob[at] == ord("q") and blob[at + 1] < 0x80:
        ref = "h" + chr(blob[at + 1])
    for index, change in changes:
        e = dump["entries"][index]
        if change == "false":
            e.update(retired=False, state="started")
        elif change == "none":
            e.update(retired=None, state="scheduled")
        elif change == "false_completed":
            e.update(retired=False, state="completed")
        elif change == "key_copy":  # a key string equal to "retired" but another object: memoized again
            del e["retired"]
            e["".join(["ret", "ired"])] = False
            e["state"] = "started"
        else:
            name = "on_retired_work" if change == "key_text" or ref is None else ref + "N"
            e["frames"] = [{"name": name, "filename": "train.py", "line": 1}]
    blob = pickle.dumps(dump, protocol=2)
    found = decode_recent(blob, 128)
    if found is None or not found[3]():
        return
    skipped = loads_plain(blob)["entries"][:-128]
    assert all(e.get("retired") is True or e.get("state") == "completed" for e in skipped)


def _dump_of(
    n: int, *, first_id: int, late_frame_at: int | None, stuck_at: int | None, fresh_every: int
) -> dict[str, Any]:
    """:func:`_big_dump`'s entries from ``first_id`` (a wrapped buffer when not 0), with a string first
    seen every ``fresh_every`` entries (0: none): a memo of thousands of indices, stored in the middle."""
    dump: dict[str, Any] = loads_plain(_big_dump(n, late_frame_at=late_frame_at, stuck_at=stuck_at))
    for i, e in enumerate(dump["entries"]):
        e["record_id"] = first_id + i
        if fresh_every and i % fresh_every == 0:
            e["frames"] = [*e["frames"], {"name": f"step_{i}", "filename": "train.py", "line": i}]
    return dump


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    protocol=st.sampled_from([2, 3, 4, 5]),
    n=st.integers(700, 2600),
    first_id=st.sampled_from([0, 1, 70_000, 2**31 + 5]),
    late=st.one_of(st.none(), st.integers(0, 2599)),
    stuck=st.one_of(st.none(), st.integers(0, 2599)),
    fresh_every=st.sampled_from([0, 1, 3, 50]),
    keep=st.sampled_from([128, 256]),
)
def test_every_protocol_decodes_the_newest_entries_as_a_full_decode(
    protocol: int, n: int, first_id: int, late: int | None, stuck: int | None, fresh_every: int, keep: int
) -> None:
    """Python's pickler of protocols 2 to 5 (every container memoized; from 4, MEMOIZE with implied
    indices and the file in 64 KiB frames): the newest entries, the total and the header equal the full
    decode's, and so does "every skipped entry retired" when it is said."""
    dump = _dump_of(n, first_id=first_id, late_frame_at=late, stuck_at=stuck, fresh_every=fresh_every)
    blob = pickle.dumps(dump, protocol=protocol)
    found = decode_recent(blob, keep)
    if late is None and stuck is None and fresh_every == 0:
        assert found is not None  # the plain layout of every protocol stays on the fast path
    if found is None:
        return
    full = loads_plain(blob)
    top, total = found[:2]
    assert total == n
    assert top["entries"] == full["entries"][-keep:]
    assert {k: v for k, v in top.items() if k != "entries"} == {
        k: v for k, v in full.items() if k != "entries"
    }
    if found[3]():
        assert all(e["retired"] for e in full["entries"][:-keep])


def test_a_framed_dump_read_from_its_file_equals_a_full_decode(tmp_path: Path) -> None:
    """From a file (read at both ends, frames followed by 9-byte reads), protocol 5 included."""
    dump = _dump_of(3000, first_id=9000, late_frame_at=1500, stuck_at=None, fresh_every=7)
    for protocol in (4, 5):
        path = tmp_path / f"t_{protocol}"
        path.write_bytes(pickle.dumps(dump, protocol=protocol))
        assert path.read_bytes()[2] == 0x95  # framed
        loaded = load_dump(path, recent=128)
        assert loaded.total_entries == 3000
        assert loaded.entries == dump["entries"][-128:]


@functools.cache
def _base_dump_p4() -> bytes:
    return pickle.dumps(loads_plain(_big_dump(1200)), protocol=4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_framed_pickles_never_decode_to_something_else(data: st.DataObject) -> None:
    """As :func:`test_mutated_big_pickles_never_decode_to_something_else`, for protocol 4 (frame
    lengths, MEMOIZE and references to index 0 among the bytes flipped)."""
    _mutated_decodes_as_a_full_decode(
        _base_dump_p4(), data, lambda rng: rng.choice([0x00, 0x94, 0x95, ord("h"), rng.randrange(256)])
    )


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=24,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES, st.booleans(), st.booleans())
def test_the_newest_json_entries_decode_as_json_does(value: Any, ascii_only: bool, dup: bool) -> None:
    """With msgspec imported (large sets), its decoder gives json's values, types included (True is not
    1, -0.0 is not 0), or refuses and json decodes: NaN, infinities, lone surrogates, duplicate keys."""
    import msgspec  # noqa: F401 (imported: the decoder uses it)

    from sentinel.fr.recent_json import _json_loads

    text = json.dumps(value, ensure_ascii=ascii_only, sort_keys=True, separators=(",", ":"))
    if dup and text.startswith("{") and text != "{}":
        text = '{"k":1,' + text[1:-1] + ',"k":[2]}'
    raw = text.encode("utf-8", "surrogatepass")
    assert repr(_json_loads(raw)) == repr(json.loads(raw))


@functools.cache
def _ops_p2(protocol: int) -> tuple[bytes, list[tuple[str, Any, int, int]]]:
    """A wrapped dump pickled by Python's pickler with ``protocol`` (2 or 3: explicit memo indices),
    cut into its opcodes: (name, argument, start, end)."""
    blob = pickle.dumps(
        _dump_of(1200, first_id=5000, late_frame_at=None, stuck_at=None, fresh_every=0), protocol=protocol
    )
    ops = [(op.name, arg, pos or 0) for op, arg, pos in pickletools.genops(blob)]
    ends = [pos for _, _, pos in ops[1:]] + [len(blob)]
    return blob, [(name, arg, pos, end) for (name, arg, pos), end in zip(ops, ends, strict=True)]


def _ref_bytes(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + index.to_bytes(4, "little")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(protocol=st.sampled_from([2, 3]), data=st.data())
def test_memoize_in_an_explicit_index_pickle_decodes_as_a_full_decode(
    protocol: int, data: st.DataObject
) -> None:
    """Hand-made protocol 2 and 3 streams: MEMOIZE (whose index is implied by the count of objects
    stored before: no pickler of these protocols writes it) in place of a BINPUT or after one, in the
    header, the first entries, the skipped middle or the newest entries, and references to the indices
    it implies or to index 0. The newest-entries decode, handed the first entries' memo, is the full
    decode's or refuses."""
    blob, ops = _ops_p2(protocol)
    puts = [i for i, op in enumerate(ops) if op[0] in ("BINPUT", "LONG_BINPUT")]
    gets = [i for i, op in enumerate(ops) if op[0] in ("BINGET", "LONG_BINGET")]
    zone = data.draw(st.sampled_from(["head", "middle", "tail"]))
    n = len(ops)
    bounds = {"head": (0, n // 50), "middle": (n // 4, 3 * n // 4), "tail": (n - n // 10, n)}
    lo, hi = bounds[zone]
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    in_zone = [i for i in puts if lo <= i < hi] or puts
    edits: dict[int, bytes] = {}
    for _ in range(data.draw(st.integers(1, 6))):
        i = rng.choice(in_zone)
        raw = blob[ops[i][2] : ops[i][3]]
        edits[i] = b"\x94" if rng.random() < 0.5 else raw + b"\x94"
    gets_in_zone = [i for i in gets if lo <= i < hi] or gets
    memo_size = len(puts)
    for _ in range(data.draw(st.integers(0, 4))):
        i = rng.choice(gets_in_zone)
        target = rng.choice([0, 1, memo_size, memo_size + 1, rng.randrange(memo_size + 2)])
        edits[i] = _ref_bytes(target)
    _decodes_as_a_full_decode(b"".join(edits.get(i, blob[op[2] : op[3]]) for i, op in enumerate(ops)), 128)


def test_a_json_dump_refused_names_the_field_the_file_holds_first(tmp_path: Path) -> None:
    """Decoded into the fields the analysis reads (msgspec imported), an entry's keys come in the
    struct's order; a dump refused so is read again as the file holds it, so the error names the bad
    field that comes first in the file, as without msgspec."""
    from sentinel.fr.dumpset import summarize_file
    from sentinel.fr.loader import DumpFile

    dump = _dump_of(1500, first_id=7000, late_frame_at=None, stuck_at=None, fresh_every=0)
    # torch's first key, then two fields msgspec checks, in the other order than the struct declares
    first = ("collective_seq_id", "time_discovered_started_ns", "op_id")
    dump["entries"] = [{**{k: e.get(k) for k in first}, **e} for e in dump["entries"]]
    dump["entries"][-1]["time_discovered_started_ns"] = dump["entries"][-1]["op_id"] = "not a number"
    path = tmp_path / "nccl_trace_rank_0.json"
    path.write_text(json.dumps(dump, separators=(",", ":")))  # compact as torch writes it, keys unsorted
    assert load_dump(path, recent=128).fields_only  # (the newest entries alone, their fields only)
    with pytest.raises(FrFormatError) as fast:
        summarize_file(DumpFile(str(path), 0, "nccl_trace_rank_"), 128, coerce=True)
    assert "time_discovered_started_ns" in str(fast.value)
    plain = load_dump(path, recent=128, fields_only=False)
    assert not plain.fields_only
    with pytest.raises(FrFormatError) as slow:
        summarize(plain, coerce=True)
    assert str(fast.value) == str(slow.value)


def test_a_json_trailer_larger_than_the_first_read_of_the_back(tmp_path: Path) -> None:
    """pg_config lists every rank of the world group: at 100,000 ranks the trailer alone is larger
    than the back first read; the newest entries are still read from both ends."""
    dump = _dump_of(1500, first_id=7000, late_frame_at=None, stuck_at=None, fresh_every=0)
    ranks = json.dumps(list(range(100_000)))
    assert len(ranks) > ByteView.JSON_BACK
    dump["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}
    path = tmp_path / "nccl_trace_rank_0.json"
    path.write_text(json.dumps(dump, sort_keys=True, separators=(",", ":")))
    fast = load_dump(path, recent=128)
    assert fast.total_entries == 1500
    assert fast.pg_config == dump["pg_config"]
    newest = json.loads(path.read_text())["entries"][-128:]
    assert fast.entries == [{k: v for k, v in e.items() if k in ENTRY_KEYS} for e in newest]
