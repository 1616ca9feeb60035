"""The agent never freezes or dies on what it observes: blocking /proc reads, floods, oversize batches."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sentinel.agent import Agent
from sentinel.agent.batch import MAX_BATCH_BYTES, MAX_EVENTS_PER_BATCH
from sentinel.agent.collectors.jobs import JobsCollector
from sentinel.fr.heads import FrHeads, PgHead
from sentinel.wire import LogLine, encode
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeHost, FakeSource
from tests.support import sent


async def test_blocked_proc_read_does_not_freeze_the_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(make_config(tmp_path), FakeSource(gpus=2))
    jobs = agent.collectors.get("jobs")
    assert isinstance(jobs, JobsCollector)
    monkeypatch.setattr(jobs, "blocking_deadline_s", 0.2)
    release = threading.Event()
    monkeypatch.setattr(jobs.mapper, "map", lambda pids: release.wait(30) and [])
    try:
        for t in (1.0, 2.0, 3.0):
            started = time.monotonic()
            batch = sent(await agent.step(t))
            assert time.monotonic() - started < 1.0
            assert len(batch.samples) == 2  # GPUs still read
            assert agent.counters.collector_success["jobs"] is False
            assert agent.counters.collector_success["nvml"] is True
    finally:
        release.set()
        await agent.shutdown()


async def test_event_flood_is_capped_and_counted(tmp_path: Path) -> None:
    agent = Agent(make_config(tmp_path), FakeSource(gpus=1), FakeHost().inputs())
    for i in range(MAX_EVENTS_PER_BATCH + 500):
        agent.sink.add_event(LogLine(t=1.0, text=f"line {i}"))
    first = sent(await agent.step(1.0))
    assert len(first.events) == MAX_EVENTS_PER_BATCH
    assert first.drops is not None and first.drops.events == 500  # reported with the batch they belong to
    second = sent(await agent.step(2.0))
    assert second.drops is None  # reported once
    assert agent.counters.dropped["events"] == 500  # the metric keeps the total
    await agent.shutdown()


async def test_oversize_batch_is_shrunk_to_fit_a_frame(tmp_path: Path) -> None:
    host = FakeHost()
    big_pgs = [PgHead(pg_name=f"pg{i}" * 50, ranks=list(range(512))) for i in range(8)]
    host.heads = [FrHeads(rank=r, t=1.0, pgs=big_pgs) for r in range(400)]
    agent = Agent(make_config(tmp_path), FakeSource(gpus=1), host.inputs())
    for i in range(MAX_EVENTS_PER_BATCH):
        agent.sink.add_event(LogLine(t=1.0, text="x" * 4000 + str(i)))
    batch = sent(await agent.step(1.0))
    assert len(encode(batch)) <= MAX_BATCH_BYTES
    assert len(batch.heads) < 400
    nxt = sent(await agent.step(2.0))
    assert nxt.drops is not None and nxt.drops.probe + nxt.drops.events > 0
    await agent.shutdown()
