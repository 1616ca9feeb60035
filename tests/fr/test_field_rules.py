"""What an entry field may hold: every case gives the same answer whether the dump is read directly
(sets under ``COERCE_FROM`` dumps, :func:`sentinel.fr.summary.summarize`) or through msgspec (larger
sets, :mod:`sentinel.fr.coerce`), from a pickle or from JSON, decoded in full or only its newest entries.

The rule (see docs/flight-recorder.md, "What is refused, what is ignored"): a key that names no field the
analysis reads — unknown, or not a string at all — is ignored; a value is read as the format's type when
it converts losslessly (``"3"`` or ``3.0`` for 3, ``1`` for True, a ``str`` subclass as its text);
anything else in a field the analysis reads is refused with one line naming the file, the entry
(``entries[N] (record_id R)``) and the field.
"""

from __future__ import annotations

import copy
import functools
import json
import pickle
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sentinel.fr.analysis import analyze
from sentinel.fr.dumpset import COERCE_FROM, _decode_one, analyze_dir
from sentinel.fr.errors import FrFormatError, brief
from sentinel.fr.loader import load_dump, parse_dump
from sentinel.fr.readahead import ReadAhead
from sentinel.fr.recent import decode_recent
from sentinel.fr.summary import summarize
from sentinel.fr.workers import run_pool
from tests.fr.p2p_synth import status_as_works
from tests.fr.synth import entry
from tests.fr.test_hostile import _cli, _field_values, _keys, _op_names, _status_fields

BAD = 2  # the entry each case changes; its record_id is RECORD0 + BAD
RECORD0 = 700


class _Str(str):
    """A str subclass (no decoder makes one; an in-process caller may)."""


def _entries(n: int = 5) -> list[dict[str, Any]]:
    es = [entry("0", s, desc="default_pg", t_ms=10 * s) for s in range(1, n + 1)]
    for i, e in enumerate(es):
        e["record_id"] = RECORD0 + i
    es[-1]["retired"], es[-1]["state"] = False, "scheduled"  # one pending: the summary has content
    return es


