"""PCIe: the replay counter, throughput and link width through NVML (against the fake NVML at the ABI), the
rule table (replays climbing, a mistrained link) and the component's metric families."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from sentinel.agent.nvml import NvmlSource
from sentinel.components.exposition import GpuRow, MetricsView, Writer
from sentinel.components.pcie import metrics as pcie_metrics
from sentinel.components.pcie.record import PcieLink
from sentinel.components.pcie.rule import evaluate_link, evaluate_replay_rate
from sentinel.wire import GpuInfo, GpuSample
from tests.agent.fakenvml import FakeNvml


def test_replays_throughput_and_link_read_through_nvml(fake_nvml: FakeNvml) -> None:
    gpu = fake_nvml.gpus[1]
    gpu.pcie_replay, gpu.pcie_tx_kb, gpu.pcie_rx_kb = 17, 2048, 512
    gpu.pcie_gen, gpu.pcie_width = (4, 5), (8, 16)
    source = NvmlSource()
    source.open()
    sample = source.read_slow(1, 5.0)
    assert (sample.pcie_replay, sample.pcie_tx_kbps, sample.pcie_rx_kbps) == (17, 2048.0, 512.0)
    assert sample.pcie_link == PcieLink(gen=4, gen_max=5, width=8, width_max=16)
    fast = source.read_fast(1, 6.0)
    assert fast.pcie_replay == 17 and fast.pcie_link is None  # the link is a slow reading


def test_not_supported_leaves_the_fields_empty(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[0].unsupported |= {
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetMaxPcieLinkWidth",
    }
    source = NvmlSource()
    source.open()
    sample = source.read_slow(0, 1.0)
    assert (sample.pcie_replay, sample.pcie_tx_kbps, sample.pcie_rx_kbps, sample.pcie_link) == (
        None,
        None,
        None,
        None,
    )
    other = source.read_slow(1, 1.0)  # the other GPU answers for itself
    assert other.pcie_replay == 3 and other.pcie_link == PcieLink(gen=5, gen_max=5, width=16, width_max=16)


def test_only_the_width_makes_a_link_degraded() -> None:
    assert evaluate_link(PcieLink(gen=5, gen_max=5, width=16, width_max=16)) is None
    assert evaluate_link(PcieLink(gen=1, gen_max=5, width=16, width_max=16)) is None  # idle: gen drops
    assert evaluate_link(PcieLink(width=8)) is None  # no maximum known: nothing to compare with
    found = evaluate_link(PcieLink(gen=4, gen_max=5, width=8, width_max=16))
    assert found is not None
    assert (found.state, found.severity, found.action, found.reason) == (
        "suspect",
        "warning",
        "drain",
        "pcie_link_degraded",
    )
    assert found.evidence == ("PCIe link trained at x8 of x16, gen 4 of 5",)


@pytest.mark.parametrize(
    ("rate", "threshold", "fires"),
    [(0.0, 1.0, False), (0.99, 1.0, False), (1.0, 1.0, True), (50.0, 1.0, True), (50.0, 0.0, False)],
)
def test_replay_rate_fires_at_the_threshold_and_never_when_off(
    rate: float, threshold: float, fires: bool
) -> None:
    found = evaluate_replay_rate(rate, threshold)
    assert (found is not None) == fires
    if found is not None:
        assert (found.reason, found.action) == ("pcie_replays", "drain")
        assert found.evidence == (f"PCIe replays at {rate:.1f}/s (threshold {threshold:g}/s)",)


@given(
    width=st.integers(min_value=0, max_value=32),
    width_max=st.integers(min_value=0, max_value=32),
)
def test_a_link_is_degraded_exactly_when_it_runs_narrower_than_it_can(width: int, width_max: int) -> None:
    found = evaluate_link(PcieLink(width=width, width_max=width_max))
    assert (found is not None) == (0 < width < width_max)


def _families(sample: GpuSample) -> dict[str, list[tuple[dict[str, str], float]]]:
    view = MetricsView(
        rows=[
            GpuRow(
                index=0,
                labels='gpu="0"',
                info=GpuInfo(index=0, uuid="GPU-0", pci_bus="0000:18:00", name="NVIDIA H100"),
                state="ok",
                fast=sample,
                slow=sample,
            )
        ]
    )
    out = Writer()
    pcie_metrics.render(out, view)
    return {
        f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(out.text())
    }


def test_metrics_in_bytes_per_second_and_the_link_against_its_maximum() -> None:
    sample = GpuSample(
        gpu=0,
        t=1.0,
        pcie_replay=9,
        pcie_tx_kbps=2.0,
        pcie_rx_kbps=0.5,
        pcie_link=PcieLink(gen=4, gen_max=5, width=8, width_max=16),
    )
    families = _families(sample)
    assert families["sentinel_gpu_pcie_tx_bytes_per_second"] == [({"gpu": "0"}, 2048.0)]
    assert families["sentinel_gpu_pcie_rx_bytes_per_second"] == [({"gpu": "0"}, 512.0)]
    assert families["sentinel_gpu_pcie_replay"] == [({"gpu": "0"}, 9.0)]  # the parser strips _total
    assert families["sentinel_gpu_pcie_link_width"] == [({"gpu": "0"}, 8.0)]
    assert families["sentinel_gpu_pcie_link_width_max"] == [({"gpu": "0"}, 16.0)]
    assert families["sentinel_gpu_pcie_link_generation"] == [({"gpu": "0"}, 4.0)]
    assert families["sentinel_gpu_pcie_link_generation_max"] == [({"gpu": "0"}, 5.0)]


def test_metrics_leave_out_what_nvml_did_not_answer() -> None:
    families = _families(GpuSample(gpu=0, t=1.0, pcie_link=PcieLink(width=16)))
    assert families.get("sentinel_gpu_pcie_replay", []) == []
    assert families.get("sentinel_gpu_pcie_tx_bytes_per_second", []) == []
    assert families["sentinel_gpu_pcie_link_width"] == [({"gpu": "0"}, 16.0)]
    assert families.get("sentinel_gpu_pcie_link_width_max", []) == []
