"""The simulated cluster's semantics (contract section 4 fault table) and the SimHost interface."""

from __future__ import annotations

import threading
import time

import pytest

from sentinel.agent.jobs import JobMapper
from sentinel.agent.probe import decode_heads
from sentinel.agent.source import GpuLostError
from sentinel.components.clocks.rule import violation_shares
from sentinel.signals.classify import classify_line
from sentinel.sim.cluster import ClusterSim
from sentinel.sim.host import SimCluster, SimHost
from sentinel.sim.scenario import load_scenario_text


def scenario(faults: str = "", hosts: int = 4, extra: str = "") -> str:
    return f"""
seed = 3
duration_s = 120
[cluster]
hosts = {hosts}
gpus_per_host = 8
[[jobs]]
id = "j"
{extra}
{faults}
"""


def fault(kind: str, at: float, host: str = "host-001", gpu: int | None = 2, **params: float) -> str:
    lines = [f'[[faults]]\nat_s = {at}\nhost = "{host}"\nkind = "{kind}"']
    if gpu is not None:
        lines.append(f"gpu = {gpu}")
    lines += [f"{k} = {v}" for k, v in params.items()]
    return "\n".join(lines) + "\n"


def completed(cluster: ClusterSim, t: float) -> dict[int, int]:
    """World-group completed seq per rank at t."""
    out: dict[int, int] = {}
    for host in cluster.hosts:
        for heads in cluster.heads(host, t):
            world = next(pg for pg in heads.pgs if pg.pg_desc == "default_pg")
            out[heads.rank] = world.last_completed_seq
    return out


def test_healthy_job_progresses_in_lockstep() -> None:
    cluster = ClusterSim(load_scenario_text(scenario()))
    cluster.advance(30.0)
    done = completed(cluster, 30.0)
    assert len(done) == 32
    assert max(done.values()) - min(done.values()) <= 1
    assert 25 <= max(done.values()) <= 40  # ~0.85 s per step


def test_hang_blocks_every_peer_in_the_next_collective() -> None:
    cluster = ClusterSim(load_scenario_text(scenario(fault("hang", 10.0))))
    cluster.advance(40.0)
    job = cluster.jobs["j"]
    assert job.stalled
    hung_rank = 1 * 8 + 2
    heads = {h.rank: h for host in cluster.hosts for h in cluster.heads(host, 40.0)}
    hung = heads[hung_rank]
    assert all(not pg.in_flight for pg in hung.pgs)  # it entered nothing
    waiting = [r for r, h in heads.items() if any(pg.in_flight for pg in h.pgs)]
    assert sorted(waiting) == sorted(set(heads) - {hung_rank})  # every peer waits somewhere
    for r in waiting:
        assert max(f.age_s for pg in heads[r].pgs for f in pg.in_flight) > 20
    assert cluster.sample(cluster.hosts[1], cluster.hosts[1].gpus[2], 40.0, slow=False).util_gpu_pct == 0.0


def test_straggler_slows_the_whole_job_and_waits_on_it() -> None:
    base = ClusterSim(load_scenario_text(scenario()))
    slow = ClusterSim(load_scenario_text(scenario(fault("straggler", 0.0, slowdown=2.0))))
    base.advance(60.0)
    slow.advance(60.0)
    fast_steps = max(completed(base, 60.0).values())
    slow_steps = max(completed(slow, 60.0).values())
    assert 1.6 < fast_steps / slow_steps < 2.4


def test_thermal_throttle_drops_the_clock_and_slows_the_rank() -> None:
    cluster = ClusterSim(load_scenario_text(scenario(fault("thermal_throttle", 5.0, clock_mhz=990.0))))
    cluster.advance(20.0)
    gpu = cluster.hosts[1].gpus[2]
    reading = cluster.sample(cluster.hosts[1], gpu, 20.0, slow=False)
    assert reading.sm_clock_mhz == 990.0 and "hw_thermal_slowdown" in reading.throttle
    assert cluster.jobs["j"].ranks[10].factor == pytest.approx(2.0)


def test_a_thermally_throttled_gpu_accumulates_thermal_violation_time_and_a_healthy_one_none() -> None:
    cluster = ClusterSim(load_scenario_text(scenario(fault("thermal_throttle", 5.0, clock_mhz=990.0))))
    host = cluster.hosts[1]
    cluster.advance(20.0)
    before = {g: cluster.sample(host, host.gpus[g], 20.0, slow=True).violations for g in (1, 2)}
    cluster.advance(30.0)
    after = {g: cluster.sample(host, host.gpus[g], 30.0, slow=True).violations for g in (1, 2)}
    shares = {g: violation_shares(before[g], after[g]) for g in (1, 2)}  # type: ignore[arg-type]
    assert shares[2]["thermal"] > 0.9  # the throttled GPU: heat held its clocks back nearly all the time
    assert shares[1]["thermal"] == 0.0 and shares[1]["power"] < 0.005  # a busy healthy one: noise at most
    assert shares[2]["power"] < 0.005
    assert cluster.sample(host, host.gpus[2], 30.0, slow=False).violations is None  # read on slow ticks only


def test_gpu_lost_kills_its_rank_and_stalls_the_job() -> None:
    cluster = ClusterSim(load_scenario_text(scenario(fault("gpu_lost", 10.0))))
    cluster.advance(30.0)
    host = cluster.hosts[1]
    assert cluster.jobs["j"].ranks[10].dead_at == 10.0
    assert all(h.rank != 10 for h in cluster.heads(host, 30.0))
    assert cluster.jobs["j"].stalled


