"""The NVLink domain as a failure unit: GPUs of several hosts of one fabric cluster / clique losing their fabric
together are one domain verdict naming every host of the domain, not one verdict per GPU; one host alone, or
hosts far apart in time, are their GPUs' own verdicts. Engine on a virtual clock (the ``now`` passed in)."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import msgspec

from sentinel.aggregator.detectors.hardware import HardwareDetector
from sentinel.aggregator.detectors.inventory import InventoryDetector
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.state import HostView
from sentinel.aggregator.verdicts import MAX_HOSTS, Finding, Verdict, VerdictBook
from sentinel.components.fabric.domain import FabricDomainConfig, Loss, domain_down
from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import Batch, FabricInfo, GpuInfo, GpuSample, Hello
from tests.aggregator.helpers import agent, running_aggregator, sample

CLUSTER = "c7a4f1d2-5b3e-4c69-9e0d-2f8b61a4d5e3"
OTHER = "0b1c2d3e-4f50-4a61-8b72-9c8d7e6f5a4b"
GPUS = 4


def _engine(**domain: object) -> Engine:
    return Engine(msgspec.convert({"detect": {"fabric_domain": domain}}, AggregatorConfig))


class Rack:
    """Hosts of GB200 trays: each host's GPUs report the fabric of ``cluster`` / ``clique``."""

    def __init__(self, engine: Engine, hosts: list[str], cluster: str = CLUSTER, clique: int = 7) -> None:
        self.engine, self.cluster, self.clique = engine, cluster, clique
        self.views: dict[str, HostView] = {}
        self.seq: dict[str, int] = {}
        for name in hosts:
            gpus = [GpuInfo(index=i, uuid=f"GPU-{name}-{i}", pci_bus=f"0000:{i:02x}:00") for i in range(GPUS)]
            self.views[name] = engine.hello(Hello(host=name, gpus=gpus), 0.0)
            self.seq[name] = 0
            self.report(name, 0.0, "completed")

    def report(
        self, host: str, t: float, state: str, gpus: range = range(GPUS), mask: int | None = None
    ) -> None:
        info = FabricInfo(
            state=state,  # type: ignore[arg-type]
            cluster_uuid=self.cluster,
            clique_id=self.clique,
            health_mask=mask,
        )
        samples = [GpuSample(gpu=i, t=t, fabric=info) for i in gpus]
        seq = self.seq[host]
        self.seq[host] = seq + 1
        self.engine.ingest(self.views[host], Batch(seq=seq, t=t, samples=samples), t)


def _hardware(engine: Engine) -> list[Verdict]:
    """The open hardware verdicts (the hosts here send nothing between reports: host_silent is not asked)."""
    return [v for v in engine.book.open.values() if v.detector == "hardware"]


def _open(engine: Engine) -> list[tuple[str, str | None, int | None]]:
    return sorted((v.reason, v.host, v.gpu) for v in _hardware(engine))


def test_hosts_losing_the_fabric_together_are_one_domain_verdict_naming_every_host() -> None:
    engine = _engine(min_hosts=3, window_s=60.0)
    rack = Rack(engine, ["n1", "n2", "n3", "n4"])
    rack.report("n1", 10.0, "in_progress")
    rack.report("n2", 20.0, "in_progress")
    # below min_hosts: each GPU's loss is its own verdict
    assert {r for r, _, _ in _open(engine)} == {"fabric_not_registered"}
    assert len(_hardware(engine)) == 2 * GPUS
    rack.report("n3", 30.0, "not_started")
    engine.tick(31.0)
    [domain] = _hardware(engine)
    assert (domain.kind, domain.reason, domain.action) == ("faulty", "fabric_domain_down", "drain")
    assert domain.host is None and domain.gpu is None
    assert domain.hosts == ["n1", "n2", "n3", "n4"]  # n4 reported no loss: still a host of the domain
    assert domain.evidence_t == 10.0
    assert f"cluster {CLUSTER} clique 7" in domain.evidence[0] and "on 3 hosts" in domain.evidence[0]
    assert domain.to_dict()["hosts"] == ["n1", "n2", "n3", "n4"]
    # the fabric comes back on two hosts: what is left is one host's, its GPUs' own verdicts again
    rack.report("n1", 40.0, "completed")
    rack.report("n2", 41.0, "completed")
    assert {(r, h) for r, h, _ in _open(engine)} == {("fabric_not_registered", "n3")}
    assert "fabric_domain_down" in {v.reason for v in engine.book.closed}
    rack.report("n3", 42.0, "completed")
    engine.tick(43.0)
    assert _hardware(engine) == []