def _set(field: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(e: dict[str, Any]) -> None:
        e[field] = value

    return change


def _drop(field: str) -> Callable[[dict[str, Any]], None]:
    def change(e: dict[str, Any]) -> None:
        del e[field]

    return change


SAME = "same as the clean dump"  # ignored, or read as exactly the value the clean dump has
READ = "an analysis"  # accepted (the summary may differ from the clean one)

#: (case, change to entry BAD, whether JSON can express it, expected: SAME, READ or the error's tail)
CASES: list[tuple[str, Callable[[dict[str, Any]], None], bool, str]] = [
    # keys: only names the analysis reads matter
    ("unknown str key", _set("my_field", [[1, 2]]), True, SAME),
    ("int key", _set(7, "x"), True, SAME),  # JSON writes it as "7": an unknown name
    ("bool key", _set(True, 1), True, SAME),
    ("None key", _set(None, 1), True, SAME),
    ("float key", _set(1.5, 1), True, SAME),
    ("bytes key", _set(b"state", 1), False, SAME),
    ("tuple key", _set((1, 2), 1), False, SAME),
    ("str-subclass unknown key", _set(_Str("zz"), 1), False, SAME),
    # values converted losslessly to the format's type
    ("seq as text", _set("collective_seq_id", "3"), True, SAME),
    ("seq as an integral float", _set("collective_seq_id", 3.0), True, SAME),
    ("retired as 1", _set("retired", 1), True, SAME),
    ("profiling_name of a str subclass", _set("profiling_name", _Str("nccl:all_reduce")), False, SAME),
    ("state of a str subclass", _set("state", _Str("completed")), False, SAME),
    ("dtype of a str subclass", _set("input_dtypes", [_Str("Float")]), False, SAME),
    ("process_group as a list", _set("process_group", ["0", "default_pg"]), True, SAME),
    ("sizes as tuples", _set("input_sizes", ((64,),)), False, SAME),
    ("NaN duration", _set("duration_ms", float("nan")), True, SAME),  # no duration, as when absent
    ("inf duration", _set("duration_ms", float("inf")), True, SAME),
    ("negative duration", _set("duration_ms", -1.0), True, SAME),
    ("int duration", _set("duration_ms", 5), True, READ),
    ("no collective_seq_id (old formats)", _drop("collective_seq_id"), True, READ),
    ("no seq at all (old formats)", _set("collective_seq_id", None), True, READ),
    ("unread field of any type", _set("timeout_ms", [[2**80]]), True, SAME),
    # refused, naming the entry and the field
    ("bool for seq", _set("collective_seq_id", True), True, "collective_seq_id: Expected `int | null`, got `bool`"),
    ("bool for time", _set("time_created_ns", False), True, "time_created_ns: Expected `int`, got `bool`"),
    ("bool for pg_id", _set("pg_id", True), True, "pg_id: Expected `int`, got `bool`"),
    ("fractional float for seq", _set("collective_seq_id", 3.5), True, "collective_seq_id: Expected `int | null`, got `float`"),
    ("text for time", _set("time_created_ns", "soon"), True, "time_created_ns: Expected `int`, got `str`"),
    ("None for op_id", _set("op_id", None), True, "op_id: Expected `int`, got `null`"),
    ("seq 2^63", _set("collective_seq_id", 2**63), True, "collective_seq_id: out of range, expected a 64-bit integer"),
    ("time 2^64", _set("time_created_ns", 2**64), True, "time_created_ns: out of range, expected a 64-bit integer"),
    ("time 2^70", _set("time_created_ns", -(2**70)), True, "time_created_ns: out of range, expected a 64-bit integer"),
    ("bool duration", _set("duration_ms", True), True, "duration_ms: Expected `float | null`, got `bool`"),
    ("state not a string", _set("state", 3), True, "state: Expected `str | null`, got `int`"),
    ("retired as text", _set("retired", "maybe"), True, "retired: Expected `bool | null`, got `str`"),
    ("process_group of 3", _set("process_group", ("0", "", "x")), True, "process_group: Expected `array` of length 2, got 3"),
    ("process_group desc not a string", _set("process_group", ("0", 5)), True, "process_group[1]: Expected `str`, got `int`"),
    ("nested list in sizes", _set("input_sizes", [[[1]]]), True, "input_sizes holds dimension a list of 1, expected a 64-bit integer"),
    ("None in sizes", _set("input_sizes", [None]), True, "input_sizes holds None, expected a shape"),
    ("None dim", _set("output_sizes", [[None]]), True, "output_sizes holds dimension None, expected a 64-bit integer"),
    ("bool dim", _set("input_sizes", [[True]]), True, "input_sizes holds dimension True, expected a 64-bit integer"),
    ("float dim", _set("input_sizes", [[64.0]]), True, "input_sizes holds dimension 64.0, expected a 64-bit integer"),
    ("dim 2^64", _set("input_sizes", [[2**64]]), True, "input_sizes holds dimension an integer of 65 bits, expected a 64-bit integer"),
    ("sizes as text", _set("input_sizes", "[[64]]"), True, "input_sizes is '[[64]]', expected a list of shapes"),
    ("None in dtypes", _set("input_dtypes", [None]), True, "input_dtypes holds None, expected a dtype name"),
    ("dtypes as text", _set("output_dtypes", "Float"), True, "output_dtypes is 'Float', expected a list of names"),
    ("no profiling_name", _drop("profiling_name"), True, "profiling_name: missing (a required field)"),
    ("no time_created_ns", _drop("time_created_ns"), True, "time_created_ns: missing (a required field)"),
]  # fmt: skip


def _both(dump: Any) -> tuple[Any, Any]:
    out: list[Any] = []
    for coerce in (False, True):
        try:
            out.append(summarize(dump, coerce=coerce).to_plain())
        except FrFormatError as exc:
            out.append(str(exc))
    return out[0], out[1]


def _check(got: Any, clean: Any, expected: str, where: str) -> None:
    """``got`` is as ``expected`` says: the clean dump's summary, a summary, or the line ``where`` + it."""
    if expected == SAME:
        assert got == clean
    elif expected == READ:
        assert not isinstance(got, str), got
    else:
        assert got == where + expected


def _at(source: str) -> str:
    return f"{source}: entries[{BAD}] (record_id {RECORD0 + BAD}): "


@pytest.mark.parametrize(("change", "expected"), [c[1::2] for c in CASES], ids=[c[0] for c in CASES])
def test_pickled_entry_fields_read_the_same_on_both_paths(
    change: Callable[[dict[str, Any]], None], expected: str
) -> None:
    es = _entries()
    [clean, _] = _both(parse_dump({"version": "2.10", "entries": es}, rank=0, source="F", is_json=False))
    change(es[BAD])
    direct, through_msgspec = _both(
        parse_dump({"version": "2.10", "entries": es}, rank=0, source="F", is_json=False)
    )
    assert direct == through_msgspec
    _check(direct, clean, expected, _at("F"))


@pytest.mark.parametrize(
    ("change", "expected"), [c[1::2] for c in CASES if c[2]], ids=[c[0] for c in CASES if c[2]]
)
def test_json_entry_fields_read_the_same_on_both_paths(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], expected: str
) -> None:
    """torch writes JSON dumps too (``_dump_fr_trace_json``): keys are strings, the values vary as much."""
    es = _entries()
    path = tmp_path / "nccl_trace_rank_0.json"
    path.write_text(json.dumps({"version": "2.10", "entries": es}))
    [clean, _] = _both(load_dump(path))
    change(es[BAD])
    path.write_text(json.dumps({"version": "2.10", "entries": es}))  # int/None/bool keys: as strings
    direct, through_msgspec = _both(load_dump(path))
    assert direct == through_msgspec
    _check(direct, clean, expected, _at(str(path)))


