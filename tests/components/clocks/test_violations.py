"""Clock-event violation time: NVML's cumulative ns per policy → the share of an interval spent throttled."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from sentinel.agent.nvml import NvmlSource
from sentinel.components.clocks import metrics as clocks_metrics
from sentinel.components.clocks.record import ClockViolations
from sentinel.components.clocks.rule import describe, violation_shares
from sentinel.components.exposition import GpuRow, MetricsView, Writer
from tests.agent.fakenvml import FakeNvml

POWER, THERMAL, SYNC_BOOST = 0, 1, 2


def test_violation_time_through_nvml_and_its_share_of_the_interval(fake_nvml: FakeNvml) -> None:
    gpu = fake_nvml.gpus[0]
    gpu.violations = {POWER: 5_000_000_000, THERMAL: 0, SYNC_BOOST: 0}  # the others NOT_SUPPORTED
    fake_nvml.now_us = 1_000_000_000
    source = NvmlSource()
    source.open()
    first = source.read_slow(0, 1.0).violations
    assert first == ClockViolations(reference_us=1_000_000_000, power=5_000_000_000, thermal=0, sync_boost=0)
    fake_nvml.now_us += 10_000_000  # 10 s later: 6 s of it at the power limit, 1 s thermal
    gpu.violations[POWER] += 6_000_000_000
    gpu.violations[THERMAL] += 1_000_000_000
    second = source.read_slow(0, 11.0).violations
    assert second is not None
    shares = violation_shares(first, second)
    assert shares == pytest.approx({"power": 0.6, "thermal": 0.1, "sync_boost": 0.0})
    assert (
        describe(shares, 10.0)
        == "clocks held back by power 60%, thermal 10% of the last 10 s (NVML violation time)"
    )
    # a policy NOT_SUPPORTED is asked once per GPU, then remembered
    assert fake_nvml.calls[(0, "nvmlDeviceGetViolationStatus")] == 8 + 3
    assert (0, "violation_board_limit") in source.unsupported()
    # and exported as a counter in seconds
    view = MetricsView(
        rows=[
            GpuRow(
                index=0,
                labels='gpu="0"',
                info=source.open()[0],
                state="ok",
                fast=source.read_fast(0, 11.0),
                slow=source.read_slow(0, 11.0),
            )
        ]
    )
    out = Writer()
    clocks_metrics.render(out, view)
    family = {f.name: f for f in text_string_to_metric_families(out.text())}[
        "sentinel_gpu_clock_violation_seconds"
    ]
    values = {s.labels["policy"]: s.value for s in family.samples}
    assert values == {"power": 11.0, "thermal": 1.0, "sync_boost": 0.0}


def test_a_counter_that_went_backwards_or_a_stalled_clock_says_nothing() -> None:
    before = ClockViolations(reference_us=100, power=9_000, thermal=10)
    assert violation_shares(before, ClockViolations(reference_us=100, power=9_500)) == {}
    reset = violation_shares(before, ClockViolations(reference_us=200, power=10, thermal=50))
    assert reset == {"thermal": pytest.approx(40 / 100_000)}


@given(
    st.integers(0, 2**63),
    st.integers(0, 2**63),
    st.integers(0, 2**63),
    st.integers(0, 2**63),
)
def test_shares_are_always_within_0_and_1(ref_a: int, ref_b: int, ns_a: int, ns_b: int) -> None:
    shares = violation_shares(
        ClockViolations(reference_us=ref_a, power=ns_a), ClockViolations(reference_us=ref_b, power=ns_b)
    )
    assert all(0.0 <= v <= 1.0 for v in shares.values())