def test_one_host_alone_never_names_the_domain() -> None:
    engine = _engine(min_hosts=2, window_s=60.0)
    rack = Rack(engine, ["n1", "n2", "n3"])
    rack.report("n1", 10.0, "in_progress")
    engine.tick(100.0)
    assert {(r, h) for r, h, _ in _open(engine)} == {("fabric_not_registered", "n1")}
    assert all(not v.hosts for v in _hardware(engine))


def test_losses_far_apart_in_time_are_not_the_domain_losing_its_fabric() -> None:
    engine = _engine(min_hosts=2, window_s=30.0)
    rack = Rack(engine, ["n1", "n2"])
    rack.report("n1", 10.0, "in_progress")
    rack.report("n2", 100.0, "in_progress")
    engine.tick(101.0)
    assert {h for _, h, _ in _open(engine)} == {"n1", "n2"}
    assert "fabric_domain_down" not in {r for r, _, _ in _open(engine)}


def test_another_domain_does_not_count() -> None:
    engine = _engine(min_hosts=2, window_s=60.0)
    here = Rack(engine, ["n1"])
    there = Rack(engine, ["m1"], cluster=OTHER)
    here.report("n1", 10.0, "in_progress")
    there.report("m1", 11.0, "in_progress")
    engine.tick(12.0)
    assert {h for _, h, _ in _open(engine)} == {"n1", "m1"}
    assert all(v.reason == "fabric_not_registered" for v in _hardware(engine))


def test_degraded_bandwidth_across_hosts_is_the_domains_and_other_faults_stay_the_gpus() -> None:
    engine = _engine(min_hosts=2, window_s=60.0)
    rack = Rack(engine, ["n1", "n2"])
    degraded = 0b01  # the health mask's DEGRADED_BW field TRUE
    rack.report("n1", 5.0, "completed", mask=degraded)
    rack.report("n2", 6.0, "completed", mask=degraded)
    # and one GPU has a fault of its own
    host = rack.views["n2"]
    engine.ingest(host, Batch(seq=99, t=7.0, samples=[GpuSample(gpu=0, t=7.0, state="lost")]), 7.0)
    engine.tick(20.0)
    reasons = _open(engine)
    assert ("fabric_domain_down", None, None) in reasons
    assert [r for r in reasons if r[0].startswith("fabric_") and r[0] != "fabric_domain_down"] == []
    assert any(h == "n2" and g == 0 for _, h, g in reasons)  # the lost GPU keeps its own verdict


def test_the_domain_rule_on_its_own() -> None:
    cfg = FabricDomainConfig(min_hosts=3, window_s=10.0)
    spread = [
        Loss("a", 0, 0.0, "x"),
        Loss("b", 0, 8.0, "x"),
        Loss("c", 0, 12.0, "x"),
        Loss("d", 0, 13.0, "x"),
    ]
    down = domain_down((CLUSTER, 1), spread, {"a", "b", "c", "d", "e"}, cfg)
    assert down is not None  # b, c, d within 10 s (a is 13 s before d)
    assert [x.host for x in down.losses] == ["b", "c", "d"] and down.began == 8.0
    assert down.hosts == ("a", "b", "c", "d", "e")
    same_host = [Loss("a", i, float(i), "x") for i in range(8)]
    assert domain_down((CLUSTER, 1), same_host, {"a", "b", "c"}, cfg) is None
    assert domain_down((CLUSTER, 1), spread[:2], {"a", "b"}, cfg) is None


def test_the_inventory_knows_a_domains_expected_size() -> None:
    engine = _engine(expected_gpus=2 * GPUS, expected_hosts=2)
    Rack(engine, ["n1"])
    Rack(engine, ["m1", "m2"], cluster=OTHER)  # another domain, complete
    engine.tick(1.0)
    [short] = [v for v in engine.book.open.values() if v.detector == "inventory"]
    assert (short.kind, short.reason, short.action, short.host) == (
        "degraded",
        "fabric_domain_incomplete",
        "none",
        None,
    )
    assert short.key == ("inventory", "fabric_domain", CLUSTER, "7")
    assert f"{GPUS} of the {2 * GPUS} GPUs expected" in short.evidence[0]
    assert "1 of the 2 hosts expected" in short.evidence[0]
    # the missing host comes back: the domain is whole at the inventory's next run
    Rack(engine, ["n2"])
    engine.tick(1.0 + InventoryDetector.INTERVAL_S)
    assert [v for v in engine.book.open.values() if v.detector == "inventory"] == []