@pytest.mark.parametrize("key", [str, int], ids=["unknown str keys", "int keys"])
def test_one_dict_of_many_keys_shared_by_every_entry_costs_linear_time(tmp_path: Path, key: type) -> None:
    """A pickle's memo lets one dict be every entry: a 20,000-key dict referenced 20,000 times (a 300 KB
    file) cost msgspec 13 s of CPU (it reads every key of every entry it is given), where the direct
    reading took 0.07 s — refused for CPU in a large set, analyzed in a small one. Converted once per
    distinct dict, it now decodes in a worker held to 5 s of CPU, as the direct reading does."""
    e = _entries(1)[0]
    e.update({key(f"{i}" if key is str else i): i for i in range(20_000)})
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": [e] * 20_000}, protocol=2))
    direct, through_msgspec = _both(load_dump(path))
    assert direct == through_msgspec and not isinstance(direct, str)
    jobs = [(0, str(path), 0, "nccl_trace_rank_")]
    for coerce in (False, True):
        [summary] = run_pool(
            jobs,
            partial(_decode_one, recent=None, coerce=coerce, read_ahead=ReadAhead()),
            workers=1,
            batch=1,
            start_method="fork",
            cpu_s=5.0,
        )
        assert summary.to_plain() == direct


def test_a_shared_entry_that_is_wrong_is_named_where_it_first_appears() -> None:
    es = _entries()
    es[BAD].update({f"k{i}": i for i in range(1000)}, time_created_ns="soon")
    es += [es[BAD]] * 10
    dump = parse_dump({"version": "2.10", "entries": es}, rank=0, source="F", is_json=False)
    assert _both(dump) == (_at("F") + "time_created_ns: Expected `int`, got `str`",) * 2


# ---------------------------------------------------------------- large pickles: only the newest entries


def _big_pickle(bad_at: int, change: Callable[[dict[str, Any]], None], n: int = 2000) -> bytes:
    """A PyTorch-shaped pickle large enough for the recent-tail decoder (frames first, as torch writes)."""
    frames = [{"name": f"f{i}", "filename": "train.py", "line": i} for i in range(8)]
    es = []
    for i in range(n):
        e = {"frames": [frames[i % 8]], **entry("0", i + 1, desc="default_pg", t_ms=i)}
        e["record_id"] = RECORD0 + i
        es.append(e)
    change(es[bad_at])
    status = {
        "0": {"last_enqueued_collective": n, "last_completed_collective": n, "last_started_collective": n}
    }
    return pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": status, "entries": es}, protocol=2)


@pytest.mark.parametrize(
    ("change", "expected"),
    [(_set("input_sizes", [[True]]), "input_sizes holds dimension True, expected a 64-bit integer"),
     (_set("collective_seq_id", True), "collective_seq_id: Expected `int | null`, got `bool`"),
     (_drop("profiling_name"), "profiling_name: missing (a required field)"),
     (_set(7, "x"), "")],
)  # fmt: skip
def test_a_bad_newest_entry_is_named_by_its_index_in_the_file(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], expected: str
) -> None:
    """Only the newest 128 entries of a large pickle are decoded; the error names the entry's index in
    the file, as a full decode of the same file does."""
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(_big_pickle(1990, change))
    tail, full = load_dump(path, recent=128), load_dump(path, recent=None)
    assert tail.total_entries == 2000 and len(tail.entries) == 128  # the tail decoder was used
    (tail_direct, tail_msgspec), (full_direct, full_msgspec) = _both(tail), _both(full)
    assert tail_direct == tail_msgspec and full_direct == full_msgspec
    if not expected:  # ignored: both decodes give an analysis
        assert not isinstance(tail_direct, str) and not isinstance(full_direct, str)
        return
    assert tail_direct == full_direct == f"{path}: entries[1990] (record_id {RECORD0 + 1990}): {expected}"


# ---------------------------------------------------------------- the command, either side of COERCE_FROM


def _write_set(
    folder: Path, ranks: int, change: Callable[[dict[str, Any]], None] | None, *, as_json: bool = False
) -> Path:
    """``ranks`` small dumps; ``change`` applied to rank 1's entry BAD. The path of rank 1's dump."""
    folder.mkdir()
    for r in range(ranks):
        es = _entries()
        if change is not None and r == 1:
            change(es[BAD])
        top = {"version": "2.10", "pg_status": {}, "entries": es}
        path = folder / f"nccl_trace_rank_{r}{'.json' if as_json else ''}"
        path.write_bytes(json.dumps(top).encode() if as_json else pickle.dumps(top, protocol=2))
    return folder / f"nccl_trace_rank_1{'.json' if as_json else ''}"


@pytest.mark.parametrize(
    ("change", "expected", "as_json"),
    [
        (_set("input_sizes", [["64"]]), "input_sizes holds dimension '64', expected a 64-bit integer", False),
        (_set("collective_seq_id", True), "collective_seq_id: Expected `int | null`, got `bool`", False),
        (_set("time_created_ns", 2**64), "time_created_ns: out of range, expected a 64-bit integer", True),
        (_drop("profiling_name"), "profiling_name: missing (a required field)", True),
    ],
    ids=["pickle: a dim as text", "pickle: bool for int", "json: 2^64", "json: a required field missing"],
)
def test_the_command_refuses_the_same_line_below_and_at_coerce_from(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], expected: str, as_json: bool
) -> None:
    """The real threshold: 4 dumps are read directly, COERCE_FROM dumps through msgspec. A bad field is
    the same one line either way: exit 2, no traceback, the file, the entry, its record_id, the field."""
    for ranks in (4, COERCE_FROM):
        bad = _write_set(tmp_path / f"bad{ranks}", ranks, change, as_json=as_json)
        proc = _cli(bad.parent, "--json")
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
        assert proc.stderr == (
            f"sentinel fr analyze: {bad}: entries[{BAD}] (record_id {RECORD0 + BAD}): {expected}\n"
        )


