"""No traceback, ever: hostile or merely unusual dumps give an analysis or one line naming the file (exit 2),
in bounded time and memory; links, FIFOs and devices are refused; names are escaped on the terminal.

The fuzzers are structure-aware: they build dumps the way PyTorch lays them out and then plant deep
nesting, huge integers, shared references (one object referenced from many entries, as the pickle memo
makes them), wrong types and ring buffers that do not overlap.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.aggregator.frdumps import analyze_dumps
from sentinel.fr.analysis import analyze
from sentinel.fr.dumpset import analyze_dir
from sentinel.fr.errors import FrFormatError
from sentinel.fr.loader import parse_dump
from sentinel.fr.summary import summarize
from sentinel.fr.workers import MEMORY_BUDGET, Cancelled, run_pool, split_memory
from tests.fr.synth import entry, write
from tests.support import REPO


def _cli(folder: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sentinel", "fr", "analyze", str(folder), *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def _steps(pg: str, seqs: range, desc: str = "default_pg") -> list[dict[str, Any]]:
    return [entry(pg, s, desc=desc, t_ms=10 * s) for s in seqs]


def _deep_list_pickle(depth: int) -> bytes:
    """A dump whose first entry's input_sizes is a list nested ``depth`` deep (built opcode by opcode:
    Python's own pickler refuses to write it)."""
    es = _steps("0", range(1, 4))
    es[0]["input_sizes"] = "@@DEEP@@"
    blob = pickle.dumps({"version": "2.10", "pg_status": {}, "entries": es}, protocol=2)
    marker = b"X\x08\x00\x00\x00@@DEEP@@"
    deep = b"](" * depth + b"]" + b"e" * depth  # EMPTY_LIST MARK ... EMPTY_LIST, APPENDS ...
    assert marker in blob
    return blob.replace(marker, deep)


def test_non_overlapping_ring_buffers_give_an_analysis(tmp_path: Path) -> None:
    write(tmp_path, 0, _steps("0", range(1, 60)))
    write(tmp_path, 1, _steps("0", range(500, 560)))
    result = analyze_dir(tmp_path, workers=0)
    assert result.verdict in ("healthy", "hang", "inconclusive", "straggler")


def test_deep_nesting_in_input_sizes_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(_deep_list_pickle(6000))
    write(tmp_path, 1, _steps("0", range(1, 4)))
    proc = _cli(tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "nccl_trace_rank_0" in proc.stderr and "input_sizes" in proc.stderr


def test_deep_nesting_in_json_is_one_line(tmp_path: Path) -> None:
    body = json.dumps({"version": "2.10", "entries": [{"input_sizes": "@"}]}).replace(
        '"@"', "[" * 6000 + "]" * 6000
    )
    (tmp_path / "nccl_trace_rank_0.json").write_text(body)
    proc = _cli(tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "nccl_trace_rank_0.json" in proc.stderr


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("time_created_ns", 2**70),
        ("collective_seq_id", 2**80),
        ("pg_id", -(2**90)),
        ("input_sizes", [[2**100]]),
    ],
)
def test_integers_beyond_64_bits_are_one_line(tmp_path: Path, field: str, value: Any) -> None:
    es = _steps("0", range(1, 5))
    es[0][field] = value
    write(tmp_path, 0, es)
    write(tmp_path, 1, _steps("0", range(1, 5)))
    proc = _cli(tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert "Traceback" not in proc.stderr and "nccl_trace_rank_0" in proc.stderr
    assert "64-bit" in proc.stderr


def test_huge_all_gather_shape_costs_linear_time(tmp_path: Path) -> None:
    es = _steps("0", range(1, 5))
    es.append(entry("0", 5, "all_gather", desc="default_pg", out=[[2**62] * 100_000], done=False, t_ms=60))
    write(tmp_path, 0, es)
    write(tmp_path, 1, _steps("0", range(1, 5)))
    started = time.process_time()
    with pytest.raises(FrFormatError, match="nccl_trace_rank_0"):
        analyze_dir(tmp_path, workers=0)
    assert time.process_time() - started < 5  # was 51 s (quadratic big-integer products)


def test_shared_references_are_read_once_each(tmp_path: Path) -> None:
    one = entry("0", 1, desc="default_pg")
    dump = {"version": "2.10", "pg_status": {}, "entries": [one] * 3000}  # the memo makes them one object
    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps(dump, protocol=2))
    write(tmp_path, 1, _steps("0", range(1, 2)))
    result = analyze_dir(tmp_path, workers=1)
    assert result.verdict == "healthy"


