"""The real NVML code path (nvidia-ml-py marshalling included) against a fake NVML library."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sentinel.agent import Agent, GpuLostError
from sentinel.agent.nvml import NvmlSource
from sentinel.components.device.nvml import normalize_pci_bus
from tests.agent.conftest import make_config
from tests.agent.fakenvml import FakeNvml
from tests.support import sent


def test_inventory_and_fast_fields_through_pynvml(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[1].reasons = (
        pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwPowerCap
    )
    fake_nvml.gpus[1].pids = [4242, 17]
    source = NvmlSource()
    inventory = source.open()
    assert [g.index for g in inventory] == [0, 1]
    assert inventory[1].uuid == fake_nvml.gpus[1].uuid
    assert inventory[1].pci_bus == "0000:28:00"
    assert inventory[0].driver == "550.54.15"
    assert inventory[0].nvlinks == 2
    assert inventory[0].memory_total_bytes == 80 * 1024**3
    sample = source.read_fast(1, 100.0)
    assert sample.util_gpu_pct == 87 and sample.util_mem_pct == 41
    assert sample.power_w == pytest.approx(612.345) and sample.power_limit_w == pytest.approx(700.0)
    assert sample.sm_clock_mhz == 1980 and sample.mem_clock_mhz == 2619
    assert sorted(sample.throttle) == ["hw_thermal_slowdown", "sw_power_cap"]
    assert sample.pids == [17, 4242]
    assert sample.pcie_tx_kbps == 1200 and sample.pcie_rx_kbps == 3400
    source.close()


def test_slow_counters_ecc_remap_nvlink_recovery(fake_nvml: FakeNvml) -> None:
    gpu = fake_nvml.gpus[0]
    gpu.ecc = {
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 2,
        (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): 11,
    }
    gpu.ecc_location = {pynvml.NVML_MEMORY_LOCATION_DRAM: 5}
    gpu.remap = (3, 1, 1, 0)
    gpu.histogram = (600, 30, 5, 4, 1)
    gpu.nvlink_errors = {
        (1, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 77,
        (1, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 6,
    }
    gpu.nvlinks = {0: True, 1: False}
    gpu.recovery_action = 1
    gpu.retired_dbe = [0x1000, 0x2000]
    source = NvmlSource()
    source.open()
    sample = source.read_slow(0, 5.0)
    assert sample.ecc is not None
    assert sample.ecc.volatile_uncorrected == 2 and sample.ecc.aggregate_corrected == 11
    assert sample.ecc.dram_uncorrected == 5 and sample.ecc.sram_uncorrected is None
    assert sample.remap is not None
    assert (sample.remap.correctable, sample.remap.uncorrectable) == (3, 1)
    assert sample.remap.pending and not sample.remap.failure
    assert (sample.remap.hist_max, sample.remap.hist_low, sample.remap.hist_none) == (600, 4, 1)
    assert sample.nvlink is not None
    link1 = next(link for link in sample.nvlink if link.link == 1)
    assert not link1.active and link1.crc_errors == 77 and link1.replay_errors == 6
    assert sample.recovery_action == "gpu_reset"
    assert sample.retired is not None and sample.retired.double_bit == 2


def test_not_supported_is_remembered_per_gpu_and_field(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[0].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetRemappedRows"}
    source = NvmlSource()
    source.open()
    for t in range(5):
        fast = source.read_slow(0, float(t))
        assert fast.power_w is None and fast.remap is None
        other = source.read_slow(1, float(t))
        assert other.power_w is not None and other.remap is not None
    assert fake_nvml.calls[(0, "nvmlDeviceGetPowerUsage")] == 1
    assert fake_nvml.calls[(0, "nvmlDeviceGetRemappedRows")] == 1
    assert fake_nvml.calls[(1, "nvmlDeviceGetPowerUsage")] == 5
    assert (0, "power") in source.unsupported()


def test_gpu_is_lost_raises(fake_nvml: FakeNvml) -> None:
    source = NvmlSource()
    source.open()
    fake_nvml.gpus[1].lost = True
    with pytest.raises(GpuLostError):
        source.read_fast(1, 0.0)
    assert source.read_fast(0, 0.0).util_gpu_pct == 87


def test_pci_bus_normalisation() -> None:
    assert normalize_pci_bus("00000000:1B:00.0") == "0000:1b:00"
    assert normalize_pci_bus("0001:3b:00.0") == "0001:3b:00"


async def test_agent_marks_lost_gpu_and_reports_it(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    agent = Agent(make_config(tmp_path, collect={"nvml_events": False}), NvmlSource())
    first = sent(await agent.step(1.0))
    assert {s.state for s in first.samples} == {"ok"}
    fake_nvml.gpus[0].lost = True
    batch = sent(await agent.step(2.0))
    states = {s.gpu: s.state for s in batch.samples}
    assert states == {0: "lost", 1: "ok"}
    assert [(e.kind, getattr(e, "state", None), e.gpu) for e in batch.events] == [("gpu_state", "lost", 0)]
    families = {f.name: f for f in text_string_to_metric_families(agent.render_metrics().decode())}
    up = {s.labels["gpu"]: s.value for s in families["sentinel_gpu_up"].samples}
    assert up == {"0": 0.0, "1": 1.0}
    state = {(s.labels["gpu"], s.labels["state"]): s.value for s in families["sentinel_gpu_state"].samples}
    assert state[("0", "lost")] == 1.0 and state[("0", "ok")] == 0.0
    await agent.shutdown()


async def test_hung_call_marks_gpu_unresponsive_and_never_blocks_others(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    config = make_config(tmp_path, collect={"nvml_timeout_s": 1.5, "nvml_events": False})
    agent = Agent(config, NvmlSource())
    await agent.step(1.0)
    release = threading.Event()
    fake_nvml.gpus[1].hang = release
    started = time.monotonic()
    batch = sent(await agent.step(2.0))
    assert time.monotonic() - started < 5.0  # the deadline, not the hang, bounds the tick
    assert {s.gpu: s.state for s in batch.samples} == {0: "ok", 1: "unresponsive"}
    assert [(e.kind, getattr(e, "state", None), e.gpu) for e in batch.events] == [
        ("gpu_state", "unresponsive", 1)
    ]
    calls_while_hung = fake_nvml.calls.total()
    for t in range(3, 6):  # the loop and GPU 0 keep going; nothing is queued behind the hung call
        started = time.monotonic()
        batch = sent(await agent.step(float(t)))
        assert time.monotonic() - started < 1.0  # not waiting on the hung call, nor another 1.5 s deadline
        assert {s.gpu: s.state for s in batch.samples} == {0: "ok", 1: "unresponsive"}
    hung_gpu_calls = sum(n for (gpu, _), n in fake_nvml.calls.items() if gpu == 1)
    release.set()
    deadline = time.monotonic() + 5
    while (
        agent.gpu_collector is not None
        and agent.gpu_collector._workers[1].busy
        and time.monotonic() < deadline
    ):
        await asyncio.sleep(0.01)
    batch = sent(await agent.step(6.0))
    assert {s.gpu: s.state for s in batch.samples} == {0: "ok", 1: "ok"}
    assert [(e.kind, getattr(e, "state", None), e.gpu) for e in batch.events] == [("gpu_state", "ok", 1)]
    assert fake_nvml.calls.total() > calls_while_hung
    assert sum(n for (gpu, _), n in fake_nvml.calls.items() if gpu == 1) > hung_gpu_calls
    await agent.shutdown()


async def test_a_stop_request_ends_the_wait_for_the_next_tick(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    """With a minute between ticks, the agent still stops as soon as it is asked (SIGTERM)."""
    agent = Agent(make_config(tmp_path, collect={"tick_s": 60.0, "nvml_events": False}), NvmlSource())
    task = asyncio.create_task(agent.run())
    async with asyncio.timeout(10):
        while agent.counters.ticks < 1:
            await asyncio.sleep(0.01)
        agent.request_stop()
        await task
    assert agent.counters.ticks == 1