def test_the_command_ignores_a_key_that_is_not_a_string_below_and_at_coerce_from(tmp_path: Path) -> None:
    for ranks in (4, COERCE_FROM):
        clean, keyed = tmp_path / f"clean{ranks}", tmp_path / f"keyed{ranks}"
        _write_set(clean, ranks, None)
        _write_set(keyed, ranks, _set(7, "an int key"))
        out_clean, out_keyed = _cli(clean, "--json"), _cli(keyed, "--json")
        assert out_keyed.returncode == 0 == out_clean.returncode, out_keyed.stderr
        assert json.loads(out_keyed.stdout.replace(str(keyed), str(clean))) == json.loads(out_clean.stdout)


# ---------------------------------------------------------------- pg_status and pg_config

#: (case, top-level fields, expected: SAME, READ or the error's tail after "F: ")
TOP_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("status as text (JSON dumps)", {"pg_status": {"0": {"last_enqueued_collective": "5"}}}, READ),
    ("status as an integral float", {"pg_status": {"0": {"last_enqueued_collective": 5.0}}}, READ),
    ("status key as an int", {"pg_status": {0: {"last_enqueued_collective": 5}}}, READ),
    ("status inf", {"pg_status": {"0": {"last_enqueued_collective": float("inf")}}},
     "pg_status['0']: last_enqueued_collective is inf, expected a 64-bit integer"),
    ("status NaN", {"pg_status": {"0": {"last_completed_collective": float("nan")}}},
     "pg_status['0']: last_completed_collective is nan, expected a 64-bit integer"),
    ("status bool", {"pg_status": {"0": {"last_started_collective": True}}},
     "pg_status['0']: last_started_collective is True, expected a 64-bit integer"),
    ("status 2^64", {"pg_status": {"0": {"last_enqueued_collective": 2**64}}},
     "pg_status['0']: last_enqueued_collective is an integer of 65 bits, expected a 64-bit integer"),
    ("status key bool", {"pg_status": {True: {}}}, "pg_status key is True, expected a 64-bit integer"),
    ("status key tuple", {"pg_status": {(0,): {}}}, "pg_status key is a tuple of 1, expected a 64-bit integer"),
    ("status not a dict", {"pg_status": {"0": [5]}}, "pg_status['0'] is not a dict"),
    # pg_config is advisory (gloo writes an empty one): what cannot be used is ignored
    ("config ranks nested 100,000 deep", {"pg_config": {"0": {"name": "0", "ranks": "[" * 100_000}}}, SAME),
    ("config ranks of bools", {"pg_config": {"0": {"name": "0", "ranks": [True, False]}}}, SAME),
    ("config ranks beyond any group", {"pg_config": {"0": {"name": "0", "ranks": [2**70]}}}, SAME),
    ("config ranks floats and NaN", {"pg_config": {"0": {"name": "0", "ranks": "[0.5, NaN, 1e400]"}}}, SAME),
    ("config name not a string", {"pg_config": {"0": {"name": ["0"], "ranks": [0]}}}, SAME),
    ("config key an int", {"pg_config": {0: {"ranks": [0]}}}, SAME),
    ("config not a dict", {"pg_config": {"0": [0]}}, SAME),
    ("config desc not a string", {"pg_config": {"x": {"name": "0", "ranks": [0], "desc": 5}}}, READ),
]  # fmt: skip


@pytest.mark.parametrize(("top", "expected"), [c[1:] for c in TOP_CASES], ids=[c[0] for c in TOP_CASES])
def test_pg_status_and_pg_config_read_the_same_on_both_paths(top: dict[str, Any], expected: str) -> None:
    [clean, _] = _both(
        parse_dump({"version": "2.10", "entries": _entries()}, rank=0, source="F", is_json=False)
    )
    dump = parse_dump({"version": "2.10", "entries": _entries(), **top}, rank=0, source="F", is_json=False)
    direct, through_msgspec = _both(dump)
    assert direct == through_msgspec
    _check(direct, clean, expected, "F: ")


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 2**70, "x", True], ids=repr)
def test_a_bad_pg_status_is_the_same_line_from_the_newest_entries_or_a_full_decode(
    tmp_path: Path, value: Any
) -> None:
    """The recent-tail decoder first asks whether the newest entries are enough (from pg_status): an
    infinite float there raised OverflowError (a traceback in-process), where a full decode names it."""
    obj = pickle.loads(_big_pickle(5, lambda e: None))
    obj["pg_status"]["0"]["last_enqueued_collective"] = value
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(obj, protocol=2))
    answers = set()
    for recent in (128, None):
        with pytest.raises(FrFormatError) as caught:
            summarize(load_dump(path, recent=recent))
        answers.add(str(caught.value))
    assert answers == {
        f"{path}: pg_status['0']: last_enqueued_collective is {brief(value)}, expected a 64-bit integer"
    }


# ---------------------------------------------------------------- the newest entries against a full decode

_BIG = pickle.loads(_big_pickle(0, lambda e: None))