def test_symlinks_fifos_and_devices_are_refused_with_a_line(tmp_path: Path) -> None:
    write(tmp_path, 0, _steps("0", range(1, 4)))
    cases: dict[str, Callable[[Path], None]] = {
        "nccl_trace_rank_1": lambda p: p.symlink_to("/etc/hostname"),
        "nccl_trace_rank_2": lambda p: os.mkfifo(p),
        "nccl_trace_rank_3": lambda p: p.symlink_to("/dev/zero"),
    }
    for name, make in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        write(folder, 0, _steps("0", range(1, 4)))
        make(folder / name)
        proc = _cli(folder)
        assert proc.returncode == 2, (name, proc.stdout)
        assert name in proc.stderr and "refused" in proc.stderr
        assert "left no dump" not in proc.stdout
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "host-a").symlink_to(tmp_path / "nccl_trace_rank_2")
    with pytest.raises(FrFormatError, match="symbolic link"):
        analyze_dir(linked, workers=0)


def test_escape_sequences_in_names_never_reach_the_terminal(tmp_path: Path) -> None:
    for r in range(2):
        es = _steps("7", range(1, 4), desc="tp\x1b[2J\x1b]0;pwned\x07")
        es.append(entry("7", 4, desc="tp\x1b[2J", done=False, t_ms=50))
        folder = tmp_path / "host\x1b[31m"
        write(folder, r, es if r == 0 else es[:-1])
    proc = _cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "\\x1b" in proc.stdout
    (tmp_path / "host\x1b[31m" / "nccl_trace_rank_1").write_bytes(b"garbage")
    proc = _cli(tmp_path)
    assert proc.returncode == 2 and "\x1b" not in proc.stderr and "\\x1b[31m" in proc.stderr


# ---------------------------------------------------------------- worker bounds


def _spin(_path: str, _rank: int, _prefix: str) -> Any:
    while True:
        pass


def _sleep(_path: str, _rank: int, _prefix: str) -> Any:
    time.sleep(60)


def _hog(_path: str, _rank: int, _prefix: str) -> Any:
    return bytearray(4 << 30)


def test_memory_budget_is_shared_not_multiplied() -> None:
    for workers in (1, 2, 8, 32):
        started, each = split_memory(workers)
        assert started * each <= MEMORY_BUDGET
    jobs = [(0, "/x/nccl_trace_rank_0", 0, "nccl_trace_rank_")]
    with pytest.raises(FrFormatError, match=r"nccl_trace_rank_0.*memory"):
        run_pool(jobs, _hog, workers=1, batch=1, start_method="fork")


def test_cpu_limit_per_dump_names_the_dump() -> None:
    jobs = [(i, f"/x/nccl_trace_rank_{i}", i, "nccl_trace_rank_") for i in range(2)]
    with pytest.raises(FrFormatError, match=r"nccl_trace_rank_0.*CPU"):
        run_pool(jobs, _spin, workers=1, batch=2, start_method="fork", cpu_s=1.0)


def test_cancel_kills_the_workers_at_once() -> None:
    cancel = threading.Event()
    jobs = [(i, f"/x/{i}", i, "") for i in range(4)]
    timer = threading.Timer(0.3, cancel.set)
    timer.start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        run_pool(jobs, _sleep, workers=2, batch=1, start_method="fork", cancel=cancel)
    assert time.monotonic() - started < 2.0


def test_aggregator_gets_a_reason_not_an_exception(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(_deep_list_pickle(6000))
    out = analyze_dumps(tmp_path, workers=1)
    assert "nccl_trace_rank_0" in out["error"]
    cancel = threading.Event()
    cancel.set()
    write(tmp_path / "ok", 0, _steps("0", range(1, 4)))
    assert "cancelled" in analyze_dumps(tmp_path / "ok", workers=1, cancel=cancel)["error"]


# ---------------------------------------------------------------- structure-aware fuzzing

_huge = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.just(2**64), st.just(-(2**63) - 1), st.just(2**63)
)
_leaf = st.one_of(st.none(), st.booleans(), _huge, st.floats(allow_nan=True), st.text(max_size=8))
_nested = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner), max_leaves=12)


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


class _Dict(dict[Any, Any]):
    """A dict subclass (an in-process caller's entry)."""


class _Str(str):
    """A str subclass: no pickle or JSON decodes one, but an in-process caller may hand one over."""


