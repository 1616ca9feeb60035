"""Host inventory verdicts through the engine: NVML unusable, GPUs missing, a VBIOS unlike its peers'."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.aggregator.engine import Engine
from sentinel.components.device.inventory import GpuIdentity, firmware_outliers, host_majority
from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import Batch, GpuInfo, GpuSample, GpuSourceHealth, Hello, PcieLink


def _hello(name: str, vbios: str = "96.00.99.00.01", gpus: int = 4, **kw: object) -> Hello:
    infos = [
        GpuInfo(
            index=i,
            uuid=f"GPU-{name}-{i}",
            pci_bus=f"0000:{i:02x}:00",
            name="H100",
            driver="550.54",
            vbios=vbios,
        )
        for i in range(gpus)
    ]
    return Hello(host=name, gpus=infos, **kw)  # type: ignore[arg-type]


def test_nvml_unusable_and_missing_gpus_are_host_verdicts_that_close_when_fixed() -> None:
    engine = Engine()
    host = engine.hello(_hello("h1"), 0.0)
    engine.ingest(
        host, Batch(seq=0, t=1.0, gpu_source=GpuSourceHealth(ok=False, error="Driver Not Loaded")), 1.0
    )
    engine.tick(1.0)
    [verdict] = [v for v in engine.book.open.values() if v.detector == "inventory"]
    assert (verdict.kind, verdict.reason, verdict.host, verdict.gpu) == (
        "faulty",
        "nvml_unusable",
        "h1",
        None,
    )
    assert "Driver Not Loaded" in verdict.evidence[0]
    engine.ingest(host, Batch(seq=1, t=20.0, gpu_source=GpuSourceHealth(expected=8, found=7)), 20.0)
    engine.tick(20.0)
    [verdict] = [v for v in engine.book.open.values() if v.detector == "inventory"]
    assert verdict.reason in ("nvml_unusable", "gpus_missing")  # one host verdict, escalated or updated
    assert "7 of the 8" in " ".join(verdict.evidence)
    engine.ingest(host, Batch(seq=2, t=40.0, gpu_source=GpuSourceHealth(expected=8, found=8)), 40.0)
    engine.tick(40.0)
    assert not [v for v in engine.book.open.values() if v.detector == "inventory"]


def test_one_gpu_with_a_different_vbios_is_degraded_naming_what_differs() -> None:
    engine = Engine()
    for name in ("h1", "h2"):
        engine.hello(_hello(name), 0.0)
    odd = _hello("h3")
    odd.gpus[2] = GpuInfo(
        index=2, uuid="GPU-odd", pci_bus="0000:02:00", name="H100", driver="550.54", vbios="96.00.74.00.01"
    )
    engine.hello(odd, 0.0)
    engine.tick(1.0)
    [verdict] = [v for v in engine.book.open.values() if v.detector == "inventory"]
    assert (verdict.kind, verdict.reason, verdict.host, verdict.gpu) == (
        "degraded",
        "firmware_mismatch",
        "h3",
        2,
    )
    assert verdict.evidence == [
        "vbios 96.00.74.00.01 differs from 96.00.99.00.01, the version of 3 of 3 H100 hosts (one vote per host)"
    ]
    assert verdict.learned_from == 2  # h1 and h2: the odd GPU's own host is not its backing


def test_no_majority_no_outlier() -> None:
    gpus = [GpuIdentity("h", i, "A100", "535", "v1" if i % 2 else "v2") for i in range(4)]
    assert firmware_outliers(gpus) == {}
    assert firmware_outliers(gpus[:2]) == {}
    split = [GpuIdentity(f"h{i}", 0, "A100", "535", "v1" if i % 2 else "v2") for i in range(4)]
    assert firmware_outliers(split) == {}  # two hosts against two: no majority of hosts


def test_one_gpu_with_a_different_driver_is_degraded_too() -> None:
    engine = Engine()
    for name in ("h1", "h2", "h3"):
        hello = _hello(name)
        if name == "h2":
            hello.gpus[0] = GpuInfo(
                index=0, uuid="GPU-h2-0", pci_bus="0000:00:00", name="H100", driver="535.1"
            )
        engine.hello(hello, 0.0)
    engine.tick(1.0)
    [verdict] = [v for v in engine.book.open.values() if v.detector == "inventory"]
    assert (verdict.reason, verdict.host, verdict.gpu) == ("firmware_mismatch", "h2", 0)
    assert "driver 535.1 differs from 550.54" in verdict.evidence[0]


# -- inventory vs expected ------------------------------------------------------------------------------


def _link(engine: Engine, name: str, t: float, widths: dict[int, tuple[int, int]], gpus: int = 4) -> None:
    """A slow tick of host ``name``: each GPU's PCIe link (width_max, gen_max), gen now 1 (idle)."""
    host = engine.fleet.hosts[name]
    samples = [
        GpuSample(
            gpu=i,
            t=t,
            pcie_link=PcieLink(
                gen=1, gen_max=widths.get(i, (16, 5))[1], width=16, width_max=widths.get(i, (16, 5))[0]
            ),
        )
        for i in range(gpus)
    ]
    engine.ingest(host, Batch(seq=int(t), t=t, samples=samples), t)


def _inventory_verdicts(engine: Engine) -> list[tuple[str, str | None, int | None, list[str]]]:
    return sorted(
        (v.reason, v.host, v.gpu, list(v.evidence))
        for v in engine.book.open.values()
        if v.detector == "inventory" and v.reason == "inventory_mismatch"
    )