def _p2p_at(top: dict[str, Any], index: int, done: bool, *, rank: int = 0, send: bool = True) -> None:
    """Entry ``index`` of ``rank``'s dump (of a pair of ranks) becomes an ``isend`` to / ``irecv`` from the
    other rank, as ProcessGroupNCCL records it: the group's send/recv count (``p2p_seq_id``) includes it
    from there on, later collectives are numbered on without it. An entry that already is one stays."""
    es = top["entries"]
    e = es[index]
    if e.get("is_p2p"):
        return
    peer = 1 - rank
    e.update(
        profiling_name=f"nccl:send {rank}->{peer}" if send else f"nccl:recv {rank}<-{peer}",
        is_p2p=True,
        p2p_seq_id=e["p2p_seq_id"] + 1,
        collective_seq_id=e["collective_seq_id"] - 1,
        retired=done,
        state="completed" if done else "started",
    )
    for later in es[index + 1 :]:
        later["collective_seq_id"] -= 1
        later["p2p_seq_id"] += 1
    newest = es[-1]["collective_seq_id"]
    top["pg_status"]["0"].update(last_enqueued_collective=newest, last_completed_collective=newest)


def _send_at(top: dict[str, Any], index: int, done: bool) -> None:
    """Entry ``index`` becomes an ``isend`` from rank 0 to rank 1."""
    _p2p_at(top, index, done)


def _analysis_or_line(folder: Path, recent: int | None) -> Any:
    """The analysis of the set (as ``sentinel fr analyze`` reads it, in-process), or its error line."""
    try:
        return analyze_dir(folder, workers=0, recent=recent).to_json()
    except FrFormatError as exc:
        return str(exc)


@pytest.mark.parametrize("done", [False, True], ids=["pending", "completed"])
@pytest.mark.parametrize("at", [500, 1990], ids=["before the newest entries", "among them"])
def test_a_send_behind_later_collectives_is_seen_from_the_newest_entries(
    tmp_path: Path, at: int, done: bool
) -> None:
    """An ``isend`` to rank 1 still pending while rank 0 ran 1,500 more collectives of its group:
    pg_status says the group is done, only the send's entry says rank 0 is blocked in it. From the newest
    128 entries that was "healthy" where the full decode says "hang" — now a group whose newest entries
    count a send/recv before them keeps the newest entries only when no skipped entry is pending (NCCL;
    gloo records none): the pending send is decoded in full, the completed one is not."""
    for r in range(2):
        top = copy.deepcopy(_BIG)
        if r == 0:
            _send_at(top, at, done)
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(top, protocol=2))
    tail, full = _analysis_or_line(tmp_path, 128), _analysis_or_line(tmp_path, None)
    assert tail == full
    if not done:
        assert full["verdict"] == "hang" and full["collective"]["op"] == "send", full
    fast = load_dump(tmp_path / "nccl_trace_rank_0", recent=128)
    assert (fast.total_entries < 0) == (at == 500 and not done)
    assert len(fast.entries) == (2000 if at == 500 and not done else 128)
    assert load_dump(tmp_path / "nccl_trace_rank_1", recent=128).total_entries == 2000  # no p2p: the tail


@functools.cache
def _healthy_pair() -> list[dict[str, Any]]:
    tops = [copy.deepcopy(_BIG) for _ in range(2)]
    for r, top in enumerate(tops):
        for i in range(5, 2000, 10):
            _p2p_at(top, i, True, rank=r, send=r == 0)
    return tops


def _pp_pair(pending: tuple[int, int, bool] | None = None) -> list[dict[str, Any]]:
    """A healthy pipeline pair: every 10th entry rank 0 sends to rank 1 and rank 1 receives it, all
    completed; ``pending`` (rank, index, send) adds one op of that rank still pending."""
    tops = copy.deepcopy(_healthy_pair())
    if pending is not None:
        r, index, send = pending
        _p2p_at(tops[r], index, False, rank=r, send=send)
    return tops


def _write_pair(folder: Path, tops: list[dict[str, Any]]) -> None:
    folder.mkdir(exist_ok=True)
    for r, top in enumerate(tops):
        (folder / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(top, protocol=2))


def test_a_healthy_pipeline_keeps_the_newest_entries_only(tmp_path: Path) -> None:
    """Every step of a pipeline-parallel NCCL job sends and receives, so every group counts send/recv
    before its newest entries: when every skipped entry is retired (a bytes scan of the middle, never
    decoded), the newest 128 entries are still all that is decoded — the same analysis as a full decode."""
    _write_pair(tmp_path, _pp_pair())
    tail, full = _analysis_or_line(tmp_path, 128), _analysis_or_line(tmp_path, None)
    assert tail == full and full["verdict"] == "healthy", full
    for r in range(2):
        dump = load_dump(tmp_path / f"nccl_trace_rank_{r}", recent=128)
        assert dump.total_entries == 2000 and len(dump.entries) == 128


