"""Host inventory verdicts through the engine: NVML unusable, GPUs missing, a VBIOS unlike its peers'."""

from __future__ import annotations

from sentinel.aggregator.engine import Engine
from sentinel.components.device.inventory import GpuIdentity, firmware_outliers
from sentinel.wire import Batch, GpuInfo, GpuSourceHealth, Hello


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
    assert verdict.evidence == ["vbios 96.00.74.00.01 differs from 96.00.99.00.01 on 11 of 12 H100 GPUs"]


def test_no_majority_no_outlier() -> None:
    gpus = [GpuIdentity("h", i, "A100", "535", "v1" if i % 2 else "v2") for i in range(4)]
    assert firmware_outliers(gpus) == {}
    assert firmware_outliers(gpus[:2]) == {}
