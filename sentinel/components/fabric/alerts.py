"""NVSwitch fabric alerts: the fabric manager not running (the agent's own gauge, so a fabric manager down
for days pages even with the aggregator's verdict switched off) and the host-health detector's switch
verdicts (a fatal SXid; non-fatal ones repeating) and the hardware detector's host verdict of no GPU
registered with the fabric.

The fabric manager's wait is the verdict's own setting (:attr:`FabricRuleConfig.manager_down_after_s
<sentinel.components.fabric.host.FabricRuleConfig.manager_down_after_s>`, ``[detect.fabric]``).
"""

from __future__ import annotations

from typing import Final

from sentinel.components.alerting import AlertRule, spoken
from sentinel.components.fabric.host import FABRIC_NOT_COMPLETED, MANAGER_DOWN, FabricRuleConfig

#: the host verdicts of the switches (components/xid/sxid.py's reasons)
SWITCH_REASONS: Final = "sxid_.*"
#: the host verdict of a host none of whose GPUs is registered with the fabric
NOT_COMPLETED: Final = FABRIC_NOT_COMPLETED.reason
HOST_BY: Final = "cluster, host, reason, action"
#: the shortest wait before the fabric manager alert fires (a restart takes seconds)
MIN_DOWN_S: Final = 60


def alerts(settings: FabricRuleConfig) -> list[AlertRule]:
    """The fabric alerts for the fabric rule's ``settings``."""
    down_for = max(MIN_DOWN_S, int(settings.manager_down_after_s))
    return [
        AlertRule(
            alert="SentinelFabricManagerDown",
            group="sentinel-gpu",
            comment="the agent's reading of nvidia-fabricmanager.service (only hosts that have the unit export "
            "it);\n`for` is the host verdict's detect.fabric.manager_down_after_s (a minute at least)",
            expr="max by (cluster, host, state) (sentinel_fabric_manager_up) == 0",
            for_s=down_for,
            severity="critical",
            action="drain",
            takes_reasons=MANAGER_DOWN.reason,  # the host verdict of the same fact
            summary="nvidia-fabricmanager is not running on {{ $labels.host }} ({{ $labels.state }})",
            description="The NVSwitch fabric manager on {{ $labels.host }} has not been running for "
            f"{spoken(down_for)} (systemd state {{{{ $labels.state }}}}): new CUDA jobs cannot start on its "
            "NVLink fabric. Restart nvidia-fabricmanager; journalctl -u nvidia-fabricmanager says why it stopped.",
        ),
        AlertRule(
            alert="SentinelFabricNotCompleted",
            group="sentinel-gpu",
            comment="the hardware detector's host verdict: every GPU of the host unregistered from the NVLink "
            "fabric for\ndetect.fabric.not_completed_after_s; their GPU verdicts fold into it",
            expr=f'max by ({HOST_BY}) (sentinel_verdict_open{{kind="faulty",reason="{NOT_COMPLETED}"}}) == 1',
            for_s=0,
            severity="critical",
            takes_reasons=NOT_COMPLETED,
            summary="No GPU of {{ $labels.host }} is registered with the NVLink fabric; action: "
            "{{ $labels.action }}",
            description="Every GPU of {{ $labels.host }} that reports a fabric state has not completed its "
            f"fabric registration for {spoken(int(settings.not_completed_after_s))} or more: the fabric "
            "manager has not configured the host's NVSwitches and NCCL init over NVLink hangs. The verdict's "
            "evidence names the GPUs, their state and the fabric manager's. Recommended action: "
            "{{ $labels.action }}, then restart nvidia-fabricmanager (journalctl -u nvidia-fabricmanager says "
            "why it failed).",
        ),
        AlertRule(
            alert="SentinelNvSwitchFatal",
            group="sentinel-gpu",
            comment="the host-health detector's verdict on a fatal SXid: one per host and switch, never one "
            "per GPU",
            expr=f'max by ({HOST_BY}) (sentinel_verdict_open{{kind="faulty",reason=~"{SWITCH_REASONS}"}}) == 1',
            for_s=0,
            severity="critical",
            takes_reasons=SWITCH_REASONS,
            summary="An NVSwitch on {{ $labels.host }} reported a fatal SXid ({{ $labels.reason }}); "
            "action: {{ $labels.action }}",
            description="The NVSwitch driver on {{ $labels.host }} logged a fatal {{ $labels.reason }}: the "
            "switch stopped its NVLink traffic and the host's GPUs lost their NVLink peers. The verdict's "
            "evidence names the switch. Recommended action: {{ $labels.action }} (resets the NVSwitches and "
            "GPUs, restarts the fabric manager).",
        ),
        AlertRule(
            alert="SentinelNvSwitchErrorsRepeating",
            group="sentinel-gpu",
            comment="non-fatal SXids of one switch over detect.fabric.nonfatal_sxids within "
            "detect.fabric.nonfatal_window_s",
            expr=f'max by ({HOST_BY}) (sentinel_verdict_open{{kind="degraded",reason=~"{SWITCH_REASONS}"}}) == 1',
            for_s=0,
            severity="warning",
            summary="An NVSwitch on {{ $labels.host }} keeps reporting non-fatal {{ $labels.reason }}",
            description="An NVSwitch on {{ $labels.host }} reported non-fatal {{ $labels.reason }} at least "
            f"{settings.nonfatal_sxids} times within {spoken(int(settings.nonfatal_window_s))}. The switch "
            "corrects them; a rate like this points at a link or a switch going bad: check its links and plan "
            "a maintenance window.",
        ),
    ]
