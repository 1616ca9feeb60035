"""The agent's ``sentinel health`` judges its GPUs exactly as the aggregator's hardware detector does, without
importing the aggregator."""

from __future__ import annotations

import subprocess
import sys

from sentinel.agent.health import LocalHealth
from sentinel.aggregator.detectors.hardware import evaluate_gpu
from sentinel.aggregator.state import FleetState, HostView
from sentinel.components.xid.parse import xid_record
from sentinel.config.aggregator import DetectConfig
from sentinel.wire import Batch, Event, GpuInfo, GpuSample, GpuStateChanged, GpuWasReset, Hello, XidOccurred

HOST = "node-1"
GPUS = 4


def _hello() -> Hello:
    return Hello(
        host=HOST,
        boot_id="boot-1",
        gpus=[
            GpuInfo(index=i, uuid=f"GPU-{i}", pci_bus=f"0000:{0x18 + i:02x}:00", name="H100")
            for i in range(GPUS)
        ],
    )


def _batch(seq: int, t: float, events: list[Event], lost: frozenset[int] = frozenset()) -> Batch:
    samples = [
        GpuSample(gpu=i, t=t, state="lost" if i in lost else "ok", util_gpu_pct=90.0, temp_c=60.0)
        for i in range(GPUS)
    ]
    return Batch(seq=seq, t=t, samples=samples, events=events)


def _xid(t: float, gpu: int, code: int) -> XidOccurred:
    text = f"NVRM: Xid (PCI:0000:{0x18 + gpu:02x}:00): {code}, pid=1"
    return XidOccurred(t=t, gpu=gpu, text=text, record=xid_record(code, text))


def _both(t0: float) -> tuple[DetectConfig, FleetState, HostView, LocalHealth]:
    """The aggregator's fleet state and the agent's health, both greeted by the host at ``t0``."""
    detect = DetectConfig()
    fleet = FleetState(xid_config=detect.xid)
    health = LocalHealth(HOST, detect)
    view = fleet.hello(_hello(), t0)
    health.hello(_hello(), t0)
    return detect, fleet, view, health


def test_the_agent_and_the_aggregator_reach_the_same_findings() -> None:
    t0 = 1_000.0
    detect, fleet, view, health = _both(t0)
    script: list[tuple[float, list[Event], frozenset[int]]] = [
        (t0 + 1, [], frozenset()),
        # GPU 1 falls off the bus with its Xid; GPU 2 has an uncorrectable ECC Xid; GPU 3 is lost, no cause
        (t0 + 2, [_xid(t0 + 2, 1, 79), _xid(t0 + 2, 2, 48)], frozenset({1, 3})),
        (t0 + 3, [GpuStateChanged(t=t0 + 3, gpu=3, state="lost", previous="ok")], frozenset({1, 3})),
        (t0 + 30, [], frozenset({1, 3})),  # past the lost GPU's wait for an Xid that would explain it
        (t0 + 31, [GpuWasReset(t=t0 + 31, gpu=1)], frozenset({3})),  # GPU 1 reset: its latches clear
    ]
    seen: list[set[tuple[int | None, str, str, str]]] = []
    for seq, (t, events, lost) in enumerate(script):
        fleet.apply(view, _batch(seq, t, events, lost), t)
        health.apply(_batch(seq, t, events, lost), t)
        fleet.take_dirty()
        aggregator = {
            (f.gpu, f.kind, f.reason, f.action)
            for gpu in view.gpus
            for f in evaluate_gpu(gpu, detect.hardware, t, detect.ecc, reported_until=gpu.t)
        }
        agent = {(r.gpu, r.kind, r.reason, r.action) for r in health.reasons(t)}
        assert agent == aggregator
        seen.append(agent)
    assert seen[0] == set()
    assert {g for g, *_ in seen[2]} >= {1, 2}
    assert 3 in {g for g, *_ in seen[3]}  # the lost GPU named once its wait ran out
    assert 1 not in {g for g, *_ in seen[4]} and 2 in {g for g, *_ in seen[4]}


def test_a_storm_of_echoes_fails_only_its_origin_here_as_at_the_aggregator() -> None:
    """One GPU's uncontained error (Xid 95) echoed by the host's other GPUs within a second: the node's
    health check names the origin only, so Slurm's health program does not fail the node for every GPU."""
    t0 = 1_000.0
    detect, fleet, view, health = _both(t0)
    events: list[Event] = [_xid(t0 + 1 + gpu / 10, gpu, 95) for gpu in range(GPUS)]
    fleet.apply(view, _batch(1, t0 + 2, events), t0 + 2)
    health.apply(_batch(1, t0 + 2, events), t0 + 2)
    agent = {(r.gpu, r.kind, r.reason) for r in health.reasons(t0 + 2)}
    aggregator = {
        (f.gpu, f.kind, f.reason)
        for gpu in view.gpus
        for f in evaluate_gpu(gpu, detect.hardware, t0 + 2, detect.ecc, reported_until=gpu.t)
    }
    assert agent == aggregator == {(0, "faulty", "xid_95")}


def test_the_agents_health_does_not_load_the_aggregator() -> None:
    code = (
        "import sys, sentinel.agent.health\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('sentinel.aggregator'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
