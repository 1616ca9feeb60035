"""The Hopper/Blackwell fields through the fake NVML, their metrics, and the verdicts they reach."""

from __future__ import annotations

import pynvml

from sentinel.agent.nvml import NvmlSource
from sentinel.aggregator.engine import Engine
from sentinel.components.fabric.record import FabricInfo
from sentinel.components.pcie.record import PcieLink
from sentinel.wire import Batch, GpuInfo, GpuSample, Hello
from tests.agent.fakenvml import FakeNvml


def test_fabric_pcie_link_hbm_temp_and_recovery_action_are_read(fake_nvml: FakeNvml) -> None:
    gpu = fake_nvml.gpus[1]
    gpu.fabric = (int(pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS), 0, 7)
    gpu.pcie_width = (8, 16)
    gpu.recovery_action = 2  # node_reboot
    source = NvmlSource()
    source.open()
    sample = source.read_slow(1, 1.0)
    assert sample.fabric is not None and (sample.fabric.state, sample.fabric.clique_id) == ("in_progress", 7)
    assert sample.pcie_link == PcieLink(gen=5, gen_max=5, width=8, width_max=16)
    assert sample.mem_temp_c == 71.0 and sample.recovery_action == "node_reboot"
    healthy = source.read_slow(0, 1.0)
    assert healthy.fabric is None  # no NVSwitch: NOT_SUPPORTED, remembered
    assert (0, "fabric") in source.unsupported()
    source.close()


def _engine_with(sample: GpuSample) -> Engine:
    engine = Engine()
    host = engine.hello(Hello(host="h", gpus=[GpuInfo(index=0, uuid="GPU-0", pci_bus="0000:18:00")]), 0.0)
    engine.ingest(host, Batch(seq=0, t=1.0, samples=[sample]), 1.0)
    return engine


def test_the_fields_reach_verdicts() -> None:
    cases = [
        (
            GpuSample(gpu=0, t=1.0, recovery_action="node_reboot"),
            ("faulty", "driver_recovery_action", "reboot"),
        ),
        (
            GpuSample(gpu=0, t=1.0, recovery_action="drain_p2p"),
            ("degraded", "driver_recovery_action", "drain"),
        ),
        (
            GpuSample(gpu=0, t=1.0, pcie_link=PcieLink(width=8, width_max=16)),
            ("degraded", "pcie_link_degraded", "drain"),
        ),
        (
            GpuSample(gpu=0, t=1.0, fabric=FabricInfo(state="in_progress", clique_id=3)),
            ("faulty", "fabric_not_registered", "reset_gpu"),
        ),
    ]
    for sample, expected in cases:
        [verdict] = _engine_with(sample).book.open.values()
        assert (verdict.kind, verdict.reason, verdict.action) == expected
    for quiet in (
        GpuSample(gpu=0, t=1.0, recovery_action="none"),
        GpuSample(
            gpu=0, t=1.0, pcie_link=PcieLink(gen=1, gen_max=5, width=16, width_max=16)
        ),  # idle downshift
        GpuSample(gpu=0, t=1.0, fabric=FabricInfo(state="completed", clique_id=3)),
    ):
        assert not _engine_with(quiet).book.open
