"""The fabric_health signal: our table of the health mask, its NVML read against the fake library, verdicts."""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest

from sentinel.agent.nvml import NvmlSource
from sentinel.agent.nvml.recording import load
from sentinel.agent.nvml.replay import ReplayLibrary
from sentinel.aggregator.engine import Engine
from sentinel.components.fabric.health import CONDITIONS, conditions
from sentinel.components.fabric.record import FabricInfo
from sentinel.wire import Batch, GpuInfo, GpuSample, Hello
from tests.agent.fakenvml import FakeNvml

RECORDED = Path(__file__).parents[2] / "agent" / "data" / "nvsmi"


def test_our_table_matches_nvml_h() -> None:
    shifts = {reason: shift for shift, reason, *_ in CONDITIONS}
    assert shifts["fabric_degraded_bandwidth"] == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
    assert shifts["fabric_route_recovery"] == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY
    assert shifts["fabric_route_unhealthy"] == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
    assert (
        shifts["fabric_access_timeout_recovery"]
        == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY
    )
    assert pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE == 1


def _mask(**fields: int) -> int:
    shifts = {reason: shift for shift, reason, *_ in CONDITIONS}
    return sum(value << shifts[reason] for reason, value in fields.items())


@pytest.mark.parametrize(
    ("mask", "reasons"),
    [
        (0, []),  # nothing supported
        (_mask(fabric_degraded_bandwidth=2, fabric_route_unhealthy=2), []),  # supported and false
        (_mask(fabric_degraded_bandwidth=1), ["fabric_degraded_bandwidth"]),
        (_mask(fabric_route_unhealthy=1, fabric_route_recovery=2), ["fabric_route_unhealthy"]),
        (
            _mask(fabric_route_recovery=1, fabric_access_timeout_recovery=1),
            ["fabric_route_recovery", "fabric_access_timeout_recovery"],
        ),
    ],
)
def test_rule_table(mask: int, reasons: list[str]) -> None:
    assert [c[1] for c in conditions(mask)] == reasons


def test_nvml_read_of_the_mask_and_the_fallback_to_the_v1_call(fake_nvml: FakeNvml) -> None:
    completed = int(pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
    fake_nvml.gpus[0].fabric = (completed, 0, 7)
    fake_nvml.gpus[0].extra["fabric_health"] = _mask(fabric_route_unhealthy=1)
    fake_nvml.gpus[1].fabric = (completed, 0, 7)  # an older driver: no versioned call
    source = NvmlSource()
    source.open()
    info = source.read_slow(0, 1.0).fabric
    assert info is not None and info.health_mask == _mask(fabric_route_unhealthy=1)
    old = source.read_slow(1, 1.0).fabric
    assert old is not None and old.state == "completed" and old.health_mask is None
    source.close()


def test_a_gpu_without_a_fabric_answers_the_versioned_call_not_supported(fake_nvml: FakeNvml) -> None:
    source = NvmlSource()
    source.open()
    assert source.read_slow(0, 1.0).fabric is None
    assert {(0, "fabric"), (0, "fabric_v")} <= source.unsupported()  # what the device golden leaves out
    source.close()


def test_an_unhealthy_route_is_a_faulty_verdict_and_clears_with_the_mask() -> None:
    engine = Engine()
    host = engine.hello(Hello(host="h", gpus=[GpuInfo(index=0, uuid="GPU-0", pci_bus="0000:18:00")]), 0.0)
    bad = FabricInfo(state="completed", clique_id=3, health_mask=_mask(fabric_route_unhealthy=1))
    engine.ingest(host, Batch(seq=0, t=1.0, samples=[GpuSample(gpu=0, t=1.0, fabric=bad)]), 1.0)
    [verdict] = engine.book.open.values()
    assert (verdict.kind, verdict.reason, verdict.action) == ("faulty", "fabric_route_unhealthy", "reset_gpu")
    good = FabricInfo(state="completed", clique_id=3, health_mask=_mask(fabric_route_unhealthy=2))
    engine.ingest(host, Batch(seq=1, t=2.0, samples=[GpuSample(gpu=0, t=2.0, fabric=good)]), 2.0)
    assert not engine.book.open


def test_gb200_fabric_health_mask_through_the_versioned_call() -> None:
    library = ReplayLibrary(load(RECORDED / "healthy-gb200.xml"))
    with library.installed():
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        info = pynvml.c_nvmlGpuFabricInfo_v2_t()
        pynvml.nvmlDeviceGetGpuFabricInfoV(h, pynvml.byref(info))
        assert (info.state, info.status, info.cliqueId) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0, 32766)
        degraded = (info.healthMask >> pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW) & 0x3
        unhealthy = (info.healthMask >> pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY) & 0x3
        assert degraded == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
        assert unhealthy == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE
    library = ReplayLibrary(load(RECORDED / "fabric-in-progress.xml"))
    with library.installed():
        info = pynvml.c_nvmlGpuFabricInfo_v2_t()
        pynvml.nvmlDeviceGetGpuFabricInfoV(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.byref(info))
        assert info.state == pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
        assert (info.healthMask >> pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW) & 0x3 == 0
