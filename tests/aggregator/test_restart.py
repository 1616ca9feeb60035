"""A real aggregator process killed with SIGKILL and restarted: the open verdict comes back open, with its
original opened time, and closes only when the agent reports the evidence (a GPU reset)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import aiohttp
import msgspec

from sentinel.aggregator.latches import SeqWindowRecord
from sentinel.components.xid.parse import xid_record
from sentinel.wire import Ack, Batch, Event, GpuWasReset, XidOccurred, decode_aggregator_frame, encode
from tests.aggregator.helpers import TOKEN, hello, sample
from tests.aggregator.procs import AggregatorProcess


async def _send(url: str, batches: list[Batch]) -> None:
    """Connect as host h0 (boot id unchanged throughout), send the batches, wait for every ack (commands the
    aggregator sends meanwhile, verdict pushes and snapshot requests, are not answered)."""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(url, headers={"Authorization": f"Bearer {TOKEN}"}) as ws,
    ):
        await ws.send_bytes(encode(hello("h0")))
        for batch in batches:
            await ws.send_bytes(encode(batch))
            while not isinstance(frame := decode_aggregator_frame((await ws.receive(timeout=10)).data), Ack):
                pass
            assert frame.seq == batch.seq


def _batch(seq: int, t: float, events: list[Event] | None = None) -> Batch:
    return Batch(seq=seq, t=t, samples=[sample(i, t) for i in range(8)], events=events or [])


def _committed(state_dir: Path, verdict_id: str) -> bool:
    """The verdict is in the state database (read the way a second process would, WAL included)."""
    path = state_dir / "state.sqlite3"
    if not path.exists():
        return False
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        row = db.execute("SELECT 1 FROM records WHERE holder='verdicts' AND key=?", (verdict_id,)).fetchone()
    return row is not None


async def _until(predicate: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_sigkill_then_restart_keeps_the_open_verdict_and_closes_it_only_on_evidence(
    tmp_path: Path,
) -> None:
    aggregator = AggregatorProcess(tmp_path)
    try:
        aggregator.start()
        t0 = time.time()
        await _send(
            aggregator.stream_url,
            [_batch(1, t0), _batch(2, t0 + 1, [XidOccurred(t=t0 + 1, gpu=3, record=xid_record(79))])],
        )
        (opened,) = aggregator.get("/api/v1/verdicts?state=open")["verdicts"]
        assert (opened["host"], opened["gpu"], opened["reason"]) == ("h0", 3, "xid_79")
        await _until(lambda: _committed(aggregator.state_dir, opened["id"]))
        aggregator.kill()

        aggregator.start()
        (restored,) = aggregator.get("/api/v1/verdicts?state=open")["verdicts"]
        assert (restored["id"], restored["opened_at"], restored["state"]) == (
            opened["id"],
            opened["opened_at"],
            "open",
        )
        # the agent reconnects (same boot: no reboot) and sends healthy readings: a latched Xid 79 stays
        t1 = time.time()
        await _send(aggregator.stream_url, [_batch(3 + i, t1 + i) for i in range(3)])
        assert [v["id"] for v in aggregator.get("/api/v1/verdicts?state=open")["verdicts"]] == [opened["id"]]
        # the evidence: the GPU was reset. Then SIGTERM at once: a clean stop loses nothing
        await _send(aggregator.stream_url, [_batch(6, t1 + 3, [GpuWasReset(t=t1 + 3, gpu=3)])])
        assert aggregator.get("/api/v1/verdicts?state=open")["verdicts"] == []
        assert aggregator.stop() == 0

        aggregator.start()
        assert aggregator.get("/api/v1/verdicts?state=open")["verdicts"] == []
        (closed,) = aggregator.get("/api/v1/verdicts?state=closed")["verdicts"]
        assert (closed["id"], closed["opened_at"]) == (opened["id"], opened["opened_at"])
        assert closed["close_reason"] == "evidence gone" and closed["closed_at"] >= t1
    finally:
        aggregator.close()


async def test_kill_9_in_the_middle_of_a_stream_of_faults_loses_at_most_the_last_second(
    tmp_path: Path,
) -> None:
    """Faults arrive every 50 ms; the API is polled meanwhile; SIGKILL lands at an arbitrary moment. Every
    verdict the API showed open more than a second before the kill is open again after the restart."""
    aggregator = AggregatorProcess(tmp_path)
    try:
        aggregator.start()
        seen: list[tuple[float, set[str]]] = []
        t0 = time.time()
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(aggregator.stream_url, headers={"Authorization": f"Bearer {TOKEN}"}) as ws,
        ):
            await ws.send_bytes(encode(hello("h0", gpus=8)))
            for seq in range(1, 60):
                t = t0 + seq * 0.05
                events: list[Event] = (
                    [XidOccurred(t=t, gpu=seq % 8, record=xid_record(79))] if seq % 8 == 0 or seq < 8 else []
                )
                if seq % 8 == 7:
                    events = [GpuWasReset(t=t, gpu=(seq + 1) % 8)]  # closes one, then reopens
                await ws.send_bytes(encode(_batch(seq, t, events)))
                await ws.receive(timeout=10)
                async with session.get(aggregator.url + "/api/v1/verdicts") as response:
                    items = (await response.json())["verdicts"]
                seen.append((time.time(), {v["id"] for v in items if v["state"] == "open"}))
                await asyncio.sleep(0.05)
            killed_at = time.time()
            aggregator.kill()
        aggregator.start()
        restored = {v["id"] for v in aggregator.get("/api/v1/verdicts")["verdicts"]}
        durable = [ids for when, ids in seen if when <= killed_at - 1.0]
        assert durable, "the stream ran for less than a second"
        for ids in durable:  # each was open then; now it is known (open, or closed by later evidence)
            assert ids <= restored
        assert seen[-1][1], "the last poll saw open verdicts"
    finally:
        aggregator.close()


def _durable_seqs(state_dir: Path, host: str, seqs: range) -> set[int]:
    """Which of ``seqs`` the dedup window of ``host`` in the state database covers (read as a second process)."""
    path = state_dir / "state.sqlite3"
    if not path.exists():
        return set()
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        row = db.execute("SELECT value FROM records WHERE holder='fleet_seqs' AND key=?", (host,)).fetchone()
    if row is None:
        return set()
    window = msgspec.msgpack.decode(row[0], type=SeqWindowRecord)
    return {seq for seq in seqs if seq <= window.hw or seq in window.above}


def _host(aggregator: AggregatorProcess, name: str) -> dict[str, object]:
    (host,) = [h for h in aggregator.get("/api/v1/hosts")["hosts"] if h["name"] == name]
    return host  # type: ignore[no-any-return]


async def test_sigkill_then_resend_applies_every_batch_exactly_once(tmp_path: Path) -> None:
    """The agent resends after a kill -9: what was durable is recognised as a duplicate, the rest is applied.

    The client resends every batch from seq 1 (more than a real agent, which resends only what was not
    acked): each seq the killed process had committed must come back as a duplicate, each later one must be
    applied — once, and none lost."""
    aggregator = AggregatorProcess(tmp_path)
    try:
        aggregator.start()
        t0 = time.time()
        await _send(aggregator.stream_url, [_batch(seq, t0 + seq * 0.01) for seq in range(1, 21)])
        first = range(1, 21)
        await _until(lambda: _durable_seqs(aggregator.state_dir, "h0", first) == set(first))
        # more batches, killed right after their acks: an ack comes only once its batch is committed
        await _send(aggregator.stream_url, [_batch(seq, t0 + seq * 0.01) for seq in range(21, 26)])
        aggregator.kill()
        durable = len(_durable_seqs(aggregator.state_dir, "h0", range(1, 31)))
        assert durable == 25

        aggregator.start()
        await _send(aggregator.stream_url, [_batch(seq, t0 + seq * 0.01) for seq in range(1, 31)])
        host = _host(aggregator, "h0")
        assert (host["duplicates"], host["batches"]) == (durable, 30 - durable)
    finally:
        aggregator.close()
