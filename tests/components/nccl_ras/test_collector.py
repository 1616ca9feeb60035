"""The agent's RAS collector (background query, never blocking a tick) and RAS evidence for a stall."""

from __future__ import annotations

import asyncio
import os
import socket

from sentinel.components.nccl_ras.collector import RasCollector
from sentinel.components.nccl_ras.metrics import RasMetrics
from sentinel.components.nccl_ras.owner import SocketTable
from sentinel.components.nccl_ras.parse import parse_status
from sentinel.components.nccl_ras.record import RasStatus
from sentinel.components.nccl_ras.rule import ras_evidence
from tests.components.nccl_ras.rasserver import FakeRas
from tests.components.nccl_ras.test_ras import load


class Sink:
    """The agent's side: the jobs whose rank 0 runs here, each job's processes (this test process)."""

    def __init__(self, jobs: list[str], pids: list[int] | None = None) -> None:
        self.jobs = jobs
        self.pids = [os.getpid()] if pids is None else pids
        self.got: list[RasStatus] = []

    def ras_jobs(self) -> list[str]:
        return self.jobs

    def ras_job_pids(self, job: str) -> list[int]:
        return self.pids if job in self.jobs else []

    def add_ras(self, status: RasStatus) -> None:
        self.got.append(status)


def collector(
    sink: Sink, port: int, timeout_s: float = 5.0, sockets: SocketTable | None = None
) -> RasCollector:
    return RasCollector(
        sink, RasMetrics("c", "h"), host="127.0.0.1", port=port, interval_s=15.0, timeout_s=timeout_s,
        refused_backoff_s=60.0, tick_s=1.0, sockets=sockets,
    )  # fmt: skip


async def _finish(c: RasCollector) -> None:
    assert c._task is not None
    await asyncio.wait([c._task])


async def test_answer_ships_with_the_next_tick() -> None:
    server = FakeRas(answer=load("docs_dead.txt"))
    port = await server.start()
    sink = Sink(["job-7"])
    c = collector(sink, port)
    try:
        await c.collect(100.0)  # starts the query, returns at once
        assert sink.got == [] and c._task is not None
        await _finish(c)
        await c.collect(101.0)
    finally:
        await server.close()
    (status,) = sink.got
    assert (status.job, status.t, status.dead_process_count) == ("job-7", 100.0, 1)
    assert c.metrics.queries["ok"] == 1
    await c.collect(110.0)
    assert c._task is None  # not due again before interval_s


async def test_no_job_no_query_and_nothing_listening_backs_off() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sink = Sink([])
        c = collector(sink, port)
        await c.collect(0.0)
        assert c._task is None  # no rank 0 of any job here
        sink.jobs = ["job-1"]
        await c.collect(1.0)
        await _finish(c)
        await c.collect(2.0)
        assert c.metrics.queries["not_listening"] == 1 and sink.got == []
        await c.collect(30.0)
        assert c._task is None  # refused: retried after refused_backoff_s, not after interval_s


async def query_once(
    server: FakeRas, sink: Sink, timeout_s: float = 5.0, sockets: SocketTable | None = None
) -> RasCollector:
    """One query of ``server`` by a collector for ``sink``, its result taken by the next tick."""
    port = await server.start()
    c = collector(sink, port, timeout_s=timeout_s, sockets=sockets)
    try:
        await c.collect(0.0)
        await _finish(c)
        await c.collect(1.0)
    finally:
        await server.close()
    return c


async def test_a_wedged_service_fails_the_query_not_the_tick() -> None:
    sink = Sink(["job-1"])
    c = await query_once(FakeRas(stall_status=True), sink, timeout_s=0.2)
    assert c.metrics.queries["error"] == 1 and sink.got == []


def test_evidence_names_dead_missing_and_behind() -> None:
    dead = parse_status(load("docs_dead.txt"))
    lines = ras_evidence(dead, 12.0, 120.0)
    assert lines[0].startswith(
        "NCCL RAS (12s ago): 1 job process(es) dead: process 3487984 on node 172.16.64.213"
    )
    assert any("misses 1 rank(s): 21" in line for line in lines)
    behind = ras_evidence(parse_status(load("docs_mismatch.txt")), 3.0, 120.0)
    assert behind == [
        "NCCL RAS (3s ago): communicator #0-0 6 rank(s) behind at operation 6649 while 26 reached 6650 "
        "(collective operation counts): 0 (node 172.16.64.210 GPU 0), 2 (node 172.16.64.210 GPU 2), "
        "3 (node 172.16.64.210 GPU 3), 4 (node 172.16.64.210 GPU 4), 5 (node 172.16.64.210 GPU 5), "
        "7 (node 172.16.64.210 GPU 7)"
    ]
    assert ras_evidence(dead, 200.0, 120.0) == []  # too old to explain a stall now
    assert ras_evidence(parse_status(load("docs_running.txt")), 1.0, 120.0) == []
