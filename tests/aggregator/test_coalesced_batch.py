"""A coalesced batch (``stream.coalesce_ticks``: several ticks' samples in one batch, oldest first) leaves the
fleet's GPU views exactly as the same ticks sent one batch each."""

from __future__ import annotations

import pytest

from sentinel.aggregator.engine import Engine
from sentinel.components.gpu_view import GpuView
from sentinel.wire import Batch, EccCounters, GpuSample, RowRemap
from tests.aggregator.helpers import hello, sample

GPUS = 4


def _ticks(count: int) -> list[list[GpuSample]]:
    """``count - 1`` routine ticks (fast readings, every GPU ok, values moving), then the tick that sends
    them: a slow reading with ECC errors on GPU 0, GPU 1 lost, GPU 2 throttling."""
    ticks = [
        [
            sample(g, float(t), util_gpu_pct=90.0 + t + g, temp_c=60.0 + 2 * t, power_w=600.0 - 10 * t)
            for g in range(GPUS)
        ]
        for t in range(1, count)
    ]
    t = float(count)
    ticks.append(
        [
            sample(
                0,
                t,
                ecc=EccCounters(volatile_corrected=3, volatile_uncorrected=2, aggregate_uncorrected=2),
                remap=RowRemap(uncorrectable=1, pending=True),
            ),
            GpuSample(gpu=1, t=t, state="lost"),
            sample(2, t, sm_clock_mhz=1200.0, throttle=["hw_thermal_slowdown"], temp_c=92.0),
            sample(3, t, util_gpu_pct=12.0),
        ]
    )
    return ticks


def _views(engine: Engine) -> tuple[list[GpuView], list[int], list[bool]]:
    host = engine.fleet.hosts["h0"]
    dirty = sorted({gpu.index for gpu in engine.fleet.dirty_gpus})
    return host.gpus, dirty, [gpu.dirty for gpu in host.gpus]


@pytest.mark.parametrize("count", [2, 3, 10])
def test_a_coalesced_batch_leaves_the_gpu_views_of_its_ticks_sent_one_by_one(count: int) -> None:
    ticks = _ticks(count)
    one_by_one, coalesced = Engine(), Engine()
    host = one_by_one.fleet.hello(hello("h0", GPUS), 0.0)
    for seq, samples in enumerate(ticks):
        assert one_by_one.fleet.apply(host, Batch(seq=seq, t=samples[0].t, samples=samples), samples[0].t)
    host = coalesced.fleet.hello(hello("h0", GPUS), 0.0)
    batch = Batch(seq=0, t=float(count), samples=[s for tick in ticks for s in tick])
    assert coalesced.fleet.apply(host, batch, float(count))

    gpus, dirty, flags = _views(coalesced)
    assert _views(one_by_one) == (gpus, dirty, flags)
    assert gpus[1].state == "lost" and gpus[0].memory and 0 in dirty  # the last tick's facts are there
    assert gpus[3].ema_util is not None and gpus[3].ema_util > 12.0  # the EMAs went through every tick


def test_a_coalesced_batch_opens_the_same_verdicts() -> None:
    ticks = _ticks(3)
    one_by_one, coalesced = Engine(), Engine()
    host = one_by_one.hello(hello("h0", GPUS), 0.0)
    for seq, samples in enumerate(ticks):
        one_by_one.ingest(host, Batch(seq=seq, t=samples[0].t, samples=samples), samples[0].t)
    host = coalesced.hello(hello("h0", GPUS), 0.0)
    coalesced.ingest(host, Batch(seq=0, t=3.0, samples=[s for tick in ticks for s in tick]), 3.0)

    def opened(engine: Engine) -> list[tuple[str, int | None, str]]:
        return sorted((v.kind, v.gpu, v.reason) for v in engine.book.open.values())

    assert opened(coalesced) == opened(one_by_one) != []