_shapes = st.lists(  # tensor shapes with the odd dim: bool (an int subclass), None, float, huge, a list
    st.lists(
        st.one_of(st.integers(0, 99), st.booleans(), st.none(), st.just(64.0), _huge, st.just([1])),
        max_size=3,
    ),
    max_size=2,
)
_field_values = st.one_of(
    _leaf,
    _nested,
    st.integers(200, 3000).map(_deep),
    st.integers(-(2**60), 2**60).map(float),  # an integral float where an int belongs
    st.integers(-(2**70), 2**70).map(str),  # a number as text
    st.sampled_from(["completed", "scheduled", "nccl:all_reduce", "Float", "true"]).map(_Str),
    _shapes,
    st.lists(st.one_of(st.just("Float"), st.none(), st.just(_Str("Float")), st.integers()), max_size=2),
    st.tuples(st.text(max_size=3), st.text(max_size=3)),
    st.tuples(st.text(max_size=3).map(_Str), st.one_of(st.none(), st.integers())),
)
_fields = st.sampled_from(
    [
        "profiling_name",
        "process_group",
        "collective_seq_id",
        "time_created_ns",
        "input_sizes",
        "output_sizes",
        "input_dtypes",
        "state",
        "retired",
        "pg_id",
        "p2p_seq_id",
        "is_p2p",
        "op_id",
        "seq_id",
        "duration_ms",
        "time_discovered_started_ns",
    ]
)
_status_fields = st.sampled_from(
    ["last_enqueued_collective", "last_started_collective", "last_completed_collective", "other"]
)
_config_fields = st.sampled_from(["name", "desc", "ranks", "other"])
#: pg_config member lists (JSON text, as PyTorch writes them), nested past the JSON parser's limit, odd
_member_lists = st.sampled_from(["[" * 50_000, "[0.5, NaN, 1e400]", "[0, 1]"])
_config_values = st.one_of(
    _member_lists,
    st.lists(st.one_of(st.integers(0, 9), _huge, st.booleans()), max_size=4).map(json.dumps),
    st.sampled_from(["0", "default_pg"]),
    _field_values,
)
_op_names = st.sampled_from(
    [
        "nccl:send 0->1",
        "nccl:recv 0<-1",
        "nccl:send 1->0",
        "nccl:recv 1<-0",
        "nccl:isend",
        "gloo:send 0->1",
        "nccl:send 99999999999999999999999->1",
        "nccl:recv -5<-1",
        "nccl:all_gather",
        "gloo:barrier",
        "nccl:_coalesced",
        "nccl:allreduce_coalesced",
        "mpi:broadcast",
        "all_reduce",
        "",
    ]
)
#: Entry keys: the fields, unknown names, and keys a pickle can hold that are not strings at all
_keys = st.one_of(
    _fields,
    _fields.map(_Str),
    st.just("unknown_field"),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.binary(max_size=4),
    st.floats(allow_nan=False),
    st.tuples(st.integers(0, 3)),
)


