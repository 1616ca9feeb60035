"""The log tailer on real files: new files, rotation, truncation, partial and over-long lines."""

from __future__ import annotations

import os
from pathlib import Path

from sentinel.agent.tailer import LogTailer
from sentinel.wire import LogLine
from tests.support import sent


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


NET_WARN = (
    "node7:{pid}:1300 [3] transport/net_ib.cc:1294 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<41422> "
    "with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 remoteGid ::ffff:10.0.0.2"
)
WATCHDOG = (
    "[rank3]:[E1129 12:00:00.000000000 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=600000) "
    "ran for 600012 milliseconds before timing out."
)


async def test_agent_classifies_tailed_lines(tmp_path: Path) -> None:
    from sentinel.agent import Agent
    from tests.agent.conftest import make_config
    from tests.agent.fakes import FakeSource

    log = tmp_path / "nccl.node7.log"
    log.write_text("")
    source = FakeSource(gpus=4)
    source.pids = {2: [4242]}  # NVML sees the logging process on GPU 2
    agent = Agent(make_config(tmp_path, logs={"globs": [str(tmp_path / "*.log")]}), source)
    await agent.step(1.0)
    assert agent.sink.gpu_of_pid(4242) == 2
    _write(log, "node7:4242:1300 [3] NCCL INFO Channel 00/0 : 0[3] -> 1[4] via P2P/IPC\n")
    _write(log, NET_WARN.format(pid=4242) + "\n" + WATCHDOG + "\n")
    batch = sent(await agent.step(2.0))
    kinds = [(e.kind, getattr(e, "line_kind", None), e.severity, e.gpu) for e in batch.events]
    assert kinds == [
        ("log", "nccl_warn_net", "critical", 2),
        ("log", "torch_watchdog_timeout", "critical", None),
    ]
    watchdog = batch.events[1]
    assert isinstance(watchdog, LogLine)
    assert (watchdog.rank, watchdog.seq, watchdog.op, watchdog.timeout_ms) == (
        3,
        1234,
        "ALLREDUCE",
        600000,
    )
    assert batch.events[0].source == f"log:{log}"
    assert agent.counters.log_events[("nccl_warn_net", "critical")] == 1
    await agent.shutdown()


def test_a_followed_log_swapped_for_a_symlink_is_not_read_through_it(tmp_path: Path) -> None:
    """The log is replaced by a link to another file: its last lines are read, the link's target never."""
    secret = tmp_path / "secret"
    secret.write_text("root:secret-line-1\nroot:secret-line-2\n")
    log = tmp_path / "nccl.1.log"
    log.write_text("")
    tailer = LogTailer([str(tmp_path / "nccl.*.log")], rescan_s=0.0)
    tailer.poll(0.0)
    _write(log, "last real line\n")
    moved = tmp_path / "moved.old"
    log.rename(moved)
    log.symlink_to(secret)
    got = tailer.poll(1.0) + tailer.poll(2.0) + tailer.poll(3.0)
    assert got == [(str(log), "last real line")]
    assert tailer.refused_files == 1 and tailer.files == []  # refused once, however often it is seen
    log.unlink()
    _write(log, "a regular file again\n")
    assert tailer.poll(4.0) == [(str(log), "a regular file again")]
    tailer.close()


def test_a_symlink_matching_the_glob_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("")
    (tmp_path / "nccl.2.log").symlink_to(target)
    os.mkfifo(tmp_path / "nccl.3.log")
    tailer = LogTailer([str(tmp_path / "nccl.*.log")], rescan_s=0.0)
    tailer.poll(0.0)
    _write(target, "not ours to read\n")
    assert tailer.poll(1.0) == [] and tailer.files == []
    assert tailer.refused_files == 2  # the link and the FIFO
    tailer.close()