def test_a_gpu_in_an_x8_slot_and_a_host_short_of_gpus_are_named_against_the_fleet_majority() -> None:
    engine = Engine()
    for name in ("h1", "h2", "h3", "h4"):
        engine.hello(_hello(name, gpus=3 if name == "h4" else 4), 0.0)
    for name in ("h1", "h2", "h3"):
        _link(engine, name, 1.0, {2: (8, 5)} if name == "h3" else {})
    _link(engine, "h4", 1.0, {}, gpus=3)
    engine.tick(1.0)
    found = _inventory_verdicts(engine)
    assert [(r, h, g) for r, h, g, _ in found] == [
        ("inventory_mismatch", "h3", 2),
        ("inventory_mismatch", "h4", None),
    ]
    assert found[0][3] == [
        "GPU 2 PCIe link capable of x8, expected x16 (the majority of 4 identical H100 hosts: 4 of 4 hosts, "
        "one vote per host)"
    ]
    assert found[1][3] == [
        "3 GPUs, expected 4 (the majority of 4 identical H100 hosts: 3 of 4 hosts, one vote per host)"
    ]
    # the current generation (1: idle) is never compared; a reseated riser closes the verdict
    _link(engine, "h3", 20.0, {})
    engine.tick(20.0)
    assert [h for _, h, _, _ in _inventory_verdicts(engine)] == ["h4"]


def test_configured_expectations_per_host_glob_win_over_the_fleet() -> None:
    config = msgspec.convert(
        {
            "detect": {
                "inventory": {
                    "expected": [
                        {"hosts": "gpu-a*", "gpus": 4, "model": "H100", "pcie_gen": 5},
                        {"hosts": "gpu-b*", "pcie_width": 16},
                    ],
                    "learn": False,
                }
            }
        },
        AggregatorConfig,
    )
    engine = Engine(config)
    odd = _hello("gpu-a1")
    odd.gpus[1] = GpuInfo(
        index=1, uuid="GPU-x", pci_bus="0000:01:00", name="A100", driver="550.54", vbios="96.00.99.00.01"
    )
    engine.hello(odd, 0.0)
    engine.hello(_hello("gpu-b1", gpus=2), 0.0)
    _link(engine, "gpu-a1", 1.0, {3: (16, 4)})
    _link(engine, "gpu-b1", 1.0, {0: (4, 5)}, gpus=2)
    engine.tick(1.0)
    found = {h: e for _, h, _, e in _inventory_verdicts(engine)}
    assert found["gpu-a1"] == [
        "GPU 1 is A100, expected H100 (configured for gpu-a*)",
        "GPU 3 PCIe link capable of gen 4, expected gen 5 (configured for gpu-a*)",
    ]
    assert found["gpu-b1"] == ["GPU 0 PCIe link capable of x4, expected x16 (configured for gpu-b*)"]


def test_without_configuration_nothing_is_learned_from_too_few_hosts() -> None:
    engine = Engine()
    engine.hello(_hello("h1"), 0.0)
    engine.hello(_hello("h2", gpus=2), 0.0)
    _link(engine, "h1", 1.0, {0: (8, 5)})
    engine.tick(1.0)
    assert _inventory_verdicts(engine) == []


@settings(max_examples=200, deadline=None)
@given(
    honest=st.lists(st.integers(1, 16), min_size=2, max_size=12),
    liar_gpus=st.integers(1, 1024),
    min_hosts=st.integers(2, 4),
)
def test_a_host_is_one_vote_however_many_gpus_it_claims(
    honest: list[int], liar_gpus: int, min_hosts: int
) -> None:
    votes = {f"h{i}": ["550"] * n for i, n in enumerate(honest)} | {"liar": ["535"] * liar_gpus}
    found = host_majority(votes, min_hosts)
    if len(votes) < min_hosts:
        assert found is None
        return
    assert found is not None and found.value == "550" and found.hosts == len(votes)
    assert found.holders == frozenset(votes) - {"liar"}
    assert found.backing("liar") == len(honest) and found.backing("h0") == len(honest) - 1


def test_a_host_split_between_two_values_gives_each_half_a_vote() -> None:
    votes = {"a": ["x"], "b": ["y"], "c": ["x", "y"]}  # x: 1.5 of 3 hosts, no strict majority
    assert host_majority(votes, 3) is None
    votes["d"] = ["x", "x", "x", "y"]  # x: 2.25 of 4
    found = host_majority(votes, 3)
    assert found is not None and found.value == "x" and found.holders == {"a", "d"}


def test_the_64_gpu_liar_moves_no_learned_expectation_of_the_honest_hosts() -> None:
    """Five honest 8-GPU hosts and one that claims 64 GPUs in x8 slots at gen 4, another driver: every
    expectation stays the honest hosts', and only the liar differs from it."""
    engine = Engine()
    for name in ("h1", "h2", "h3", "h4", "h5"):
        engine.hello(_hello(name, gpus=8), 0.0)
        _link(engine, name, 1.0, {}, gpus=8)
    liar = _hello("liar", gpus=64)
    liar.gpus = [msgspec.structs.replace(g, driver="535.1") for g in liar.gpus]
    engine.hello(liar, 0.0)
    _link(engine, "liar", 1.0, dict.fromkeys(range(64), (8, 4)), gpus=64)
    engine.tick(1.0)
    hosts = {v.host for v in engine.book.open.values()}
    assert hosts == {"liar"}
    [mismatch] = [v for v in engine.book.open.values() if v.reason == "inventory_mismatch"]
    assert mismatch.learned_from == 5 and mismatch.evidence[0].startswith("64 GPUs, expected 8")
