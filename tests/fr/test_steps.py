"""Step compute times from sampled per-group counters (the probe's StepClock), and through the probe."""

from __future__ import annotations

import bisect
import json
import os
import pickle
import random
import socket
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from sentinel.fr.heads import FrHeads
from sentinel.fr.steps import StepClock
from sentinel.probe import Probe
from tests.support import REPO, TORCH_PROCESS_TIMEOUT_S


def _status(world: tuple[int, int], tp: tuple[int, int] | None = None) -> dict[str, dict[str, str]]:
    out = {
        "0": {
            "last_enqueued_collective": str(world[0]),
            "last_started_collective": "-1",
            "last_completed_collective": str(world[1]),
        }
    }
    if tp is not None:
        out["1"] = {
            "last_enqueued_collective": str(tp[0]),
            "last_started_collective": "-1",
            "last_completed_collective": str(tp[1]),
        }
    return out


def _run_rank(compute_s: float, wait_s: float, steps: int, dt: float = 0.05) -> StepClock:
    """A rank: compute, tp allreduce (waits ``wait_s`` inside for a slow peer), world allreduce, repeat."""
    clock = StepClock()
    t = 0.0
    for k in range(1, steps + 1):
        start = t
        while t < start + compute_s:
            clock.observe(t, _status((k - 1, k - 1), (k - 1, k - 1)))
            t += dt
        tp_end = t + wait_s + 0.01
        while t < tp_end:
            clock.observe(t, _status((k - 1, k - 1), (k, k - 1)))
            t += dt
        world_end = t + 0.02
        while t < world_end:
            clock.observe(t, _status((k, k - 1), (k, k)))
            t += dt
    clock.observe(t, _status((steps, steps), (steps, steps)))
    return clock


def test_compute_is_measured_to_a_sample_and_a_waiting_peer_is_not_slow() -> None:
    slow = _run_rank(compute_s=1.2, wait_s=0.0, steps=10).recent()
    peer = _run_rank(compute_s=1.0, wait_s=0.2, steps=10).recent()  # waits 0.2 s inside tp for the slow one
    assert [s.seq for s in slow] == list(range(3, 11))  # the latest 8 steps (first step has no start)
    assert all(s.compute_s == pytest.approx(1.2, abs=0.06) for s in slow)
    assert all(s.compute_s == pytest.approx(1.0, abs=0.06) for s in peer)


def test_garbage_status_is_ignored() -> None:
    clock = StepClock()
    clock.observe(0.0, {"0": {"last_completed_collective": "x"}, "1": "nonsense"})
    clock.observe(0.1, {})
    assert clock.recent() == []


def test_the_probe_samples_its_status_and_sends_step_times(tmp_path: Path) -> None:
    path = str(tmp_path / "probe.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    current = [_status((0, 0))]
    raw = msgspec.json.encode({"version": "2.10", "entries": [], "pg_status": current[0]})
    probe = Probe(2.0, path, dump_fn=lambda: raw, status_fn=lambda: pickle.dumps({"pg_status": current[0]}))
    base, t = 1.7e9, 0.0
    for k in range(1, 6):  # compute 0.5 s, then a short world allreduce
        for phase_s, status in ((0.5, _status((k - 1, k - 1))), (0.1, _status((k, k - 1)))):
            current[0] = status
            end = t + phase_s
            while t < end - 1e-9:
                probe.sample(now=base + t)
                t += 0.05
    assert probe.tick()
    heads = msgspec.msgpack.decode(server.recv(1 << 16), type=FrHeads)
    assert [s.seq for s in heads.steps] == [2, 3, 4, 5]
    assert all(s.compute_s == pytest.approx(0.5, abs=0.06) for s in heads.steps)
    server.close()


JOB = """
import json, os, sys, time
os.environ['TORCH_FR_BUFFER_SIZE'] = '200'
import torch, torch.distributed as dist
from sentinel.probe import Probe
rank = int(sys.argv[2])
store = dist.FileStore(sys.argv[1], 2)
dist.init_process_group('gloo', store=store, rank=rank, world_size=2)
probe = Probe(2.0, sys.argv[1] + '.sock', sample_s=0.01)
probe._thread.start()  # samples every 10 ms; its sends fail (no agent) and are only counted
t = torch.ones(8)
for _ in range(25):
    time.sleep(0.1 + (0.12 if rank == 1 else 0.0))  # rank 1: 120 ms more compute per step
    dist.all_reduce(t)
probe.stop()
print(json.dumps([s.compute_s for s in probe.steps.recent()]))
dist.destroy_process_group()
"""


def test_real_torch_ranks_measure_their_own_compute_a_waiting_peer_does_not_look_slow(tmp_path: Path) -> None:
    """Two gloo ranks, rank 1 computes 120 ms more per step: its measured compute says so, rank 0's does not
    (rank 0 waits for it inside the allreduce)."""
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    store = str(tmp_path / "store")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), store, str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2"},
        )
        for rank in (0, 1)
    ]
    medians = []
    for proc in procs:
        out, err = proc.communicate(timeout=TORCH_PROCESS_TIMEOUT_S)
        assert proc.returncode == 0, err[-2000:]
        values = json.loads(out)
        assert len(values) == 8
        medians.append(statistics.median(values))
    # Both ranks sleep at least their compute (read to the probe's 10 ms sampling); a loaded machine
    # oversleeps both alike, so rank 1's extra is read against rank 0's. Were rank 0's wait inside the
    # allreduce counted, it would read ~0.22 s.
    assert 0.07 <= medians[0] < 0.16
    assert medians[1] - medians[0] == pytest.approx(0.12, abs=0.04)


