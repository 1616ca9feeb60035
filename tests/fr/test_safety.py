"""Hostile and broken dump files are refused with our one error type, and nothing in them runs."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import pickle
import random
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.fr.dumpset import analyze_dir, limited_address_space
from sentinel.fr.errors import FrFormatError
from sentinel.fr.loader import decode, gunzip_bounded, load_dump, parse_dump
from sentinel.fr.safepickle import MemoryReader, PartsReader, loads_plain, plain_unpickler
from sentinel.fr.summary import summarize
from tests.fr.conftest import corpus_folders


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _real_pickle() -> bytes:
    folder = next(p for p in corpus_folders() if p.name.startswith("hang_n4"))
    return (folder / "pickle" / "comm_lib_trace_rank_0").read_bytes()


def test_reduce_exploit_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"version": "2.10", "entries": [_Exploit(marker)]}, protocol=2)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "nccl_trace_rank_0").write_bytes(payload)
    with pytest.raises(FrFormatError, match="refused global"):
        analyze_dir(dumps, workers=1)
    assert not marker.exists()
    # sanity: the payload really would run when loaded the unsafe way
    pickle.loads(payload)
    assert marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        b"\x80\x02cos\nsystem\nq\x00.",  # GLOBAL
        b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93.",  # STACK_GLOBAL
        b"\x80\x02(cos\nsystem\nX\x04\x00\x00\x00truei.",  # INST
        b"\x80\x02}q\x00X\x01\x00\x00\x00ab.",  # BUILD on a dict
        b"\x80\x02]q\x00)R.",  # REDUCE with a list as the callable
        b"\x80\x02]q\x00)\x81.",  # NEWOBJ with a list as the class
        b"\x80\x02\x82\x01.",  # EXT1
        b"\x80\x02X\x01\x00\x00\x00aQ.",  # BINPERSID
        b"\x80\x02",  # truncated
        b"",
    ],
)
def test_code_paths_and_corrupt_pickles_are_refused(payload: bytes) -> None:
    with pytest.raises(FrFormatError):
        loads_plain(payload, source="x")


def test_memo_index_bomb_is_refused_by_the_worker_limit(tmp_path: Path) -> None:
    # EMPTY_LIST, LONG_BINPUT 2^31-1: the C unpickler would grow its memo to 16 GiB
    (tmp_path / "trace_rank_0").write_bytes(b"\x80\x02]r\xff\xff\xff\x7f.")
    with pytest.raises(FrFormatError, match="trace_rank_0"):
        analyze_dir(tmp_path, workers=1)


def test_gzip_bomb_is_bounded() -> None:
    bomb = gzip.compress(b"\0" * (4 << 20))
    with pytest.raises(FrFormatError, match="expands beyond"):
        gunzip_bounded(bomb, 1 << 20, source="bomb")


def _decode_all(data: bytes) -> None:
    with limited_address_space(1 << 30):  # a mutated memo index can ask for gigabytes
        obj, is_json = decode(data, source="fuzz")
        dump = parse_dump(obj, rank=0, source="fuzz", is_json=is_json)
        summarize(dump)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_random_bytes_only_raise_our_error(data: bytes) -> None:
    with contextlib.suppress(FrFormatError):
        _decode_all(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_real_pickles_only_raise_our_error(data: st.DataObject) -> None:
    original = bytearray(_real_pickle())
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1)))
    for _ in range(data.draw(st.integers(1, 8))):
        kind = rng.randrange(3)
        pos = rng.randrange(len(original))
        if kind == 0:
            original[pos] = rng.randrange(256)
        elif kind == 1:
            del original[pos : pos + rng.randrange(1, 64)]
        else:
            original[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
    with contextlib.suppress(FrFormatError):
        _decode_all(bytes(original))


@settings(max_examples=150, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
        max_leaves=30,
    )
)
def test_any_plain_structure_only_raises_our_error(obj: object) -> None:
    for candidate in (obj, {"version": "2.10", "entries": [obj]}, {"version": "2.3", "entries": obj}):
        with contextlib.suppress(FrFormatError):
            _decode_all(pickle.dumps(candidate, protocol=2))


@settings(max_examples=150, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
        max_leaves=30,
    ),
    st.sampled_from([0, 1, 2, 3, 4, 5]),
)
def test_plain_data_decodes_as_pickle_loads_does(obj: object, protocol: int) -> None:
    """Through :class:`MemoryReader` the no-globals unpickler decodes plain data exactly as
    :func:`pickle.loads` does, for every protocol's opcodes: text ones (read line by line) behind a
    protocol-2 header as a hostile file could put them, and protocol 4-5 frames."""
    raw = pickle.dumps(obj, protocol=protocol)
    data = raw if protocol >= 2 else b"\x80\x02" + raw
    assert loads_plain(data) == pickle.loads(data)


def test_strings_longer_than_the_unpickler_prefetch_decode_whole() -> None:
    # over 128 KiB the C unpickler reads past its buffer with read(n), not peek()
    obj = {"ranks": "x" * 300_000, "entries": ["z" * 140_000, 7]}
    for protocol in (2, 4, 5):
        assert loads_plain(pickle.dumps(obj, protocol=protocol)) == obj
    raw = {"entries": [b"y" * 200_000]}  # BINBYTES8 read with readinto
    assert loads_plain(pickle.dumps(raw, protocol=5)) == raw
    with pytest.raises(FrFormatError):  # cut inside the long string: refused, never read past the end
        loads_plain(pickle.dumps(obj, protocol=2)[:200_000])


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=300), st.lists(st.tuples(st.sampled_from("prli"), st.integers(-1, 64)), max_size=20)
)
def test_memory_reader_reads_as_a_file_does(data: bytes, calls: list[tuple[str, int]]) -> None:
    """peek/read/readline/readinto give what a file over the same bytes gives (peek may give more)."""
    _reads_as_a_file(MemoryReader(data), data, calls, whole_peek=True)


def _reads_as_a_file(
    ours: MemoryReader | PartsReader, data: bytes, calls: list[tuple[str, int]], *, whole_peek: bool
) -> None:
    """Each call on ``ours`` gives what the same call on a file over ``data`` gives; ``peek`` gives all that
    follows (``whole_peek``) or a start of it (at least a byte, unless all was read)."""
    ref = io.BytesIO(data)
    for call, n in calls:
        if call == "p":
            got = bytes(ours.peek(n))
            rest = data[ref.tell() :]
            assert got == rest if whole_peek else rest.startswith(got) and (got or not rest)
        elif call == "r":
            assert bytes(ours.read(n)) == ref.read(n)
        elif call == "l":
            assert bytes(ours.readline()) == ref.readline()
        else:
            a, b = bytearray(max(n, 0)), bytearray(max(n, 0))
            assert ours.readinto(a) == ref.readinto(b)
            assert a == b


def _cut(data: bytes, cuts: list[int], pad: int) -> list[tuple[bytes, int, int]]:
    """``data`` as ranges of padded copies (each range within bytes that hold more on both sides)."""
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [(b"#" * pad + data[a:b] + b"#" * pad, pad, pad + b - a) for a, b in pairwise(bounds)]


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=300),
    st.lists(st.integers(0, 300), max_size=6),
    st.integers(0, 3),
    st.lists(st.tuples(st.sampled_from("prli"), st.integers(-1, 64)), max_size=20),
)
def test_parts_reader_reads_as_a_file_over_the_joined_bytes_does(
    data: bytes, cuts: list[int], pad: int, calls: list[tuple[str, int]]
) -> None:
    """read/readline/readinto give what a file over the joined ranges gives, never a byte outside them;
    peek gives what follows (at least a byte, unless all was read)."""
    _reads_as_a_file(PartsReader(_cut(data, cuts, pad)), data, calls, whole_peek=False)


@settings(max_examples=150, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
        max_leaves=30,
    ),
    st.sampled_from([0, 2, 4, 5]),
    st.lists(st.integers(0, 400), max_size=6),
    st.integers(0, 400),
)
def test_the_unpickler_reads_parts_as_the_joined_bytes(
    obj: object, protocol: int, cuts: list[int], cut: int
) -> None:
    """Through :class:`PartsReader`, the no-globals unpickler decodes ranges cut anywhere (text opcodes
    and protocol 4-5 frames included) as it decodes the joined bytes, and a truncated pickle fails in
    both the same way."""
    raw = pickle.dumps(obj, protocol=protocol)
    data = raw if protocol >= 2 else b"\x80\x02" + raw
    for whole in (data, data[:cut]):
        try:
            want: object = plain_unpickler(whole).load()
        except Exception as exc:
            want = type(exc)
        try:
            got: object = plain_unpickler(_cut(whole, cuts, 2)).load()
        except Exception as exc:
            got = type(exc)
        assert got == want


def test_real_pickle_and_gzip_load(tmp_path: Path) -> None:
    raw = _real_pickle()
    (tmp_path / "trace_rank_5.gz").write_bytes(gzip.compress(raw))
    dump = load_dump(tmp_path / "trace_rank_5.gz")
    assert dump.rank == 5
    assert dump.version.startswith("2.")
    assert len(dump.entries) > 100