def test_nccl_net_error_stalls_with_every_rank_inside_and_logs_warn_lines() -> None:
    cluster = ClusterSim(load_scenario_text(scenario(fault("nccl_net_error", 10.0))))
    cluster.advance(30.0)
    heads = [h for host in cluster.hosts for h in cluster.heads(host, 30.0)]
    world = [next(pg for pg in h.pgs if pg.pg_desc == "default_pg") for h in heads]
    seqs = {pg.in_flight[0].seq for pg in world if pg.in_flight}
    assert all(pg.in_flight for pg in world) and len(seqs) == 1
    lines = [line for _, _, line in cluster.hosts[1].job_lines]
    assert lines and all("NCCL WARN NET/IB" in line for line in lines)
    classified = classify_line(lines[0])
    assert classified is not None and classified.kind == "nccl_warn_net"
    assert classified.pid == cluster.hosts[1].gpus[2].pid  # how the aggregator finds the rank


def test_xid_line_is_what_the_signals_parser_reads() -> None:
    cluster = ClusterSim(load_scenario_text(scenario(fault("xid", 5.0, xid=79))))
    cluster.advance(6.0)
    host = cluster.hosts[1]
    _, _, line = host.kernel_lines[0]
    classified = classify_line(line)
    assert classified is not None and classified.kind == "xid" and classified.xid == 79
    assert classified.pci_bus == host.gpus[2].pci_bus


def test_simhost_implements_the_gpu_source() -> None:
    text = scenario(
        fault("gpu_lost", 1.0) + fault("nvml_hang", 1.0, gpu=3) + fault("xid", 1.0, gpu=4, xid=48)
    )
    start = time.time()
    cluster = SimCluster(load_scenario_text(text), started_at=start - 5.0, clock=time.time)
    host: SimHost = cluster.hosts[1]
    inventory = host.open()
    assert [g.index for g in inventory] == list(range(8)) and len({g.uuid for g in inventory}) == 8
    now = time.time()
    sample = host.read_slow(0, now)
    assert sample.t == now and sample.remap is not None and sample.ecc is not None
    with pytest.raises(GpuLostError):
        host.read_fast(2, now)
    xids = host.wait_xid_events(0.1)
    assert [(x.gpu, x.xid) for x in xids] == [(4, 48)]
    records = host.kernel_log.poll(now)  # raw /dev/kmsg records through the agent's own parser
    assert any("Xid" in r.message and r.priority == 4 and r.seq for r in records)
    assert host.kernel_log.poll(now) == []  # each record is read once
    datagrams = host.probe.receive(now)
    assert datagrams and host.probe.receive(now) == []  # probe cadence
    heads = [decode_heads(data, 65536) for data, _ in datagrams]
    assert all(h.host is None and h.gpu is None for h in heads)  # the probe cannot know; the agent fills in
    assert {creds.pid for _, creds in datagrams if creds} == {h.pid for h in heads}
    # the process table as the agent's job mapper reads it: rank 10 lost its GPU, rank 12 was killed by
    # Xid 48; rank 11 (NVML hang) still runs
    mapper = JobMapper(processes=host.processes, listpids=None)
    procs = mapper.map({g.index: [g.pid] for g in host.host.gpus})
    assert {p.rank for p in procs if p.job_id == "j"} == {8, 9, 11, 13, 14, 15}
    assert {p.local_rank for p in procs if p.rank == 11} == {3}

    result: list[BaseException] = []

    def hung_call() -> None:
        try:
            host.read_fast(3, time.time())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=hung_call, daemon=True)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive(), "an NVML hang must block"
    host.close()
    thread.join(2.0)
    assert not thread.is_alive() and result
    cluster.close()


def test_heads_read_every_tick_are_the_heads_read_once() -> None:
    """What a rank's heads say at t does not depend on whether they were read before (per-iteration parts
    are made once and kept), also across a fault that changes a rank after its heads were read."""
    text = scenario(fault("straggler", 29.0, slowdown=1.5) + fault("hang", 40.0, host="host-002", gpu=5))
    polled, fresh = ClusterSim(load_scenario_text(text)), ClusterSim(load_scenario_text(text))
    for step in range(0, 61):
        polled.advance(step * 0.5)
        fresh.advance(step * 0.5)
        for host in polled.hosts:
            polled.heads(host, step * 0.5)
    for host_polled, host_fresh in zip(polled.hosts, fresh.hosts, strict=True):
        assert polled.heads(host_polled, 30.0) == fresh.heads(host_fresh, 30.0)
        assert polled.heads(host_polled, 30.0)  # every rank is alive and speaking


def test_a_ports_repeated_readings_are_the_models_readings() -> None:
    """A port read before any fault (whose unchanging parts are kept) reads what the full model computes,
    idle, busy, and after faults that change it."""
    text = scenario(
        fault("link_slow", 30.0, slowdown=2.0) + fault("link_flap", 50.0, host="host-002", gpu=1),
        extra="start_s = 10.0",
    )
    model = ClusterSim(load_scenario_text(text))
    for t in [0.0, 5.0, 10.0, 11.0, 12.5, 29.0, 31.0, 49.0, 52.0, 70.0]:
        model.advance(t)
        for host in model.hosts:
            for port in host.ports:
                assert port.reading(t) == port._read(t)
