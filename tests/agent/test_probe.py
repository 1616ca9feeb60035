"""The probe socket: FrHeads datagrams from training processes, validated, bounded, forwarded."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from sentinel.agent import Agent
from sentinel.agent.probe import ProbeError, decode_heads
from sentinel.fr.heads import FrHeads, InFlight, PgHead
from sentinel.wire import ProcInfo
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeExtras, FakeSource

HEADS = FrHeads(
    rank=5,
    t=1700000000.0,
    job_id="train-a",
    pid=4321,
    pgs=[
        PgHead(
            pg_name="0",
            last_enqueued_seq=12,
            last_completed_seq=11,
            in_flight=[InFlight(seq=12, op="allreduce", age_s=3.5)],
        )
    ],
)


@given(st.binary(max_size=2000))
def test_decoder_rejects_or_accepts_but_never_crashes(data: bytes) -> None:
    try:
        heads = decode_heads(data, 1024)
    except ProbeError:
        return
    assert isinstance(heads, FrHeads)


@given(
    st.builds(
        FrHeads, rank=st.integers(0, 1 << 20), t=st.floats(0, 2e9), job_id=st.none() | st.text(max_size=20)
    )
)
def test_decoder_roundtrip(heads: FrHeads) -> None:
    assert decode_heads(msgspec.msgpack.encode(heads), 65536) == heads


def test_decoder_bounds_and_validation() -> None:
    data = msgspec.msgpack.encode(HEADS)
    assert decode_heads(data, 65536) == HEADS
    for bad, limit in (
        (data, 10),
        (b"\x93\x01\x02", 100),
        (msgspec.msgpack.encode({"rank": "x", "t": 1.0}), 100),
    ):
        try:
            decode_heads(bad, limit)
        except ProbeError as exc:
            assert str(exc)
        else:
            raise AssertionError("accepted a bad datagram")


async def test_socket_forwards_heads_with_host_and_gpu(tmp_path: Path) -> None:
    path = tmp_path / "probe.sock"
    config = make_config(tmp_path, probe={"socket_path": str(path)})
    env = {"PATH": os.environ.get("PATH", ""), "SENTINEL_JOB_ID": "train-a", "RANK": "5"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    source = FakeSource(gpus=2)
    source.pids = {1: [rank.pid]}
    agent = Agent(config, source)
    await agent.start()
    await agent.step(0.5)  # the GPU reads see the rank's pid; the job mapping finds its job and rank
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.sendto(msgspec.msgpack.encode(msgspec.structs.replace(HEADS, pid=rank.pid)), str(path))
    sender.sendto(b"garbage", str(path))
    sender.sendto(msgspec.msgpack.encode(msgspec.structs.replace(HEADS, pid=None)), str(path))
    sender.close()
    deadline = time.monotonic() + 5
    assert agent.probe is not None
    while agent.probe.received < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    batch = await agent.step(1.0)
    rank.kill()
    rank.wait()
    assert [(h.host, h.gpu, h.rank) for h in batch.heads] == [("host-test", 1, 5), ("host-test", 1, 5)]
    assert agent.probe.rejected == 1
    assert batch.drops is not None and batch.drops.probe == 1
    snapshot = agent.ring.snapshot(1.0)
    assert any(e["type"] == "heads" and e["data"]["gpu"] == 1 for e in snapshot["entries"])
    await agent.shutdown()
    assert not path.exists()


async def test_extras_replace_host_collectors(tmp_path: Path) -> None:
    extras = FakeExtras()
    extras.kernel.append("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python, GPU has fallen off the bus.")
    extras.procs = [ProcInfo(gpu=0, pid=77, job_id="job-x", rank=0)]
    extras.heads = [msgspec.structs.replace(HEADS, pid=77)]
    agent = Agent(
        make_config(tmp_path, probe={"socket_path": str(tmp_path / "unused.sock")}),
        FakeSource(gpus=2),
        extras=extras,
    )
    assert agent.probe is None and agent.collectors.get("kmsg") is None
    batch = await agent.step(1.0)
    xids = [e for e in batch.events if e.kind == "xid"]
    assert [(e.gpu, e.xid, e.source) for e in xids] == [(0, 79, "kmsg")]
    assert batch.procs == extras.procs
    assert [(h.gpu, h.host) for h in batch.heads] == [(0, "host-test")]
    await agent.shutdown()
