"""The log tailer on real files: new files, rotation, truncation, partial and over-long lines."""

from __future__ import annotations

import os
from pathlib import Path

from sentinel.agent.tailer import LogTailer


def _write(path: Path, text: str, mode: str = "a") -> None:
    with path.open(mode) as f:
        f.write(text)


def test_follows_existing_from_end_and_new_files_from_start(tmp_path: Path) -> None:
    old = tmp_path / "nccl.host.1.log"
    _write(old, "history line\n")
    tailer = LogTailer([str(tmp_path / "nccl.*.log")], rescan_s=0.0)
    assert tailer.poll(0.0) == []
    _write(old, "first new\nsecond new\n")
    new = tmp_path / "nccl.host.2.log"
    _write(new, "from a new rank\n")
    lines = tailer.poll(1.0)
    assert (str(old), "first new") in lines and (str(old), "second new") in lines
    assert (str(new), "from a new rank") in lines
    tailer.close()


def test_partial_line_waits_for_newline(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_text("")
    tailer = LogTailer([str(path)], rescan_s=0.0)
    tailer.poll(0.0)
    _write(path, "NCCL WARN half")
    assert tailer.poll(1.0) == []
    _write(path, " a line\n")
    assert tailer.poll(2.0) == [(str(path), "NCCL WARN half a line")]
    tailer.close()


def test_rotation_reads_old_tail_then_new_file(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("")
    tailer = LogTailer([str(path)], rescan_s=0.0)
    tailer.poll(0.0)
    _write(path, "before rotation\n")
    os.rename(path, tmp_path / "train.log.1")
    with (tmp_path / "train.log.1").open("a") as f:
        f.write("late write to the rotated file\n")
    _write(path, "in the new file\n", "w")
    lines = [line for _, line in tailer.poll(1.0)]
    assert lines == ["before rotation", "late write to the rotated file", "in the new file"]
    _write(path, "more\n")
    assert [line for _, line in tailer.poll(2.0)] == ["more"]
    tailer.close()


def test_truncation_restarts_from_the_beginning(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("")
    tailer = LogTailer([str(path)], rescan_s=0.0)
    tailer.poll(0.0)
    _write(path, "a fairly long line before copytruncate\n")
    assert len(tailer.poll(1.0)) == 1
    with path.open("r+") as f:
        f.truncate(0)
    _write(path, "short\n")
    assert tailer.poll(2.0) == [(str(path), "short")]
    tailer.close()


def test_long_lines_are_cut_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text("")
    tailer = LogTailer([str(path)], rescan_s=0.0, max_line_bytes=128)
    tailer.poll(0.0)
    _write(path, "x" * 1000 + "\nnext\n")
    lines = [line for _, line in tailer.poll(1.0)]
    assert lines == ["x" * 128, "next"]
    assert tailer.cut_lines == 1
    tailer.close()


def test_deleted_file_is_dropped_and_recreated_one_followed(tmp_path: Path) -> None:
    path = tmp_path / "r0.log"
    path.write_text("")
    tailer = LogTailer([str(tmp_path / "*.log")], rescan_s=0.0)
    tailer.poll(0.0)
    _write(path, "last words\n")
    path.unlink()
    assert [line for _, line in tailer.poll(1.0)] == ["last words"]
    assert tailer.files == []
    _write(path, "reborn\n")
    assert [line for _, line in tailer.poll(2.0)] == ["reborn"]
    tailer.close()