def test_a_new_wait_that_persists_gets_one_detailed_dump_whatever_the_spacing() -> None:
    """Stall evidence must name the op: the probe details a persisting wait once, even 3 s after a full dump."""
    probe = Probe(2.0, "/nonexistent", dump_fn=lambda: b"")
    probe._known_groups = {0: ("0", "default_pg")}
    probe._last_full = 99.0
    waiting = {"0": {"last_enqueued_collective": "5", "last_completed_collective": "4"}}
    assert not probe._needs_full(waiting, 100.0)  # first seen waiting
    assert probe._needs_full(waiting, 102.5)  # persisted a tick: detail it now, not 30 s later
    probe._last_full = 102.5
    assert not probe._needs_full(waiting, 105.0)  # the same wait: once is enough
    later = {"0": {"last_enqueued_collective": "6", "last_completed_collective": "5"}}
    assert not probe._needs_full(later, 106.0)
    assert probe._needs_full(later, 108.5)  # a new wait: detailed again


def _mixed_job_probe(
    tmp_path: Path, p2p_group: str
) -> tuple[Probe, socket.socket, list[dict[str, dict[str, str]]]]:
    """A probe behind fakes of torch's two dumps (``_dump_fr_trace`` with the status only, and the JSON one
    of the active entries), whose first dump shows group ``p2p_group`` post a send (NCCL: its pg_status
    then mixes send/recv and collective work). Returns the probe, the agent's socket and the status cell."""
    path = str(tmp_path / "probe.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    names = {"0": ("0", "default_pg"), "1": ("1", "pp")}
    send = {
        "pg_id": int(p2p_group),
        "process_group": list(names[p2p_group]),
        "profiling_name": "nccl:send 0->1",
        "collective_seq_id": 0,
        "p2p_seq_id": 100,
        "op_id": 1,
        "is_p2p": True,
        "state": "scheduled",
        "time_created_ns": int(1.7e18),
    }
    other = "1" if p2p_group == "0" else "0"
    collective = dict(send, pg_id=int(other), process_group=list(names[other]), is_p2p=False)
    collective.update(profiling_name="nccl:all_reduce", collective_seq_id=1, p2p_seq_id=0)
    entries = [send, collective]
    current = [{pg: _status((0, 0))["0"] for pg in ("0", "1")}]
    raw = msgspec.json.encode({"version": "2.10", "entries": entries, "pg_status": current[0]})
    probe = Probe(2.0, path, dump_fn=lambda: raw, status_fn=lambda: pickle.dumps({"pg_status": current[0]}))
    assert probe.tick()
    server.recv(1 << 16)
    assert set(probe._p2p_groups) == {int(p2p_group)}
    return probe, server, current


def _counts(enqueued: int, completed: int) -> dict[str, str]:
    return {
        "last_enqueued_collective": str(enqueued),
        "last_started_collective": "-1",
        "last_completed_collective": str(completed),
    }


def test_a_group_whose_counters_mix_send_recv_ends_compute_when_its_value_drops(tmp_path: Path) -> None:
    """Group 1 (pp) posts send/recv on NCCL: its pg_status values are the last work's seq of either counter.
    Each step: compute 0.5 s, an all_reduce of group 1 (collective #k, entered after send #100+k-1, so the
    enqueued value drops from 99+k to k) in which the rank waits 0.3 s for a slow peer, send #100+k, then
    the world all_reduce #k (the step). Read as collective seqs only a rise ends the compute gap: the
    drop was missed and the wait counted as compute (0.8 s), so a waiting peer looked slow."""
    probe, server, current = _mixed_job_probe(tmp_path, "1")
    base, t = 1.7e9, 0.0

    def run(phase_s: float, world: tuple[int, int], pp: tuple[int, int]) -> None:
        nonlocal t
        current[0] = {"0": _counts(*world), "1": _counts(*pp)}
        end = t + phase_s
        while t < end - 1e-9:
            probe.sample(now=base + t)
            t += 0.05

    for k in range(1, 7):
        run(0.5, (k - 1, k - 1), (99 + k, 99 + k))  # computing (send #99+k of the last step completed)
        run(0.3, (k - 1, k - 1), (k, 99 + k))  # inside all_reduce #k of group 1
        run(0.1, (k - 1, k - 1), (100 + k, 100 + k))  # send #100+k
        run(0.1, (k, k - 1), (100 + k, 100 + k))  # inside the world all_reduce #k
    run(0.05, (6, 6), (106, 106))
    steps = probe.steps.recent()
    assert [s.seq for s in steps] == [2, 3, 4, 5, 6]
    assert all(s.compute_s == pytest.approx(0.5, abs=0.06) for s in steps), steps
    server.close()


def test_a_step_group_whose_counters_mix_reads_no_step_from_a_completed_send_recv(tmp_path: Path) -> None:
    """The world group (the step group) posts send/recv too: a completed send #100+k reads 100+k against
    the step's all_reduce #k, which says nothing of a step. Read as a collective seq it ended "step
    101+k"; the counters cannot tell a send/recv from the step's all_reduce, so they end none."""
    probe, server, current = _mixed_job_probe(tmp_path, "0")
    base, t = 1.7e9, 0.0
    for k in range(1, 5):
        for phase_s, world in (
            (0.5, (99 + k, 99 + k)),  # computing after send #99+k
            (0.1, (k, 99 + k)),  # inside the step's all_reduce #k
            (0.1, (k, k)),  # it completed
            (0.1, (100 + k, k)),  # send #100+k
            (0.1, (100 + k, 100 + k)),  # completed
        ):
            current[0] = {"0": _counts(*world), "1": _counts(0, 0)}
            end = t + phase_s
            while t < end - 1e-9:
                probe.sample(now=base + t)
                t += 0.05
    assert probe.steps.recent() == []
    server.close()


def _median_read(probe: Probe, compute_s: float, wait: Callable[[], float], steps: int = 40) -> float:
    """A rank computing ``compute_s`` per step, then a 3 ms world all_reduce, its counters sampled by
    ``probe`` at the instants ``wait`` spaces (from a random phase): the median of the compute times of its
    last 32 steps (the aggregator's window) as the probe read them."""
    entered, completed = [], []  # when world all_reduce #k was entered / completed (k = index + 1)
    t = 0.05 * probe._sample_rng.random()
    for _ in range(steps):
        t += compute_s
        entered.append(t)
        t += 0.003
        completed.append(t)
    status = [_status((0, 0))]
    probe._status_fn = lambda: pickle.dumps({"pg_status": status[0]})
    read: dict[int, float] = {}
    now = 0.0
    while now < completed[-1] + 0.1:
        status[0] = _status((bisect.bisect_right(entered, now), bisect.bisect_right(completed, now)))
        probe.sample(now=1.7e9 + now)
        read.update((s.seq, s.compute_s) for s in probe.steps.recent())
        now += wait()
    last = [read[seq] for seq in sorted(read)][-32:]
    assert len(last) == 32
    return statistics.median(last)


@pytest.mark.parametrize("compute_s", [0.06, 0.12, 0.275, 0.575])
def test_the_median_step_read_at_the_probes_random_instants_is_the_compute_time(compute_s: float) -> None:
    """Each step is read to about one sample interval (50 ms); what the straggler detector compares is the
    median over 32 steps, which must be the compute time itself. At a fixed 50 ms period it was a whole
    number of periods: 120 ms read 100 ms (a 1.2x straggler of 100 ms peers unseen), 275 ms read 250 or
    300 ms depending on the phase (identical ranks 1.2x apart). At the probe's random instants every phase
    reads within a quarter of a sample interval."""
    for seed in range(4):
        probe = Probe(2.0, "/nonexistent", sample_rng=random.Random(seed))
        waits = [probe.next_sample_wait() for _ in range(2000)]
        assert 0.5 * probe.sample_s <= min(waits) and max(waits) <= 1.5 * probe.sample_s
        assert statistics.fmean(waits) == pytest.approx(probe.sample_s, rel=0.02)  # the same rate
        read = _median_read(probe, compute_s, probe.next_sample_wait)
        assert read == pytest.approx(compute_s, abs=0.25 * probe.sample_s), (seed, read)
