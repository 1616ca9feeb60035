"""The nccl_ras signal: NCCL's RAS service, a host-level source queried by its collector; its status is
evidence the stuck detector adds to a stalled job's verdict (``stall_evidence``)."""

from __future__ import annotations

from sentinel.components.nccl_ras.collector import build
from sentinel.components.nccl_ras.parse import parse_status
from sentinel.components.nccl_ras.rule import stall_evidence
from sentinel.components.signal import Signal

SIGNAL = Signal[None](
    name="nccl_ras",
    summary="NCCL RAS status of a job (NCCL >= 2.24): dead or unreachable ranks behind a stall",
    scope="host",
    collector="nccl_ras",
    collect=build,
    detector="stuck",
    parse=parse_status,
    stall_evidence=stall_evidence,
)