@pytest.mark.parametrize(("rank", "send"), [(1, False), (0, True)], ids=["recv", "send"])
def test_a_pending_send_or_recv_in_the_skipped_middle_is_read(tmp_path: Path, rank: int, send: bool) -> None:
    """One op of the pipeline pair still pending 1,300 entries before the newest (its peer never posted
    the counterpart): the scan finds it, that dump is decoded in full, and the verdict names the rank
    blocked in it, as a full decode of every dump does."""
    _write_pair(tmp_path, _pp_pair((rank, 700, send)))
    tail, full = _analysis_or_line(tmp_path, 128), _analysis_or_line(tmp_path, None)
    assert tail == full
    assert full["verdict"] == "hang", full
    assert full["collective"]["op"] == ("send" if send else "recv") and full["collective"]["p2p"], full
    assert len(load_dump(tmp_path / f"nccl_trace_rank_{rank}", recent=128).entries) == 2000
    assert len(load_dump(tmp_path / f"nccl_trace_rank_{1 - rank}", recent=128).entries) == 128


def _retired_ref(blob: bytes) -> bytes:
    """The BINGET by which CPython's pickler refers to the key ``retired`` after its first entry."""
    at = blob.index(b"X\x07\x00\x00\x00retired") + 12
    assert blob[at] == ord("q") and blob[at + 1] < 0x80  # BINPUT of a one-byte (ASCII) index
    return b"h" + blob[at + 1 : at + 2]


@pytest.mark.parametrize("name", ["key", "pattern"])
def test_the_key_or_its_pattern_inside_a_frame_string_only_costs_decoding(tmp_path: Path, name: str) -> None:
    """The scan reads bytes, not opcodes: a stack frame in the middle whose function name holds the text
    ``retired`` makes the scan of the skipped middle give up (the dump is decoded in full, and its
    skipped entries, decoded now, are followed one by one); the bytes of "retired: None" (the key's
    BINGET then ``N``) make it decode the entry that holds them (and the next), which is completed: the
    newest entries are enough — slower, the same analysis."""
    tops = _pp_pair()
    ref = _retired_ref(pickle.dumps(tops[0], protocol=2))
    text = "on_retired_work" if name == "key" else (ref + b"N").decode()
    tops[0]["entries"][1000]["frames"] = [{"name": text, "filename": "train.py", "line": 7}]
    _write_pair(tmp_path, tops)
    assert text.encode() in (tmp_path / "nccl_trace_rank_0").read_bytes()
    assert _analysis_or_line(tmp_path, 128) == _analysis_or_line(tmp_path, None)
    found = decode_recent((tmp_path / "nccl_trace_rank_0").read_bytes(), 128)
    assert found is not None
    assert found[3]() is (name == "pattern")  # the scan shows the skipped entries done, or gives up
    assert len(load_dump(tmp_path / "nccl_trace_rank_0", recent=128).entries) == 128
    assert len(load_dump(tmp_path / "nccl_trace_rank_1", recent=128).entries) == 128


@pytest.mark.parametrize("case", ["healthy", "pending", "spaced"])
def test_json_pipeline_dumps_answer_the_same_question(tmp_path: Path, case: str) -> None:
    """``_dump_fr_trace_json`` output (sorted keys, compact): the skipped text must hold as many
    ``"retired":true`` as skipped entries and no other ``"retired"``; a pending recv there, or the key
    written another way (spaced), decodes the whole file — the same analysis either way (the spaced one,
    whose skipped entries are all retired, is then reduced from its newest entries all the same)."""
    tops = _pp_pair((1, 700, False) if case == "pending" else None)
    for r, top in enumerate(tops):
        text = json.dumps(top, sort_keys=True, separators=(",", ":"))
        if case == "spaced" and r == 0:
            text = text.replace('"retired":true', '"retired": true', 1000)
        (tmp_path / f"nccl_trace_rank_{r}.json").write_text(text)
    assert _analysis_or_line(tmp_path, 128) == _analysis_or_line(tmp_path, None)
    sizes = [len(load_dump(tmp_path / f"nccl_trace_rank_{r}.json", recent=128).entries) for r in range(2)]
    assert sizes == {"healthy": [128, 128], "pending": [128, 2000], "spaced": [128, 128]}[case]


def test_a_newest_entry_with_an_unhashable_id_is_the_full_decodes_line(tmp_path: Path) -> None:
    """Deciding whether the newest entries are enough looked their (pg_id, seq) up in a set: a list there
    raised TypeError (a traceback in-process) where the full decode names the field."""
    top = copy.deepcopy(_BIG)
    top["entries"][-1].update(retired=False, state="started")
    top["pg_status"]["0"]["last_completed_collective"] = 1999
    top["entries"][-5]["pg_id"] = [0]
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(pickle.dumps(top, protocol=2))
    assert (
        _analysis_or_line(tmp_path, 128)
        == _analysis_or_line(tmp_path, None)
        == (f"{path}: entries[1995] (record_id {RECORD0 + 1995}): pg_id: Expected `int`, got `array`")
    )