def test_no_expected_size_no_domain_inventory() -> None:
    engine = _engine()
    Rack(engine, ["n1"])
    engine.tick(1.0)
    assert [v for v in engine.book.open.values() if v.detector == "inventory"] == []


async def test_the_api_serves_one_domain_verdict_with_its_hosts(tmp_path: Path) -> None:
    """Real agents' streams (three hosts) to a real aggregator: GET /api/v1/verdicts names the domain's
    hosts once, no GPU verdict."""
    lost = FabricInfo(state="not_started", cluster_uuid=CLUSTER, clique_id=7)
    async with (
        running_aggregator(tmp_path) as running,
        agent(running, "h1", gpus=2) as a1,
        agent(running, "h2", gpus=2) as a2,
        agent(running, "h3", gpus=2) as a3,
    ):
        t = time.time()
        for conn in (a1, a2, a3):
            await conn.send(Batch(seq=0, t=t, samples=[sample(i, t, fabric=lost) for i in range(2)]))
            await conn.ack()
        async with aiohttp.ClientSession() as session:
            url = running.url + "/api/v1/verdicts?state=open"
            async with session.get(url) as response:
                assert response.status == 200
                verdicts = (await response.json())["verdicts"]
    hardware = [v for v in verdicts if v["reason"].startswith("fabric")]
    assert [(v["reason"], v["host"], v["gpu"], v["hosts"]) for v in hardware] == [
        ("fabric_domain_down", None, None, ["h1", "h2", "h3"])
    ]


def test_a_domain_verdicts_hosts_survive_the_state_store_and_stay_bounded() -> None:
    book = VerdictBook()
    hosts = tuple(f"n{i:04d}" for i in range(MAX_HOSTS + 5))
    finding = Finding(
        key=("fabric_domain", CLUSTER, "7"),
        detector="hardware",
        kind="faulty",
        reason="fabric_domain_down",
        action="drain",
        evidence=("lost",),
        evidence_t=1.0,
        hosts=hosts,
    )
    [opened] = book.reconcile("hardware", [finding], 2.0)
    assert opened.verdict.hosts == list(hosts[:MAX_HOSTS])
    again = VerdictBook()
    again.restore({k: v for k, v in book.snapshot(full=True).items() if v is not None}, 3.0)
    [restored] = again.open.values()
    assert restored.hosts == list(hosts[:MAX_HOSTS]) and restored.host is None


def test_a_forgotten_host_leaves_no_domain_memory() -> None:
    engine = _engine(min_hosts=2, window_s=60.0)
    rack = Rack(engine, ["n1", "n2"])
    rack.report("n1", 10.0, "in_progress")
    rack.report("n2", 11.0, "in_progress")
    assert [v.reason for v in _hardware(engine)] == ["fabric_domain_down"]
    hardware = engine.detectors["hardware"]
    assert isinstance(hardware, HardwareDetector)
    engine.forget_host("n2", 20.0)
    engine.tick(21.0)
    assert all(host == "n1" for (host, _gpu) in hardware.domain)
    assert {(r, h) for r, h, _ in _open(engine)} == {("fabric_not_registered", "n1")}
    engine.forget_host("n1", 22.0)
    engine.tick(23.0)
    assert hardware.domain == {} and hardware.members == {} and hardware.losses == {}
    assert hardware.down == set() and _hardware(engine) == []


def test_a_domain_whose_hosts_are_all_forgotten_closes() -> None:
    engine = _engine(min_hosts=2, window_s=60.0)
    rack = Rack(engine, ["n1", "n2"])
    rack.report("n1", 10.0, "in_progress")
    rack.report("n2", 11.0, "in_progress")
    assert [v.reason for v in _hardware(engine)] == ["fabric_domain_down"]
    engine.forget_host("n1", 20.0)
    engine.forget_host("n2", 20.0)
    engine.tick(21.0)
    assert _hardware(engine) == []
