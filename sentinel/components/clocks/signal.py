"""The clocks signal: clocks, clock-event (throttle) reasons, temperature, power and violation time. Read
and exported here; judged by the straggler detector (a slow GPU's reason), not as a fault by itself."""

from __future__ import annotations

from sentinel.components.clocks import metrics, nvml
from sentinel.components.signal import NvmlRead, Signal, SlowRead
from sentinel.wire import GpuSample


def _slow(read: SlowRead, sample: GpuSample) -> None:
    sample.violations = nvml.read_violations(read.get, read.gpu, read.handle)


SIGNAL = Signal[None](
    name="clocks",
    summary="clocks, clock-event (throttle) reasons, temperature, power: thermal and power stragglers",
    detector="straggler",
    nvml=NvmlRead(fast=nvml.fill, slow=_slow),
    render=metrics.render,
)