@pytest.mark.parametrize("done", [True, False], ids=["completed", "pending"])
def test_a_status_counting_the_newest_send_hides_no_older_wait(tmp_path: Path, done: bool) -> None:
    """Rank 0's all_reduce #1 of group 1 waits 1,500 entries before its newest, and its newest entry is
    that group's first send (rank 1's the matching recv): pg_status, as ProcessGroupNCCL keeps it
    (p2p_synth.status_as_works), says enqueued 1 (the send's p2p seq), completed 1 (or none), no wait.
    Read as collective seqs the newest entries were enough, and gave another analysis than the full
    decode. A group whose newest entry counts a send/recv is read from its entries, so the newest entries
    are enough only when no skipped entry is pending: rank 0's dump is decoded in full."""
    tops = [copy.deepcopy(_BIG) for _ in range(2)]
    for r, top in enumerate(tops):
        coll, p2p = top["entries"][500], top["entries"][-1]
        for e in (coll, p2p):
            e.update(pg_id=1, process_group=("1", "pp"), collective_seq_id=1, op_id=1)
        for later in top["entries"][501:-1]:
            later["collective_seq_id"] -= 1
            later["op_id"] -= 1
        name = "nccl:send 0->1" if r == 0 else "nccl:recv 1<-0"
        p2p.update(profiling_name=name, is_p2p=True, p2p_seq_id=1, op_id=2)
        if r == 0 and not done:
            p2p.update(retired=False, state="started")
        top["pg_status"]["0"].update(last_enqueued_collective=1998, last_completed_collective=1998)
    tops[0]["entries"][500].update(retired=False, state="started")
    status_as_works(dict(enumerate(tops)))
    status = tops[0]["pg_status"]["1"]
    assert status["last_enqueued_collective"] == 1
    assert status["last_completed_collective"] == (1 if done else -1)
    _write_pair(tmp_path, tops)
    tail, full = _analysis_or_line(tmp_path, 128), _analysis_or_line(tmp_path, None)
    assert tail == full
    assert len(load_dump(tmp_path / "nccl_trace_rank_0", recent=128).entries) == 2000
    assert len(load_dump(tmp_path / "nccl_trace_rank_1", recent=128).entries) == 128  # all retired


@pytest.mark.parametrize("pending", ["all_reduce", "send"])
def test_a_mixed_status_of_a_group_with_no_newest_entry_hides_no_wait(tmp_path: Path, pending: str) -> None:
    """Group 1's all_reduce #1 (or send #1) is pending 1,700 entries before rank 0's newest, a recv of the
    same group completed after it: pg_status says enqueued and completed the recv's p2p seq, no wait, and
    none of the group's entries is among the newest to say it counts send/recv. Its status may hide a wait
    in any skipped entry: the newest entries are enough only when none is pending, and here one is."""
    tops = [copy.deepcopy(_BIG) for _ in range(2)]
    for top in tops:
        first, recv = top["entries"][300:302]
        for e in (first, recv):
            e.update(pg_id=1, process_group=("1", "pp"), collective_seq_id=1, op_id=1)
        if pending == "send":
            first.update(profiling_name="nccl:send 0->1", is_p2p=True, p2p_seq_id=1, collective_seq_id=0)
        for later in top["entries"][302:]:
            later["collective_seq_id"] -= 2
            later["op_id"] -= 2
        seq = first["p2p_seq_id"] + 1
        recv.update(profiling_name="nccl:recv 0<-1", is_p2p=True, p2p_seq_id=seq, op_id=2)
        recv["collective_seq_id"] = first["collective_seq_id"]
        top["pg_status"]["0"].update(last_enqueued_collective=1998, last_completed_collective=1998)
    tops[0]["entries"][300].update(retired=False, state="started")
    status_as_works(dict(enumerate(tops)))
    assert tops[0]["pg_status"]["1"]["last_enqueued_collective"] == seq
    assert tops[0]["pg_status"]["1"]["last_completed_collective"] == seq
    _write_pair(tmp_path, tops)
    tail, full = _analysis_or_line(tmp_path, 128), _analysis_or_line(tmp_path, None)
    assert tail == full
    assert len(load_dump(tmp_path / "nccl_trace_rank_0", recent=128).entries) == 2000
    assert len(load_dump(tmp_path / "nccl_trace_rank_1", recent=128).entries) == 128  # all retired


def _counted_dump(rank: int, pending_from: int) -> Any:
    """All_reduce #1-#50 of a group whose send/recv entries left the ring buffer (each entry counts 120 of
    them), #``pending_from`` on not completed; pg_status as ProcessGroupNCCL keeps it: enqueued #50, and
    completed the last completed *work*'s seq: recv #120 (p2p counter) when no collective here completed."""
    es = []
    for seq in range(1, 51):
        e = entry("0", seq, desc="default_pg", done=seq < pending_from, t_ms=seq, record=seq)
        e["p2p_seq_id"] = 120
        es.append(e)
    done = pending_from - 1 if pending_from > 1 else 120
    status = {
        "last_enqueued_collective": 50,
        "last_started_collective": 120,
        "last_completed_collective": done,
    }
    top = {"version": "2.10", "pg_status": {"0": status}, "entries": es}
    return parse_dump(top, rank=rank, source=f"nccl_trace_rank_{rank}", is_json=False)


