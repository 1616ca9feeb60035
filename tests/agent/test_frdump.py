"""Flight-recorder dumps: new dump files become events; fr_dump writes the ranks' trigger pipes."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from sentinel.agent import Agent
from sentinel.agent.frdump import FrDumpWatcher, collect_dumps, trigger_fr_dump
from sentinel.fr.heads import FrHeads
from sentinel.wire import Command, FrDumpAnswer, FrDumpRequest, ProcInfo
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource
from tests.support import sent


def test_watcher_reports_new_dumps_only(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"old")
    watcher = FrDumpWatcher(str(tmp_path), "nccl_trace_rank_")
    assert watcher.poll(1.0) == []
    (tmp_path / "nccl_trace_rank_12").write_bytes(b"new")
    (tmp_path / "unrelated.txt").write_bytes(b"x")
    events = watcher.poll(2.0)
    assert [(e.kind, e.rank) for e in events] == [("fr_dump", 12)]
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
        agent.sink.set_procs(
            [ProcInfo(gpu=0, pid=1, job_id="a", rank=4), ProcInfo(gpu=1, pid=2, job_id="a", rank=5)]
        )
        agent.sink.set_procs([*agent.sink.procs(), ProcInfo(gpu=1, pid=3, job_id="b", rank=9)])
        answer = agent.trigger_fr_dump("a")
        assert sorted(answer.pipes) == [f"{prefix}4.pipe", f"{prefix}5.pipe"]
        assert answer.triggered == [4, 5] and answer.missing == []
        assert os.read(readers[4], 16) == b"1\n" and os.read(readers[5], 16) == b"1\n"
        try:
            untouched = os.read(readers[9], 16)  # no writer ever: EOF
        except BlockingIOError:
            untouched = b""
        assert untouched == b"", "job b's rank was triggered"
        assert trigger_fr_dump(str(prefix), None).triggered == [4, 5, 9]  # no mapping: every local pipe
        assert trigger_fr_dump(str(tmp_path / "nobody_"), [1]).missing == [1]  # no pipe: reported, no error
        await agent.shutdown()
    finally:
        for fd in readers.values():
            os.close(fd)


def test_collect_dumps_waits_for_triggered_ranks_and_bounds_bytes(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"stale")
    os.utime(tmp_path / "nccl_trace_rank_0", (1000.0, 1000.0))
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"\x80\x02" + os.urandom(5000))
    (tmp_path / ".nccl_trace_rank_2.tmp").write_bytes(b"partial")  # a writer's temporary file
    (tmp_path / "nccl_trace_rank_3.json").write_bytes(b"{}")
    (tmp_path / "nccl_trace_rank_9").write_bytes(b"another job's rank")
    polls: list[float] = []
    clock = iter(x * 0.1 for x in range(1000))

    def sleep(dt: float) -> None:
        polls.append(dt)
        if len(polls) == 3:  # rank 2's dump lands while the agent waits
            (tmp_path / "nccl_trace_rank_2").write_bytes(b"\x80\x02late")

    found = collect_dumps(
        str(tmp_path),
        "nccl_trace_rank_",
        since=2000.0,
        expect=[1, 2],
        ranks=[0, 1, 3],
        wait_s=5.0,
        clock=lambda: next(clock),
        sleep=sleep,
    )
    got = {d.rank: gzip.decompress(d.data) for d in found.dumps}
    assert sorted(got) == [1, 2, 3]  # rank 0 is stale, rank 9 not asked for
    assert got[1].startswith(b"\x80\x02") and got[2] == b"\x80\x02late" and got[3] == b"{}"
    assert found.skipped == {}
    small = collect_dumps(
        str(tmp_path), "nccl_trace_rank_", since=2000.0, ranks=[1, 2], wait_s=1, max_bytes=60
    )
    assert [d.rank for d in small.dumps] == [2] and "do not fit" in small.skipped["1"]


def test_collect_dumps_gives_up_after_the_wait(tmp_path: Path) -> None:
    clock = iter(x * 0.5 for x in range(100))
    found = collect_dumps(
        str(tmp_path),
        "p_",
        since=0.0,
        expect=[4],
        wait_s=2.0,
        clock=lambda: next(clock),
        sleep=lambda _: None,
    )
    assert found.dumps == [] and found.skipped == {"4": "no dump appeared"}


async def test_fr_dump_command_collects_the_jobs_dumps(tmp_path: Path) -> None:
    dumps, prefix = tmp_path / "dumps", tmp_path / "pipe_"
    dumps.mkdir()
    reader = _reader(Path(f"{prefix}6.pipe"))
    try:
        config = make_config(
            tmp_path,
            probe={"fr_pipe_prefix": str(prefix), "fr_dump_dir": str(dumps), "fr_dump_prefix": "rank_"},
        )
        agent = Agent(config, FakeSource(gpus=8))
        agent.sink.set_inventory(FakeSource(gpus=8).open())
        # the probe's heads say rank 6 of job "j" runs here (LOCAL_RANK 2); NVML reports no pid
        agent.sink.add_heads([FrHeads(rank=6, t=1.0, job_id="j", local_rank=2, pid=4242)])
        batch = sent(await agent.step(10.0))
        assert [(h.rank, h.host, h.gpu) for h in batch.heads] == [(6, "host-test", 2)]
        (dumps / "rank_6").write_bytes(b"\x80\x02dump")
        result = await agent.handle_command(
            Command(id="c1", request=FrDumpRequest(job="j", collect=True, since=0.0, wait_s=2.0))
        )
        assert result.ok and isinstance(result.answer, FrDumpAnswer) and result.answer.triggered == [6]
        assert os.read(reader, 16) == b"1\n"
        [dump] = result.answer.dumps
        assert dump.rank == 6 and gzip.decompress(dump.data) == b"\x80\x02dump"
        await agent.shutdown()
    finally:
        os.close(reader)


async def test_heads_gpu_from_nvml_mapping_wins_over_local_rank(tmp_path: Path) -> None:
    source = FakeSource(gpus=4)
    source.pids = {3: [77]}  # NVML lists pid 77 on GPU 3
    agent = Agent(make_config(tmp_path), source)
    agent.sink.add_heads(
        [
            FrHeads(rank=1, t=1.0, job_id="j", local_rank=0, pid=77),  # NVML: pid 77 is on GPU 3
            FrHeads(rank=2, t=1.0, job_id="j", local_rank=9, pid=78),  # no such GPU slot: unknown
        ]
    )
    batch = sent(await agent.step(10.0))
    assert [(h.rank, h.gpu) for h in batch.heads] == [(1, 3), (2, None)]
    await agent.shutdown()
