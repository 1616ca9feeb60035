"""Every GPU of a host unregistered from the NVLink fabric past detect.fabric.not_completed_after_s is one
host verdict (fabric_not_completed, drain) with its GPUs' fabric verdicts folded in; before the grace, or with
one GPU alone, each GPU's own verdict stands. Engine on a virtual clock (the ``now`` passed in)."""

from __future__ import annotations

import msgspec

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.state import HostView
from sentinel.components.fabric.host import FabricRuleConfig, GpuFabric, judge_host_fabric
from sentinel.components.fabric.record import FabricManagerStatus, FabricState
from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import Batch, FabricInfo, GpuInfo, GpuSample, Hello

GPUS = 8
GRACE = 120.0


class Host:
    """An HGX host whose GPUs report their fabric registration (no NVLink domain)."""

    def __init__(self, engine: Engine, name: str = "h0", cluster: str = "") -> None:
        self.engine, self.name, self.seq, self.cluster = engine, name, 0, cluster
        gpus = [GpuInfo(index=i, uuid=f"GPU-{name}-{i}", pci_bus=f"0000:{i:02x}:00") for i in range(GPUS)]
        self.view: HostView = engine.hello(Hello(host=name, gpus=gpus), 0.0)
        self.report(0.0, "completed")

    def report(
        self,
        t: float,
        state: FabricState,
        gpus: range = range(GPUS),
        manager: FabricManagerStatus | None = None,
    ) -> None:
        samples = [
            GpuSample(gpu=i, t=t, fabric=FabricInfo(state=state, clique_id=1, cluster_uuid=self.cluster))
            for i in gpus
        ]
        self.engine.ingest(self.view, Batch(seq=self.seq, t=t, samples=samples, fabric_manager=manager), t)
        self.seq += 1
        self.engine.tick(t)


def _engine() -> Engine:
    return Engine(msgspec.convert({"detect": {"fabric": {"not_completed_after_s": GRACE}}}, AggregatorConfig))


def _open(engine: Engine) -> list[tuple[str, str | None, int | None]]:
    return sorted((v.reason, v.host, v.gpu) for v in engine.book.open.values() if v.detector == "hardware")


def test_all_gpus_unregistered_past_the_grace_are_one_host_verdict_then_it_closes() -> None:
    engine = _engine()
    host = Host(engine)
    down = FabricManagerStatus(present=True, running=False, state="failed/failed", since=5.0)
    host.report(10.0, "not_started", manager=down)
    # before the grace: each GPU's own verdict, as today
    assert _open(engine) == [("fabric_not_registered", "h0", i) for i in range(GPUS)]
    host.report(10.0 + GRACE - 1, "not_started")
    assert len(_open(engine)) == GPUS
    host.report(10.0 + GRACE, "not_started")
    assert _open(engine) == [("fabric_not_completed", "h0", None)]
    [verdict] = [v for v in engine.book.open.values() if v.detector == "hardware"]
    assert (verdict.kind, verdict.action) == ("faulty", "drain")
    assert "GPU 0 not_started" in verdict.evidence[0] and "GPU 7 not_started" in verdict.evidence[0]
    assert "nvidia-fabricmanager is failed/failed" in verdict.evidence[1]
    # one GPU registers: the host verdict closes, the others are their own verdicts again
    host.report(10.0 + GRACE + 5, "completed", gpus=range(1))
    assert _open(engine) == [("fabric_not_registered", "h0", i) for i in range(1, GPUS)]
    assert "fabric_not_completed" in {v.reason for v in engine.book.closed}
    host.report(10.0 + GRACE + 10, "completed")
    assert _open(engine) == []


def test_the_grace_runs_on_the_tick_without_new_fabric_readings() -> None:
    engine = _engine()
    host = Host(engine)
    host.report(10.0, "in_progress")
    # the agent keeps reporting (other fields): the fabric memory is unchanged, the tick re-judges
    engine.ingest(host.view, Batch(seq=host.seq, t=10.0 + GRACE, samples=[]), 10.0 + GRACE)
    engine.tick(10.0 + GRACE)
    assert _open(engine) == [("fabric_not_completed", "h0", None)]


def test_one_gpu_unregistered_while_its_peers_are_fine_stays_its_own_verdict() -> None:
    engine = _engine()
    host = Host(engine)
    host.report(10.0, "not_started", gpus=range(3, 4))
    host.report(10.0 + 10 * GRACE, "completed", gpus=range(3))
    assert _open(engine) == [("fabric_not_registered", "h0", 3)]


def test_the_rule_needs_every_reporting_gpu_and_the_grace() -> None:
    cfg = FabricRuleConfig(not_completed_after_s=GRACE)
    lost = [GpuFabric(gpu=i, info=FabricInfo(state="in_progress"), t=float(i)) for i in range(4)]
    unsupported = GpuFabric(gpu=9, info=FabricInfo(state="not_supported"), t=0.0)
    fine = GpuFabric(gpu=5, info=FabricInfo(state="completed"), t=0.0)
    failed = GpuFabric(gpu=6, info=FabricInfo(state="completed", status=3), t=0.0)
    judged = judge_host_fabric([*lost, unsupported, failed], None, cfg, 3.0 + GRACE)
    assert judged is not None
    finding, since = judged
    assert since == 3.0  # the last GPU's loss: from then on all of them were down
    assert "all 5 GPUs" in finding.evidence[0] and "GPU 6 completed (NVML error 3)" in finding.evidence[0]
    assert "not known" in finding.evidence[1]
    assert judge_host_fabric(lost, None, cfg, 3.0 + GRACE - 0.5) is None
    assert judge_host_fabric([*lost, fine], None, cfg, 1e6) is None
    assert judge_host_fabric([lost[0], unsupported], None, cfg, 1e6) is None  # one GPU: its own verdict


def test_hosts_of_a_domain_found_down_are_the_domain_verdict_not_host_verdicts() -> None:
    engine = _engine()
    cluster = "5d0f3c2a-8e4b-4f1a-9c6d-7b2e1a0f9e84"
    hosts = [Host(engine, f"n{i}", cluster) for i in range(3)]
    for i, host in enumerate(hosts):
        host.report(10.0 + i, "not_started")
    for host in hosts:
        host.report(20.0 + GRACE, "not_started")
    assert _open(engine) == [("fabric_domain_down", None, None)]
