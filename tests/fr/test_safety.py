"""Hostile and broken dump files are refused with our one error type, and nothing in them runs."""

from __future__ import annotations

import contextlib
import gzip
import os
import pickle
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.fr.dumpset import analyze_dir, limited_address_space
from sentinel.fr.errors import FrFormatError
from sentinel.fr.loader import decode, gunzip_bounded, load_dump, parse_dump
from sentinel.fr.safepickle import loads_plain
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


def test_real_pickle_and_gzip_load(tmp_path: Path) -> None:
    raw = _real_pickle()
    (tmp_path / "trace_rank_5.gz").write_bytes(gzip.compress(raw))
    dump = load_dump(tmp_path / "trace_rank_5.gz")
    assert dump.rank == 5
    assert dump.version.startswith("2.")
    assert len(dump.entries) > 100
