"""Flight-recorder dumps: new dump files become events; fr_dump writes the ranks' trigger pipes."""

from __future__ import annotations

import os
from pathlib import Path

from sentinel.agent import Agent
from sentinel.agent.frdump import FrDumpWatcher, trigger_fr_dump
from sentinel.wire import ProcInfo
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource


def test_watcher_reports_new_dumps_only(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"old")
    watcher = FrDumpWatcher(str(tmp_path), "nccl_trace_rank_")
    assert watcher.poll(1.0) == []
    (tmp_path / "nccl_trace_rank_12").write_bytes(b"new")
    (tmp_path / "unrelated.txt").write_bytes(b"x")
    events = watcher.poll(2.0)
    assert [(e.kind, e.fields["rank"]) for e in events] == [("fr_dump", 12)]
    assert watcher.poll(3.0) == []


def _reader(path: Path) -> int:
    os.mkfifo(path)
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK)


async def test_fr_dump_writes_pipes_of_the_jobs_local_ranks(tmp_path: Path) -> None:
    prefix = tmp_path / "nccl_pipe_"
    readers = {rank: _reader(Path(f"{prefix}{rank}.pipe")) for rank in (4, 5, 9)}
    try:
        config = make_config(tmp_path, probe={"fr_pipe_prefix": str(prefix)})
        agent = Agent(config, FakeSource(gpus=2))
        agent.set_procs(
            [ProcInfo(gpu=0, pid=1, job_id="a", rank=4), ProcInfo(gpu=1, pid=2, job_id="a", rank=5)]
        )
        agent.set_procs([*agent._procs, ProcInfo(gpu=1, pid=3, job_id="b", rank=9)])
        payload = agent.trigger_fr_dump("a")
        assert sorted(payload["pipes"]) == [f"{prefix}4.pipe", f"{prefix}5.pipe"]
        assert payload["triggered"] == [4, 5] and payload["missing"] == []
        assert os.read(readers[4], 16) == b"1\n" and os.read(readers[5], 16) == b"1\n"
        try:
            untouched = os.read(readers[9], 16)  # no writer ever: EOF
        except BlockingIOError:
            untouched = b""
        assert untouched == b"", "job b's rank was triggered"
        assert trigger_fr_dump(str(prefix), None)["triggered"] == [4, 5, 9]  # no mapping: every local pipe
        assert trigger_fr_dump(str(tmp_path / "nobody_"), [1])["missing"] == [
            1
        ]  # no pipe: reported, no error
        await agent.shutdown()
    finally:
        for fd in readers.values():
            os.close(fd)