def test_a_status_counting_send_recv_whose_entries_left_is_not_read_as_collectives() -> None:
    """pg_status said completed 120 (the recv's p2p seq) of a group whose collectives #1-#50 all wait: read
    as a collective seq, every one of them "completed", and the analysis said every collective in the
    dumps completed on all members. No send/recv entry is left to show the status mixes counters, but
    every entry's ``p2p_seq_id`` counts them: the group is read from its entries."""
    track = summarize(_counted_dump(0, 1)).groups[0]
    assert (track.enq, track.done, len(track.pending)) == (50, -1, 50)
    result = analyze([summarize(_counted_dump(0, 1)), summarize(_counted_dump(1, 51))])
    assert "every collective in the dumps completed" not in result.summary, result.summary
    assert "in progress when dumped" in result.summary, result.summary


def test_a_group_that_never_ran_send_recv_still_reads_its_status() -> None:
    """The same group with a ``p2p_seq_id`` of 0 (no send/recv so far): its pg_status counts collectives
    only and is read (completed #50: the entries' pending states are older than the status)."""
    dump = _counted_dump(0, 1)
    for e in dump.entries:
        e["p2p_seq_id"] = 0
    dump.pg_status["0"]["last_completed_collective"] = 50
    track = summarize(dump).groups[0]
    assert (track.enq, track.done, track.pending) == (50, 50, [])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(st.tuples(st.integers(2000 - 128, 1999), _keys, _field_values | _op_names), max_size=3),
    st.one_of(st.none(), st.tuples(_status_fields, _field_values)),
    st.sampled_from([None, 0, 1]),
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1999), st.booleans(), st.booleans()), max_size=4),
    st.booleans(),
    st.sampled_from([None, 500, 1900]),
    st.booleans(),
)
@example([(1872, "collective_seq_id", None)], None, None, [], False, None, False)  # "malformed (IndexError)"
@example([], None, 1, [(1, 700, False, False), (0, 1990, True, True)], True, None, False)  # a pending recv
# rank 1 completed the recv that rank 0 still waits in: its newest entries alone lack it (a per-dump scan
# of the skipped entries for pending ones read 'hang: rank 1 never posted the recv' from them)
@example([], None, None, [(0, 1, False, True), (1, 1, True, False)], False, None, False)
# rank 0 waits in all_reduce #501, its newest entry its first send: a status counting works said 1, 1 (now
# also read in full by the column-split rule: its first collective among the newest entries is pending)
@example([], None, None, [(0, 1999, True, True)], False, 500, True)
def test_fuzz_the_newest_entries_give_the_analysis_of_a_full_decode(
    tmp_path: Path,
    changes: list[tuple[int, Any, Any]],
    status: tuple[str, Any] | None,
    stuck: int | None,
    p2p: list[tuple[int, int, bool, bool]],
    pipeline: bool,
    stall_from: int | None,
    works: bool,
) -> None:
    """Only the newest 128 entries of a large pickle are decoded (when pg_status says they hold every
    collective still waited in and no send/recv can be pending before them): sends and recvs anywhere in
    the buffer of either rank, pending or completed (on a healthy pipeline pair or alone), changed fields
    among the newest entries, or in pg_status, give the same error line as a full decode of the same
    files, or the same analysis. (A bad field in the skipped middle is refused only by
    a full decode: the analysis reads nothing of it, see docs/flight-recorder.md.) ``stall_from``: rank 0's
    collectives from that entry on never complete; ``works``: pg_status as ProcessGroupNCCL keeps it, the
    last work's seq of either counter (p2p_synth.status_as_works), not collectives only."""
    folder = tmp_path / str(time.monotonic_ns())
    folder.mkdir()
    tops = _pp_pair() if pipeline else [copy.deepcopy(_BIG) for _ in range(2)]
    for rank, index, done, send in p2p:
        _p2p_at(tops[rank], index, done, rank=rank, send=send)
    for r, top in enumerate(tops):
        if stuck == r:  # this rank still runs its newest collective
            top["entries"][-1].update(retired=False, state="started")
            top["pg_status"]["0"]["last_completed_collective"] = top["entries"][-1]["collective_seq_id"] - 1
    if stall_from is not None:
        for e in tops[0]["entries"][stall_from:]:
            if not e.get("is_p2p"):
                e.update(retired=False, state="started")
    if works:
        status_as_works(dict(enumerate(tops)))
    for r, top in enumerate(tops):
        for index, key, value in changes if r == 0 else ():
            top["entries"][index][key] = value
        if status is not None and r == 0:
            top["pg_status"]["0"][status[0]] = status[1]
        try:
            blob = pickle.dumps(top, protocol=2)
        except (RecursionError, pickle.PicklingError, TypeError, AttributeError):
            return  # not picklable as plain data (a str subclass is, as a global the loader refuses)
        (folder / f"nccl_trace_rank_{r}").write_bytes(blob)
    assert _analysis_or_line(folder, 128) == _analysis_or_line(folder, None)


def test_a_group_whose_first_entry_has_no_seq_is_read() -> None:
    """An entry without collective_seq_id or seq_id (older formats) has seq -1, which was also the value
    "no entry yet" of a group: as a group's first entry it was taken for a coalesced op of the previous
    one, which did not exist ("malformed (IndexError)" — from the newest entries of a dump whose full
    decode read it)."""
    es = _entries()
    del es[0]["collective_seq_id"]
    dump = parse_dump({"version": "2.10", "entries": es}, rank=0, source="F", is_json=False)
    direct, through_msgspec = _both(dump)
    assert direct == through_msgspec and not isinstance(direct, str), direct
