"""Live progress: snapshot reduction, the probe's datagrams, and the dump-pipe trigger."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.fr.errors import FrFormatError
from sentinel.fr.heads import FrHeads, InFlight, PgHead
from sentinel.fr.reduce import reduce_snapshot
from sentinel.fr.trigger import trigger_dumps
from sentinel.probe import MAX_DATAGRAM, Probe, encode_capped
from tests.fr.synth import T0, entry
from tests.support import REPO, TORCH_PROCESS_TIMEOUT_S, need_module

NOW = T0 / 1e9 + 100.0


def _snapshot(active: list[dict[str, object]], status: dict[str, tuple[int, int]]) -> dict[str, object]:
    return {
        "version": "2.10",
        "entries": active,
        "pg_status": {
            k: {
                "last_enqueued_collective": str(e),
                "last_started_collective": "-1",
                "last_completed_collective": str(d),
            }
            for k, (e, d) in status.items()
        },
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
    }


def test_reduce_snapshot_maps_pg_ids_and_ages() -> None:
    known: dict[int, tuple[str, str]] = {}
    snap = _snapshot([entry("0", 7, desc="default_pg", done=False, t_ms=40_000)], {"0": (7, 6), "1": (3, 3)})
    heads = reduce_snapshot(snap, rank=2, now=NOW, known_groups=known, job_id="j1")
    assert heads.rank == 2 and heads.job_id == "j1"
    [pg] = heads.pgs  # pg_id 1 has never been seen in an entry: its name is unknown
    assert (pg.pg_name, pg.last_enqueued_seq, pg.last_completed_seq) == ("0", 7, 6)
    assert pg.in_flight[0].seq == 7
    assert abs(pg.in_flight[0].age_s - 60.0) < 0.01
    assert known == {0: ("0", "default_pg")}


def _heads(rank: int, groups: list[tuple[str, str, int, int, list[int]]], age: float = 30.0) -> FrHeads:
    pgs = [
        PgHead(
            pg_name=name,
            pg_desc=desc,
            ranks=ranks,
            last_enqueued_seq=enq,
            last_completed_seq=done,
            in_flight=[InFlight(seq=done + 1, op="nccl:all_reduce", age_s=age)] if enq > done else [],
        )
        for name, desc, enq, done, ranks in groups
    ]
    return FrHeads(rank=rank, t=NOW, world_size=4, pgs=pgs)


def test_probe_sends_one_datagram_and_survives_a_missing_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "probe.sock")
    active = [entry("0", s, desc="default_pg", done=False, t_ms=1000 + s) for s in range(5, 2005)]
    raw = json.dumps(_snapshot(active, {"0": (2004, 4)})).encode()
    probe = Probe(2.0, path, dump_fn=lambda: raw)
    assert probe.tick() is False  # no agent yet: dropped, counted, no exception
    assert probe.stats.dropped == 1
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.settimeout(5)
    try:
        assert probe.tick() is True
        data = server.recv(1 << 17)
    finally:
        server.close()
    assert len(data) <= MAX_DATAGRAM
    heads = msgspec.msgpack.decode(data, type=FrHeads)
    assert heads.pid == os.getpid()
    assert heads.pgs[0].last_completed_seq == 4
    assert 0 < len(heads.pgs[0].in_flight) <= 2000
    assert heads.pgs[0].in_flight[0].seq == 5  # the oldest entries survive trimming


def test_encode_capped_trims_in_flight() -> None:
    flights = [InFlight(seq=i, op="nccl:all_reduce" * 20, age_s=1.0) for i in range(5000)]
    heads = FrHeads(rank=0, t=NOW, pgs=[PgHead(pg_name="0", in_flight=flights)])
    assert len(encode_capped(heads)) <= MAX_DATAGRAM


def test_heads_from_before_the_unconfirmed_field_decode_unchanged() -> None:
    """A probe older than ``InFlight.unconfirmed`` sends flights without it: they decode confirmed (its
    ages were capped, or true where nothing could confirm them); the new field round-trips."""
    old = {
        "rank": 3,
        "t": NOW,
        "pgs": [
            {"pg_name": "0", "in_flight": [{"seq": 7, "op": "nccl:send 0->1", "age_s": 1.9, "p2p": True}]}
        ],
    }
    [flight] = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=FrHeads).pgs[0].in_flight
    assert flight == InFlight(seq=7, op="nccl:send 0->1", age_s=1.9, p2p=True)
    assert flight.unconfirmed is False
    marked = msgspec.structs.replace(flight, unconfirmed=True)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(marked), type=InFlight) == marked


def test_a_confirmation_is_progress_to_the_stuck_detector() -> None:
    """The same heads with a flight confirmed are not the same progress: the stall is examined again at
    once instead of being kept as examined while the op counted as no wait."""
    from sentinel.aggregator.state import same_progress

    flight = InFlight(seq=7, op="nccl:send 0->1", age_s=2.5, p2p=True, unconfirmed=True)
    before = FrHeads(rank=0, t=NOW, pgs=[PgHead(pg_name="0", in_flight=[flight])])
    older = msgspec.structs.replace(before, t=NOW - 2.0)
    confirmed = FrHeads(
        rank=0,
        t=NOW,
        pgs=[PgHead(pg_name="0", in_flight=[msgspec.structs.replace(flight, unconfirmed=False)])],
    )
    assert same_progress(older, before)
    assert not same_progress(before, confirmed)


def test_trigger_writes_into_fifos(tmp_path: Path) -> None:
    prefix = str(tmp_path / "dump_pipe_")
    os.mkfifo(f"{prefix}0.pipe")
    os.mkfifo(f"{prefix}1.pipe")  # nobody reads this one
    got: list[bytes] = []
    opened = threading.Event()

    def reader() -> None:
        fd = os.open(f"{prefix}0.pipe", os.O_RDONLY | os.O_NONBLOCK)
        opened.set()
        try:
            for _ in range(200):
                try:
                    data = os.read(fd, 16)
                except BlockingIOError:
                    data = b""
                if data:
                    got.append(data)
                    return
                threading.Event().wait(0.01)
        finally:
            os.close(fd)

    t = threading.Thread(target=reader)
    t.start()
    assert opened.wait(5)
    result = trigger_dumps(prefix, [0, 1, 2])
    t.join(5)
    assert result.triggered == [0]
    assert result.missing == [2]
    assert 1 in result.failed
    assert got == [b"1\n"]


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=6),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
        max_leaves=25,
    )
)
def test_reduce_snapshot_only_raises_our_error(obj: object) -> None:
    for snap in ({"entries": [obj], "pg_status": {"0": obj}}, {"entries": obj}, {"pg_status": obj}):
        with contextlib.suppress(FrFormatError):
            reduce_snapshot(snap, rank=0, now=NOW)


def test_probe_with_real_torch_gloo(tmp_path: Path) -> None:
    """A real gloo group's recorder through the probe: its first heads (a dump with entries, to learn the
    group's name) and its second (the status alone) both read the 50 all_reduces done.

    gloo marks an op completed in its recorder from its worker thread after the caller's wait() returned,
    so right after the loop the recorder may still say 49. The job waits for the recorder itself to say 50
    (its own status, read directly), not for the probe to agree: heads read that late from a recorder that
    is done are a probe failure, however loaded the machine (the old loop retried the probe until it agreed
    or 60 s passed, and failed twice at load 8-10 without saying which of the two lagged). The wait for
    torch is bounded only to say so: it prints what the recorder showed and exits 3."""
    need_module("torch")
    script = tmp_path / "job.py"
    script.write_text(
        "import json, os, socket, sys, time\n"
        "os.environ['TORCH_FR_BUFFER_SIZE'] = '200'\n"
        "import msgspec, torch, torch.distributed as dist\n"
        "from sentinel.fr.heads import FrHeads\n"
        "from sentinel.fr.safepickle import loads_plain\n"
        "from sentinel.probe import Probe\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "for _ in range(50): dist.all_reduce(torch.ones(8))\n"
        "c10d = torch._C._distributed_c10d\n"
        "def status():\n"
        "    raw = c10d._dump_fr_trace(includeCollectives=False, includeStackTraces=False, onlyActive=True)\n"
        "    return loads_plain(bytes(raw), source='test')['pg_status']['0']\n"
        "start = time.monotonic()\n"
        "while status()['last_completed_collective'] != 50:\n"
        "    if time.monotonic() - start > 180:\n"
        "        print('gloo recorder still at', status(), file=sys.stderr); sys.exit(3)\n"
        "    time.sleep(0.01)\n"
        "srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); srv.bind(sys.argv[1]); srv.settimeout(10)\n"
        "p = Probe(2.0, sys.argv[1])\n"
        "seen = []\n"
        "for _ in range(2):\n"
        "    ok = p.tick(); raw = srv.recv(1 << 16)\n"
        "    pg = msgspec.msgpack.decode(raw, type=FrHeads).pgs[0]\n"
        "    seen.append([ok, pg.last_enqueued_seq, pg.last_completed_seq])\n"
        "sys.stdout.buffer.write(raw)\n"
        "print(json.dumps([seen, p.stats.active_dumps, p.stats.dropped, p.stats.errors]), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s")],
        capture_output=True,
        cwd=REPO,
        timeout=TORCH_PROCESS_TIMEOUT_S,
        check=False,
        env={**os.environ, "RANK": "0", "WORLD_SIZE": "1", "SENTINEL_JOB_ID": "job-7"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen, active_dumps, dropped, errors = json.loads(proc.stderr.decode().strip().splitlines()[-1])
    assert seen == [[True, 50, 50], [True, 50, 50]], proc.stderr[-2000:]
    assert (active_dumps, dropped, errors) == (1, 0, {})  # names from the first, the status alone after
    heads = msgspec.msgpack.decode(proc.stdout, type=FrHeads)
    assert heads.job_id == "job-7" and heads.world_size == 1
    [pg] = heads.pgs
    assert pg.last_enqueued_seq == pg.last_completed_seq == 50
