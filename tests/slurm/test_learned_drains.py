"""One agent must not drain other hosts through what the fleet teaches: the attack on a real Slurm.

Five honest 8-GPU hosts and one liar whose token is valid only for itself: it says hello with 64 GPUs of the
fleet's model, another driver, x8 PCIe links and SM clocks far above everyone's. Every fleet-learned
yardstick (the driver majority, the PCIe expectation, the clock median) counts it once, so the honest hosts
stay the majority; the policy drains what a quorum of other hosts backs and refuses the rest.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.pushback import VerdictPush
from sentinel.aggregator.remediation import Remediator
from sentinel.config.aggregator import AggregatorConfig, BreakerConfig, RemediationConfig
from sentinel.wire import Batch, GpuInfo, GpuSample, Hello, PcieLink, VerdictsRequest
from tests.slurm.cluster import SlurmCluster, available, slurm_cluster
from tests.support import need

pytestmark = pytest.mark.timeout(180)
HONEST = ("sn1", "sn2", "sn3", "sn4", "sn5")
LIAR = "sn6"
MODEL = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def fleet_slurm() -> Iterator[SlurmCluster]:
    need(available(), "slurm-wlm and munge not installed (munged, slurmctld, slurmd, scontrol, srun)")
    with (
        tempfile.TemporaryDirectory(prefix="sslurm-", dir="/tmp") as root,
        slurm_cluster(Path(root), (*HONEST, LIAR)) as cluster,
    ):
        yield cluster


def hello(host: str, gpus: int, driver: str) -> Hello:
    return Hello(
        host=host,
        boot_id=f"boot-{host}",
        gpus=[
            GpuInfo(index=i, uuid=f"GPU-{host}-{i}", pci_bus=f"0000:{i:02x}:00", name=MODEL, driver=driver)
            for i in range(gpus)
        ],
    )


def busy(
    gpus: int, t: float, clock: float, width_max: int, odd: dict[int, int] | None = None
) -> list[GpuSample]:
    """One second of busy GPUs: SM clock ``clock``, PCIe links capable of ``width_max`` (``odd``: GPU →
    another width)."""
    return [
        GpuSample(
            gpu=i,
            t=t,
            util_gpu_pct=99.0,
            temp_c=65.0,
            power_w=640.0,
            sm_clock_mhz=clock,
            sm_clock_max_mhz=max(clock, 1980.0),
            pcie_link=PcieLink(gen=5, gen_max=5, width=16, width_max=(odd or {}).get(i, width_max)),
        )
        for i in range(gpus)
    ]


def remediator(slurm: SlurmCluster, tmp_path: Path, engine: Engine) -> Remediator:
    """Acting (no dry run), the default policy, a breaker that would let every node go: only the rules
    about learned yardsticks stand between the liar and the honest hosts."""
    config = RemediationConfig(
        enabled=True,
        dry_run=False,
        breaker=BreakerConfig(max_drains=100, max_fraction=1.0, max_unavailable_fraction=1.0),
        command_timeout_s=10.0,
    )
    r = Remediator(config, engine.book, state_dir=tmp_path, registry=CollectorRegistry(), env=slurm.env())
    engine.listeners.append(r.on_change)
    return r


def drained(slurm: SlurmCluster) -> set[str]:
    return {node for node in (*HONEST, LIAR) if "DRAIN" in slurm.node_state(node)[0]}


def resume_all(slurm: SlurmCluster) -> None:
    for node in slurm.nodes:
        if "DRAIN" in slurm.node_state(node)[0]:
            slurm.run("scontrol", "update", f"nodename={node}", "state=resume")
    slurm.wait_idle(15.0)


async def test_a_64_gpu_liar_drains_no_honest_host(fleet_slurm: SlurmCluster, tmp_path: Path) -> None:
    resume_all(fleet_slurm)
    engine = Engine()
    r = remediator(fleet_slurm, tmp_path, engine)
    await r.start()
    try:
        hosts = {name: engine.hello(hello(name, 8, "550.54.15"), 0.0) for name in HONEST}
        hosts[LIAR] = engine.hello(hello(LIAR, 64, "535.161.08"), 0.0)
        for second in range(60):
            t = float(second)
            for name, host in hosts.items():
                samples = busy(64, t, 2600.0, 8) if name == LIAR else busy(8, t, 1980.0, 16)
                engine.ingest(host, Batch(seq=second, t=t, samples=samples), t)
            engine.tick(t)
        await asyncio.wait_for(r.idle.wait(), 60)
    finally:
        await r.stop()
    on_honest = [(v.host, v.kind, v.reason) for v in engine.book.open.values() if v.host in HONEST]
    assert on_honest == []  # not degraded, not a straggler: the liar is one vote of six
    assert drained(fleet_slurm) == {LIAR}  # its own claims, held against five other hosts, are its own
    liar = {v.reason: v for v in engine.book.open.values() if v.host == LIAR}
    assert {"firmware_mismatch", "inventory_mismatch"} <= set(liar)
    assert liar["firmware_mismatch"].learned_from == len(HONEST)
    assert any("64 GPUs, expected 8" in e for e in liar["inventory_mismatch"].evidence)


async def test_a_learned_verdict_without_a_quorum_is_not_acted_on_a_configured_one_is(
    fleet_slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Three hosts: one GPU of sn3 in an x8 slot. The x16 expectation learned from the fleet rests on two
    other hosts (below the quorum of 3): the verdict is shown, never drained and never pushed to the host's
    health check. Configured (``pcie_width = 16``), the same difference drains."""
    resume_all(fleet_slurm)
    for configured in (False, True):
        inventory: dict[str, object] = (
            {"expected": [{"hosts": "sn*", "pcie_width": 16}]} if configured else {}
        )
        engine = Engine(msgspec.convert({"detect": {"inventory": inventory}}, AggregatorConfig))
        r = remediator(fleet_slurm, tmp_path / str(configured), engine)
        await r.start()
        try:
            hosts = {name: engine.hello(hello(name, 8, "550.54.15"), 0.0) for name in HONEST[:3]}
            for name, host in hosts.items():
                odd = {5: 8} if name == "sn3" else None
                engine.ingest(host, Batch(seq=0, t=1.0, samples=busy(8, 1.0, 1980.0, 16, odd)), 1.0)
            engine.tick(1.0)
            await asyncio.wait_for(r.idle.wait(), 60)
        finally:
            await r.stop()
        [verdict] = [v for v in engine.book.open.values() if v.reason == "inventory_mismatch"]
        assert (verdict.host, verdict.gpu) == ("sn3", 5)
        records = [(rec["outcome"], rec["reason"]) for rec in r.audit.read()]
        if configured:
            assert verdict.learned_from is None
            assert records == [("done", "")] and drained(fleet_slurm) == {"sn3"}
        else:
            assert verdict.learned_from == 2
            assert records == [("refused", "learned_without_quorum")] and drained(fleet_slurm) == set()
    resume_all(fleet_slurm)


def test_the_health_check_is_not_told_of_a_learned_verdict_without_a_quorum() -> None:
    engine = Engine()
    hosts = {name: engine.hello(hello(name, 8, "550.54.15"), 0.0) for name in HONEST[:3]}
    for name, host in hosts.items():
        odd = {5: 8} if name == "sn3" else None
        engine.ingest(host, Batch(seq=0, t=1.0, samples=busy(8, 1.0, 1980.0, 16, odd)), 1.0)
    engine.tick(1.0)
    assert [v.host for v in engine.book.open.values()] == ["sn3"]
    quorum = [3]
    push = VerdictPush(engine.book, learned_quorum=lambda: quorum[0])
    for quorum[0], pushed in ((3, 0), (2, 1)):  # backed by sn1 and sn2: pushed once the quorum is 2
        request = push.command_for("sn3").request
        assert isinstance(request, VerdictsRequest) and len(request.verdicts) == pushed
