"""The hardware judgement of one GPU: every judged GPU signal's judge on its own memory, in precedence order.

The one decision site for "is this GPU fit?": the aggregator's hardware detector turns its answers into
verdicts, the agent's ``sentinel health`` into the node's fitness, so a job launcher asking the agent gets the
answer the aggregator would give. Pure: the GPU's view (:mod:`sentinel.components.gpu_view`), the thresholds
and ``now`` in, the judged findings out.
"""

from __future__ import annotations

from typing import Protocol

from sentinel.components.ecc.rule import EccThresholds
from sentinel.components.gpu_view import GpuView
from sentinel.components.registry import JUDGED
from sentinel.components.signal import Judged, JudgeSettings
from sentinel.components.xid.rule import XidPolicyConfig


class RateThresholds(Protocol):
    """The per-GPU hardware thresholds (the aggregator's ``[detect.hardware]``)."""

    @property
    def rate_window_s(self) -> float: ...
    @property
    def nvlink_errors_per_s(self) -> float: ...
    @property
    def pcie_replays_per_s(self) -> float: ...
    @property
    def lost_cause_wait_s(self) -> float: ...


def judge_settings(
    cfg: RateThresholds, ecc_limits: EccThresholds | None, xid: XidPolicyConfig
) -> JudgeSettings:
    return JudgeSettings(
        rate_window_s=cfg.rate_window_s,
        nvlink_errors_per_s=cfg.nvlink_errors_per_s,
        pcie_replays_per_s=cfg.pcie_replays_per_s,
        lost_cause_wait_s=cfg.lost_cause_wait_s,
        ecc=ecc_limits,
        xid=xid,
    )


def judge_gpu(
    gpu: GpuView, settings: JudgeSettings, now: float, *, reported_until: float | None = None
) -> list[Judged]:
    """Every hardware problem of ``gpu`` that is true now, each judged GPU signal's in precedence order.

    ``reported_until``: agent time of the host's latest batch (default: the GPU's latest sample), against
    which a lost GPU's wait for its Xid is measured.
    """
    gpu.reported_until = gpu.t if reported_until is None else reported_until
    found: list[Judged] = []
    memory = gpu.memory
    for signal in JUDGED:
        found.extend(signal.judge(gpu, memory.get(signal.name), settings, now))  # type: ignore[misc]
    return found
