"""PCIe through NVML: replay counter and throughput."""

from __future__ import annotations

from typing import Any

import pynvml

from sentinel.components.nvml_read import Get
from sentinel.components.pcie.record import PcieLink
from sentinel.wire import GpuSample


def fill(get: Get, gpu: int, h: Any, sample: GpuSample) -> None:
    replay = get(gpu, "pcie_replay", pynvml.nvmlDeviceGetPcieReplayCounter, h)
    sample.pcie_replay = int(replay) if replay is not None else None
    tx = get(gpu, "pcie_tx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
    sample.pcie_tx_kbps = float(tx) if tx is not None else None
    rx = get(gpu, "pcie_rx", pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    sample.pcie_rx_kbps = float(rx) if rx is not None else None


def read_link(get: Get, gpu: int, h: Any) -> PcieLink | None:
    values = {
        "gen": get(gpu, "pcie_gen", pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "gen_max": get(gpu, "pcie_gen_max", pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "width": get(gpu, "pcie_width", pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
        "width_max": get(gpu, "pcie_width_max", pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
    }
    if all(v is None for v in values.values()):
        return None
    return PcieLink(**{k: int(v) for k, v in values.items() if v is not None})
