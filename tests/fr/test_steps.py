"""Step compute times from sampled per-group counters (the probe's StepClock) and, for a step group whose
counters mix, from entries (steps_from_entries); and through the probe."""

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
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sentinel.fr.heads import FrHeads, StepTime
from sentinel.fr.steps import StepClock, steps_from_entries
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


# -- a step group whose counters mix: step times from entries -------------------------------------------

BASE_NS = 1_700_000_000_000_000_000
LAUNCH_NS = 40_000  # the CPU enqueues an op this long before the device starts it


def _pipeline_entries(
    computes: list[float], *, wait_s: float = 0.05, timed: bool = True, batched: bool = False
) -> list[dict[str, Any]]:
    """SYNTHETIC NCCL-format entries (flight recorder 2.x fields; torch 2.5+ ProcessGroupNCCL, whose
    default group here carries both the pipeline's send/recv and the step's all_reduce) of one rank,
    oldest first. Step k (from 1): compute ``computes[k - 1]`` s, send #k to the next stage (20 ms; or,
    ``batched``, a batch_isend_irecv of a send and a recv: members without work, then their
    ``nccl:coalesced`` closer, is_p2p False as torch 2.5 records it), compute 0.3 s more, all_reduce #k
    (it waits ``wait_s`` inside for its peers, then 10 ms). ``timed``: start times recorded
    (TORCH_NCCL_ENABLE_TIMING), else null. Nothing here was written by NCCL itself."""
    out: list[dict[str, Any]] = []
    t = BASE_NS

    def op(name: str, seq: int, p2p_seq: int, is_p2p: bool, start: int | None, end: int | None) -> None:
        out.append(
            {
                "record_id": len(out),
                "pg_id": 0,
                "process_group": ["0", "default_pg"],
                "collective_seq_id": seq,
                "p2p_seq_id": p2p_seq,
                "is_p2p": is_p2p,
                "profiling_name": f"nccl:{name}",
                "state": "completed" if end is not None else "scheduled",
                "retired": end is not None,
                "time_created_ns": (start if start is not None else t) - LAUNCH_NS,
                "time_discovered_started_ns": start if timed else None,
                "time_discovered_completed_ns": end,
                "duration_ms": None if end is None or start is None else (end - start) / 1e6,
            }
        )

    for k, compute in enumerate(computes, start=1):
        t += int(compute * 1e9)
        if batched:
            op("send 0->1", k - 1, k, True, None, None)
            op("recv 0<-1", k - 1, k, True, None, None)
            op("coalesced", k - 1, k, False, t, t + 20_000_000)
        else:
            op("send 0->1", k - 1, k, True, t, t + 20_000_000)
        t += 20_000_000 + 300_000_000
        op("all_reduce", k, k, False, t, t + int((wait_s + 0.01) * 1e9))
        t += int((wait_s + 0.01) * 1e9)
    return out


def test_a_step_group_whose_counters_mix_gets_its_step_times_from_entries() -> None:
    """Step k+1's compute is the gap from all_reduce #k's completion to the next op entered (send
    #k+1): read from the entries' own times, the step collectives known by name; a send's completion ends
    no step, and a peer waiting 0.4 s inside the all_reduce computes as long as the others."""
    computes = [0.5, 0.7, 0.6, 0.9, 0.5]
    for wait_s in (0.05, 0.4):
        steps = steps_from_entries(_pipeline_entries(computes, wait_s=wait_s))
        assert [s.seq for s in steps] == [2, 3, 4, 5]  # the last all_reduce has no next op yet
        assert [s.compute_s for s in steps] == pytest.approx(computes[1:], abs=1e-6)


def test_without_start_times_the_enqueue_times_are_read() -> None:
    computes = [0.5, 0.7, 0.6]
    steps = steps_from_entries(_pipeline_entries(computes, timed=False))
    assert [s.seq for s in steps] == [2, 3]
    # the next send is enqueued LAUNCH_NS before it starts: its enqueue ends the gap (the enqueued count)
    assert [s.compute_s for s in steps] == pytest.approx([c - LAUNCH_NS / 1e9 for c in computes[1:]])


def test_a_batch_closer_is_not_read_as_a_step() -> None:
    """torch 2.5 records a send/recv batch's nccl:coalesced closer with is_p2p False and the group's last
    collective seq: read as a collective it ended a step "k" after every batch."""
    computes = [0.5, 0.7, 0.6]
    steps = steps_from_entries(_pipeline_entries(computes, batched=True))
    assert [s.seq for s in steps] == [2, 3]
    assert [s.compute_s for s in steps] == pytest.approx(computes[1:], abs=1e-6)


def test_another_groups_entry_ends_the_gap_and_other_groups_never_end_a_step() -> None:
    entries = _pipeline_entries([0.5, 0.7])
    done = entries[1]["time_discovered_completed_ns"]  # all_reduce #1
    tp = dict(entries[1], pg_id=1, process_group=["1", "tp"], record_id=99)
    tp.update(time_discovered_started_ns=done + 100_000_000, time_discovered_completed_ns=done + 110_000_000)
    steps = steps_from_entries([*entries[:2], tp, *entries[2:]])
    assert [s.seq for s in steps] == [2]  # tp's all_reduce ends no step of the default group
    assert steps[0].compute_s == pytest.approx(0.1)  # but it ends the compute: the rank communicates


_FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=2),
)
_TIME = st.integers(BASE_NS, BASE_NS + 10**11)
#: an entry of the right shape (its fields' types as torch writes them), from which the others are bent
_WELL_FORMED = st.fixed_dictionaries(
    {
        "pg_id": st.integers(0, 2),
        "collective_seq_id": st.integers(0, 50),
        "p2p_seq_id": st.integers(-1, 50),
        "is_p2p": st.booleans(),
        "profiling_name": st.sampled_from(
            ["nccl:all_reduce", "nccl:send 0->1", "nccl:recv 0<-1", "nccl:coalesced", "gloo:barrier"]
        ),
        "state": st.sampled_from(["scheduled", "started", "completed"]),
        "retired": st.booleans(),
        "time_created_ns": _TIME,
        "time_discovered_started_ns": st.one_of(st.none(), _TIME),
        "time_discovered_completed_ns": st.one_of(st.none(), _TIME),
    }
)
_FIELDS = [
    "pg_id",
    "collective_seq_id",
    "p2p_seq_id",
    "is_p2p",
    "profiling_name",
    "state",
    "retired",
    "time_created_ns",
    "time_discovered_started_ns",
    "time_discovered_completed_ns",
]


def _bent(entry: dict[str, Any], fields: dict[str, Any], drop: bool) -> dict[str, Any]:
    """``entry`` with ``fields`` given other values, or (``drop``) left out."""
    if drop:
        return {k: v for k, v in entry.items() if k not in fields}
    return {**entry, **fields}


_ENTRY = st.one_of(
    _WELL_FORMED,
    st.builds(
        _bent,
        _WELL_FORMED,
        st.dictionaries(st.sampled_from(_FIELDS), _FIELD_VALUES, min_size=1, max_size=4),
        st.booleans(),
    ),
    _FIELD_VALUES,  # not an object at all
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.lists(_ENTRY, min_size=1, max_size=40), _FIELD_VALUES))
@example([{"pg_id": [0], "collective_seq_id": 1, "p2p_seq_id": 1, "profiling_name": "nccl:send 0->1"}])
def test_entries_of_any_shape_give_valid_step_times_or_none(entries: Any) -> None:
    steps = steps_from_entries(entries)
    assert [s.seq for s in steps] == sorted({s.seq for s in steps})
    assert all(0.0 <= s.compute_s <= 86400.0 for s in steps)
    msgspec.msgpack.decode(msgspec.msgpack.encode(steps), type=list[StepTime])  # within the schema


def test_the_probe_reads_a_mixed_step_groups_steps_from_a_dump_of_every_entry(tmp_path: Path) -> None:
    """The probe's first dump shows the default group post a send (its counters mix: no step times from
    them); from then on a dump of every entry gives them, at most every STEP_ENTRIES_EVERY_S and only
    when the group's status moved since."""
    from sentinel.probe import STEP_ENTRIES_EVERY_S

    path = str(tmp_path / "probe.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    computes = [0.5, 0.7, 0.6, 0.9, 0.5, 0.8]
    entries = _pipeline_entries(computes)
    status = {"0": _counts(6, 6)}
    active = msgspec.json.encode({"version": "2.10", "entries": [], "pg_status": status})
    first = msgspec.json.encode({"version": "2.10", "entries": entries[-2:-1], "pg_status": status})
    every = msgspec.json.encode({"version": "2.10", "entries": entries, "pg_status": status})
    dumps = [first]
    taken: list[int] = []

    def every_fn() -> bytes:
        taken.append(1)
        return every

    probe = Probe(
        2.0,
        path,
        dump_fn=lambda: dumps.pop() if dumps else active,
        status_fn=lambda: pickle.dumps({"pg_status": status}),
        all_fn=every_fn,
    )
    now = BASE_NS / 1e9 + 10.0
    assert probe.snapshot(now) is not None  # learns that the default group mixes
    assert 0 in probe._p2p_groups and probe.steps.recent() == [] and taken == []
    probe.snapshot(now + 2.0)
    assert len(taken) == 1
    assert [s.seq for s in probe.steps.recent()] == [2, 3, 4, 5, 6]
    assert [s.compute_s for s in probe.steps.recent()] == pytest.approx(computes[1:], abs=1e-6)
    heads = msgspec.msgpack.decode(probe.snapshot(now + 4.0) or b"", type=FrHeads)
    assert [s.seq for s in heads.steps] == [2, 3, 4, 5, 6] and len(taken) == 1  # not due again yet
    probe.snapshot(now + 2.0 + STEP_ENTRIES_EVERY_S)
    assert len(taken) == 1  # the status stood still: no step completed, no dump
    status["0"] = _counts(7, 7)  # the group moved: there may be new steps
    probe.snapshot(now + 4.0 + STEP_ENTRIES_EVERY_S)
    assert len(taken) == 2 and [s.seq for s in probe.steps.recent()] == [2, 3, 4, 5, 6]  # no step twice
    server.close()
