"""The nccl_debug signal: a job's async-debug readiness from its ranks' environment (read with the process
table by the jobs collector), shown with the stuck detector's verdicts."""

from __future__ import annotations

from sentinel.components.signal import Signal

SIGNAL = Signal[None](
    name="nccl_debug",
    summary="NCCL / PyTorch async-debug readiness of a job: whether a stall will be diagnosable",
    scope="host",
    collector="jobs",
    detector="stuck",
)
