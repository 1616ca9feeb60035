"""The hbm signal: its rule table, its NVML read against the fake library, and the verdict it reaches."""

from __future__ import annotations

import pytest

from sentinel.agent.nvml import NvmlSource
from sentinel.aggregator.engine import Engine
from sentinel.components.hbm.nvml import LIMIT
from sentinel.components.hbm.signal import HYSTERESIS_C, hot, remember
from sentinel.components.signal import reading
from sentinel.wire import Batch, GpuInfo, GpuSample, Hello
from tests.agent.fakenvml import FakeNvml


@pytest.mark.parametrize(
    ("temp", "limit", "was_hot", "expected"),
    [
        (90.0, 95.0, False, False),
        (95.0, 95.0, False, True),
        (99.0, 95.0, False, True),
        (95.0 - HYSTERESIS_C, 95.0, True, True),  # hot until the hysteresis below the line
        (95.0 - HYSTERESIS_C - 0.5, 95.0, True, False),
        (120.0, None, False, False),  # no limit from NVML: never guessed
    ],
)
def test_rule_table(temp: float, limit: float | None, was_hot: bool, expected: bool) -> None:
    assert hot(temp, limit, was_hot) is expected


def test_memory_keeps_the_limit_and_the_time_it_became_hot() -> None:
    first = remember(None, GpuSample(gpu=0, t=1.0, mem_temp_c=80.0, readings={LIMIT: 95.0}))
    assert first is not None and first[0].limit_c == 95.0 and not first[0].hot
    hot_now = remember(first[0], GpuSample(gpu=0, t=2.0, mem_temp_c=96.0))  # limit remembered
    assert hot_now is not None and hot_now[1] and hot_now[0].hot and hot_now[0].since == 2.0
    still = remember(hot_now[0], GpuSample(gpu=0, t=3.0, mem_temp_c=97.0))
    assert still is not None and not still[1] and still[0].since == 2.0
    assert remember(still[0], GpuSample(gpu=0, t=4.0)) is None  # a fast sample says nothing


def test_nvml_read_of_the_limit(fake_nvml: FakeNvml) -> None:
    fake_nvml.gpus[0].extra["mem_temp_max"] = 95
    source = NvmlSource()
    source.open()
    sample = source.read_slow(0, 1.0)
    assert (sample.mem_temp_c, reading(sample, LIMIT)) == (71.0, 95.0)
    other = source.read_slow(1, 1.0)
    assert reading(other, LIMIT) is None and (1, "mem_temp_max") in source.unsupported()
    source.close()


def test_hot_hbm_opens_a_degraded_verdict_and_cooling_closes_it() -> None:
    engine = Engine()
    host = engine.hello(Hello(host="h", gpus=[GpuInfo(index=0, uuid="GPU-0", pci_bus="0000:18:00")]), 0.0)
    engine.ingest(
        host,
        Batch(seq=0, t=1.0, samples=[GpuSample(gpu=0, t=1.0, mem_temp_c=80.0, readings={LIMIT: 95.0})]),
        1.0,
    )
    assert not engine.book.open
    engine.ingest(
        host,
        Batch(seq=1, t=2.0, samples=[GpuSample(gpu=0, t=2.0, mem_temp_c=97.0, readings={LIMIT: 95.0})]),
        2.0,
    )
    [verdict] = engine.book.open.values()
    assert (verdict.kind, verdict.reason, verdict.action) == ("degraded", "hbm_over_temperature", "drain")
    assert "97 C" in verdict.evidence[0] and "95 C" in verdict.evidence[0]
    engine.ingest(
        host,
        Batch(seq=2, t=3.0, samples=[GpuSample(gpu=0, t=3.0, mem_temp_c=85.0, readings={LIMIT: 95.0})]),
        3.0,
    )
    assert not engine.book.open