@st.composite
def _dump_sets(draw: st.DrawFn) -> list[dict[str, Any]]:
    ranks = draw(st.integers(1, 4))
    dumps = []
    for _ in range(ranks):
        first = draw(st.sampled_from([1, 1, 1, 400]))  # sometimes a buffer that overlaps no other
        n = draw(st.integers(0, 12))
        es = _steps("0", range(first, first + n))
        if n and draw(st.booleans()):
            es[-1]["retired"] = False
        shared = es[0] if es else None
        for _ in range(draw(st.integers(0, 3))):
            if not es:
                break
            i = draw(st.integers(0, len(es) - 1))
            es[i][draw(_keys)] = draw(_field_values)
        if bool(es) and draw(
            st.booleans()
        ):  # another op: point-to-point ones, with peers or without, coalesced
            i = draw(st.integers(0, len(es) - 1))
            es[i]["profiling_name"] = draw(_op_names)
            es[i]["is_p2p"] = draw(st.sampled_from([None, True, False]))
        if es and draw(st.integers(0, 9)) == 0:  # an entry that is not a dict, or a dict subclass
            i = draw(st.integers(0, len(es) - 1))
            es[i] = draw(st.one_of(_leaf, st.just(_Dict(es[i])), st.lists(st.integers(), max_size=2)))
        if shared is not None and draw(st.booleans()):
            es.extend([shared] * draw(st.integers(1, 5)))  # shared references, as the pickle memo makes them
        status = draw(
            st.one_of(
                st.sampled_from(
                    [
                        {},
                        {"0": {"last_enqueued_collective": first + n, "last_completed_collective": first}},
                        {"0": []},
                    ]
                ),
                st.dictionaries(
                    _keys, st.one_of(_leaf, st.dictionaries(_status_fields, _field_values)), max_size=2
                ),
            )
        )
        config = draw(
            st.one_of(
                st.just({}),
                st.dictionaries(
                    _keys, st.one_of(_leaf, st.dictionaries(_config_fields, _config_values)), max_size=2
                ),
                st.fixed_dictionaries(  # the group the entries name, its member list as it comes
                    {
                        "0": st.fixed_dictionaries(
                            {"name": st.just("0"), "ranks": _member_lists | _config_values},
                            optional={"desc": _leaf},
                        )
                    }
                ),
            )
        )
        dumps.append(
            {
                "version": draw(st.sampled_from(["2.10", "2.4", "9", 7])),
                "pg_status": status,
                "pg_config": config,
                "entries": es,
            }
        )
    return dumps


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_dump_sets())
def test_fuzz_every_dump_set_gives_an_analysis_or_a_format_error(dumps: list[dict[str, Any]]) -> None:
    summaries = []
    try:
        for r, top in enumerate(dumps):
            summaries.append(summarize(parse_dump(top, rank=r, source=f"rank{r}", is_json=False)))
    except FrFormatError as exc:
        assert str(exc).startswith("rank") and "\n" not in str(exc)
        return
    result = analyze(summaries)
    json.dumps(result.to_json())  # the contract's JSON always serialises


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(_dump_sets(), st.booleans())
def test_fuzz_through_files_and_workers(tmp_path: Path, dumps: list[dict[str, Any]], as_json: bool) -> None:
    folder = tmp_path / str(time.monotonic_ns())
    folder.mkdir()
    for r, top in enumerate(dumps):
        try:
            blob = json.dumps(top, skipkeys=True).encode() if as_json else pickle.dumps(top, protocol=2)
        except (ValueError, RecursionError, OverflowError, TypeError):
            blob = b"{" if as_json else b"\x80\x02]"  # too deep for the writer: a truncated file instead
        (folder / f"nccl_trace_rank_{r}{'.json' if as_json else ''}").write_bytes(blob)
    try:
        analyze_dir(folder, workers=1)
    except FrFormatError as exc:
        assert "\n" not in str(exc)


def _summary_or_error(dump: Any, coerce: bool) -> Any:
    try:
        return summarize(dump, coerce=coerce).to_plain()
    except FrFormatError as exc:
        return str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_dump_sets(), st.lists(_fields, max_size=2))
def test_fuzz_reading_entries_directly_or_through_msgspec_agrees(
    dumps: list[dict[str, Any]], dropped: list[str]
) -> None:
    """summarize() reads exactly typed entries itself and sends anything else through msgspec; forced
    through msgspec (what large sets do), every dump gives the same summary or the same error."""
    for r, top in enumerate(dumps):
        for e in top["entries"][:1]:
            for field in dropped:
                if isinstance(e, dict):
                    e.pop(field, None)  # older formats lack fields; a required one missing is an error
        _assert_both_paths_agree(top, r, is_json=False)


def _assert_both_paths_agree(top: Any, rank: int, *, is_json: bool) -> None:
    """The same decoded dump read directly and forced through msgspec: the same summary or the same line."""
    try:
        dump = parse_dump(top, rank=rank, source=f"rank{rank}", is_json=is_json)
    except FrFormatError:
        return
    direct, through_msgspec = _summary_or_error(dump, False), _summary_or_error(dump, True)
    assert direct == through_msgspec
    if isinstance(direct, str):  # one line naming the file (and the entry, when an entry is wrong)
        assert direct.startswith(f"rank{rank}: ") and "\n" not in direct, direct
        assert "entry " not in direct, direct  # entries are named entries[N] on every path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_dump_sets())
def test_fuzz_json_dumps_read_directly_or_through_msgspec_agree(dumps: list[dict[str, Any]]) -> None:
    """JSON keys are always strings but the values vary as much (huge integers, NaN, bools, nesting):
    the dumps written as JSON (keys a JSON object cannot hold skipped) and parsed back agree too."""
    for r, top in enumerate(dumps):
        try:
            text = json.dumps(top, skipkeys=True)
        except (ValueError, RecursionError):
            continue  # nested deeper than the writer goes
        _assert_both_paths_agree(json.loads(text), r, is_json=True)
