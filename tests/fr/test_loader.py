"""Finding and reading dump files: names, folders, formats, versions, bounds."""

from __future__ import annotations

import gzip
import json
import os
import pickle
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.fr.dumpset import analyze_dir
from sentinel.fr.errors import FrFormatError
from sentinel.fr.loader import as_pathlib_text, discover, load_dump, read_bytes
from sentinel.fr.summary import summarize
from tests.fr.synth import entry, write


def test_stray_numbered_files_are_ignored_and_subfolders_read(tmp_path: Path) -> None:
    for r in range(4):
        write(tmp_path / f"host{r % 2}", r, [entry("0", 1, desc="default_pg")])
    (tmp_path / "notes_v2").write_text("not a dump")
    files = discover(tmp_path)
    assert [f.rank for f in files] == [0, 1, 2, 3]
    assert analyze_dir(tmp_path, workers=1).verdict == "healthy"


@given(st.lists(st.sampled_from(["/", "//", ".", "..", "a", "b.c", " ", "x\\y"]), max_size=8).map("".join))
def test_paths_are_spelled_as_pathlib_spells_them(text: str) -> None:
    """Messages name files as ``pathlib`` did before the loader stopped importing it."""
    assert as_pathlib_text(text) == str(PurePosixPath(text))


def test_files_are_named_from_the_folder_as_given(tmp_path: Path) -> None:
    write(tmp_path / "host0", 0, [entry("0", 1)])
    write(tmp_path / "host1", 0, [entry("0", 1)])
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        for spelled in (".", "./", ".//"):
            with pytest.raises(FrFormatError, match=r"^\.: rank 0 has two dumps \(host0/\S+ and host1/"):
                discover(spelled)
    finally:
        os.chdir(cwd)
    for spelling in (str(tmp_path) + "/", "/" + str(tmp_path) + "//", tmp_path):
        name = str(PurePosixPath(spelling))
        with pytest.raises(FrFormatError) as info:
            discover(spelling)
        assert str(info.value).startswith(f"{name}: rank 0 has two dumps (host0/")
    assert [f.path for f in discover(tmp_path / "host0")] == [str(tmp_path / "host0" / "nccl_trace_rank_0")]


def test_same_rank_twice_is_unusable(tmp_path: Path) -> None:
    write(tmp_path / "a", 0, [entry("0", 1)])
    write(tmp_path / "b", 0, [entry("0", 1)], as_json=True)
    with pytest.raises(FrFormatError, match="rank 0 has two dumps"):
        discover(tmp_path)


def test_empty_dir_and_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(FrFormatError, match="no flight recorder dumps"):
        discover(tmp_path)
    with pytest.raises(FrFormatError, match="not a directory"):
        discover(tmp_path / "nope")


def test_json_dump_with_string_status_and_gz(tmp_path: Path) -> None:
    dump = {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": "3",
                "last_started_collective": "-1",
                "last_completed_collective": "2",
            }
        },
        "entries": [
            entry("0", s, desc="default_pg", done=s < 3) | {"time_discovered_started_ns": 0}
            for s in (1, 2, 3)
        ],
    }
    path = tmp_path / "trace_rank_3.json.gz"
    path.write_bytes(gzip.compress(json.dumps(dump).encode()))
    summary = summarize(load_dump(path))
    assert summary.rank == 3
    [group] = summary.groups
    assert (group.enq, group.done) == (3, 2)
    assert [p.seq for p in group.pending] == [3]


def test_old_format_seq_id_and_no_process_group(tmp_path: Path) -> None:
    e = entry("0", 5)
    del e["collective_seq_id"], e["process_group"], e["is_p2p"]
    e["seq_id"] = 5
    path = tmp_path / "x_rank_0"
    path.write_bytes(pickle.dumps({"version": "2.0", "entries": [e]}, protocol=2))
    [group] = summarize(load_dump(path)).groups
    assert group.enq == 5


@pytest.mark.parametrize(
    ("dump", "message"),
    [
        ({"version": "1.0", "entries": []}, "version"),
        ({"version": "2.10", "entries": {}}, "entries"),
        ([1, 2], "top level"),
        (
            {"version": "2.10", "entries": [{"profiling_name": "nccl:all_reduce"}]},
            r"entries\[0\]: time_created_ns: missing",
        ),
        ({"version": "2.10", "entries": [entry("0", 1) | {"time_created_ns": "soon"}]}, "time_created_ns"),
    ],
)
def test_bad_shapes_name_the_field(tmp_path: Path, dump: object, message: str) -> None:
    path = tmp_path / "t_0"
    path.write_bytes(pickle.dumps(dump, protocol=2))
    with pytest.raises(FrFormatError, match=message):
        summarize(load_dump(path))


def test_size_bound(tmp_path: Path) -> None:
    path = tmp_path / "t_0"
    path.write_bytes(b"{" + b" " * 2000)
    with pytest.raises(FrFormatError, match="larger than"):
        read_bytes(path, limit=1000)
