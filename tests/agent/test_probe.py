"""The probe socket: FrHeads datagrams from training processes, validated, bounded, forwarded."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.agent import Agent
from sentinel.agent.probe import Credentials, ProbeError, ProbeServer, decode_heads
from sentinel.fr.heads import FrHeads, InFlight, PgHead
from sentinel.wire import HeadsEntry, XidOccurred
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeHost, FakeProcess, FakeSource
from tests.support import sent

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
    batch = sent(await agent.step(1.0))
    rank.kill()
    rank.wait()
    assert [(h.host, h.gpu, h.rank) for h in batch.heads] == [("host-test", 1, 5), ("host-test", 1, 5)]
    assert agent.probe.rejected == 1
    assert batch.drops is not None and batch.drops.probe == 1
    snapshot = agent.ring.snapshot(1.0)
    assert any(isinstance(e, HeadsEntry) and e.data.gpu == 1 for e in snapshot.entries)
    await agent.shutdown()
    assert not path.exists()


async def test_host_inputs_replace_the_os_boundaries_under_the_same_collectors(tmp_path: Path) -> None:
    """A simulated host's boundaries feed the real collectors: kmsg records go through the line classifier
    and the Xid merge, the process table through the job mapper, datagrams through the probe's validation
    and authorisation; the agent binds no socket of its own."""
    host = FakeHost(uid=1000)
    host.kernel.append("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python, GPU has fallen off the bus.")
    host.procs[77] = FakeProcess(77, {"SLURM_JOB_ID": "job-x", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    source = FakeSource(gpus=2)
    source.pids[0] = [77]
    agent = Agent(
        make_config(tmp_path, probe={"socket_path": str(tmp_path / "unused.sock")}),
        source,
        host.inputs(),
    )
    assert agent.probe is None and agent.collectors.get("kmsg") is not None
    batch = sent(await agent.step(1.0))
    assert batch.procs is not None
    assert [(p.gpu, p.pid, p.job_id, p.rank) for p in batch.procs] == [(0, 77, "job-x", 0)]
    assert not [e for e in batch.events if e.kind == "xid"]  # waits for NVML's report of the same Xid
    host.heads = [
        msgspec.structs.replace(HEADS, pid=77, rank=0, job_id="job-x"),
        msgspec.structs.replace(HEADS, pid=77, rank=3, job_id="job-x"),  # pid 77 is rank 0: refused
    ]
    batch = sent(await agent.step(1.5))
    assert [(h.gpu, h.host, h.rank) for h in batch.heads] == [(0, "host-test", 0)]
    assert not (tmp_path / "unused.sock").exists()
    later = sent(await agent.step(1.0 + agent.config.collect.xid_merge_wait_s))
    xids = [e for e in later.events if isinstance(e, XidOccurred)]
    assert [(e.gpu, e.record.xid, e.source, e.record.pid) for e in xids] == [(0, 79, "kmsg", 1)]
    await agent.shutdown()


def _send_as(uid: int, path: str, payload: bytes) -> None:
    """Send one datagram from a child process running as ``uid`` (the tests run as root)."""
    pid = os.fork()
    if pid == 0:  # the child: drop to uid, send, exit without running any of the parent's cleanup
        code = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sender.sendto(payload, path)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A folder other users can reach (pytest's tmp_path is root-only)."""
    directory = Path(tempfile.mkdtemp(prefix="sentinel-probe-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_socket_is_0660_and_heads_are_checked_against_the_senders_credentials(
    tmp_path: Path, public_dir: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to send as other users")
    path = public_dir / "probe.sock"
    config = make_config(tmp_path, probe={"socket_path": str(path)})
    agent = Agent(config, FakeSource(gpus=2))
    await agent.start()
    assert stat.S_IMODE(path.stat().st_mode) == 0o660  # the default: no longer world-writable
    await agent.shutdown()
    # an operator who opens the socket to everyone still gets every sender checked by its kernel credentials
    config = make_config(tmp_path, probe={"socket_path": str(path), "socket_mode": 0o666})
    env = {"PATH": os.environ.get("PATH", ""), "SENTINEL_JOB_ID": "train-a", "RANK": "5"}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)  # root's job
    source = FakeSource(gpus=2)
    source.pids = {1: [rank.pid]}
    agent = Agent(config, source)
    await agent.start()
    try:
        await agent.step(0.5)
        assert agent.probe is not None
        forged = msgspec.structs.replace(HEADS, job_id="train-a", pid=rank.pid)
        _send_as(65534, str(path), msgspec.msgpack.encode(forged))  # nobody speaks for root's job: refused
        own = msgspec.structs.replace(HEADS, job_id="nobodys-job", rank=0, pid=1)
        _send_as(65534, str(path), msgspec.msgpack.encode(own))  # its own job: kept, with its real pid
        _send_as(65533, str(path), msgspec.msgpack.encode(own))  # another user for that job: refused
        deadline = time.monotonic() + 5
        while agent.probe.received + agent.probe.refused < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert agent.probe.refused == 2 and agent.probe.received == 1
        batch = sent(await agent.step(1.0))
        assert [(h.job_id, h.rank) for h in batch.heads] == [("nobodys-job", 0)]
        assert batch.heads[0].pid not in (None, 1)  # the kernel's pid, not the claimed one
        assert batch.drops is not None and batch.drops.probe == 2
    finally:
        rank.kill()
        rank.wait()
        await agent.shutdown()


def test_a_flood_of_large_datagrams_is_bounded_in_bytes() -> None:
    server = ProbeServer("/nonexistent/probe.sock", max_pending_bytes=1 << 20)
    big = msgspec.structs.replace(HEADS, pgs=[PgHead(pg_name="0", ranks=list(range(12000)))])
    data = msgspec.msgpack.encode(big)
    assert len(data) > 30000
    root = Credentials(pid=1, uid=0, gid=0)
    for _ in range(2000):  # ~70 MB offered
        server.receive(data, root)
    assert len(server) * len(data) <= 1 << 20
    assert server.overflowed == 2000 - len(server)
    assert server.drain()[-1] == big
