"""InfiniBand / RoCE port alerts: the network verdicts, a flapping link, ports the agent cannot read.

The flap threshold is the port rule's own setting (:attr:`PortRuleConfig.flap_downs
<sentinel.components.ib.rule.PortRuleConfig.flap_downs>`, ``[detect.network]``): the alert on the agent's
per-port count, the verdict and the fleet dashboard's panel all read it, so changing it moves all three.
"""

from __future__ import annotations

from sentinel.components.alerting import AlertRule, spoken
from sentinel.components.ib.rule import PortRuleConfig

VERDICT_BY = "cluster, host, gpu, job, rank, reason, action"
#: the agent's per-port count of losses of link within its flap window (ib/metrics.py)
LINK_DOWNS = "sentinel_ib_port_link_downs_in_window"
DEGRADED_FOR_S = 600


def flap_expr(settings: PortRuleConfig) -> str:
    """The flapping alert's expression: as many losses of link as the verdict's flap threshold."""
    return f"max by (cluster, host, device, port) ({LINK_DOWNS}) >= {settings.flap_downs}"


def alerts(settings: PortRuleConfig) -> list[AlertRule]:
    """The network alerts for the port rule's ``settings``."""
    return [
        AlertRule(
            alert="SentinelIbPortDown",
            group="sentinel-network",
            comment="the network detector's verdict: a port seen up before is DOWN / not LinkUp for "
            "detect.network.down_after_s",
            expr=f'max by ({VERDICT_BY}) (sentinel_verdict_open{{kind="faulty",reason="ib_port_down"}}) == 1',
            for_s=30,
            severity="critical",
            summary="An IB/RoCE port on {{ $labels.host }} is down; action: {{ $labels.action }}",
            description="A port on {{ $labels.host }} that was up is down (serving GPU "
            '{{ or $labels.gpu "several" }}, job {{ or $labels.job "none" }}); the verdict\'s evidence names '
            "the device and port. Recommended action: {{ $labels.action }}.",
        ),
        AlertRule(
            alert="SentinelIbHcaFailed",
            group="sentinel-network",
            comment="the host-health detector's verdict on an mlx5 HCA that died or whose firmware failed "
            "(components/ib/hca.py):\nevery port on it is gone",
            expr=f'max by ({VERDICT_BY}) (sentinel_verdict_open{{kind="faulty",reason=~"ib_hca_.*"}}) == 1',
            for_s=0,
            severity="critical",
            summary="An HCA on {{ $labels.host }} failed ({{ $labels.reason }}); action: {{ $labels.action }}",
            description="The mlx5 driver on {{ $labels.host }} reported its HCA dead or its firmware failed "
            "({{ $labels.reason }}): every port on it is unusable. The verdict's evidence has the kernel lines. "
            "Recommended action: {{ $labels.action }}, then reboot; replace the HCA if it fails again.",
        ),
        AlertRule(
            alert="SentinelIbLinkFlapping",
            group="sentinel-network",
            comment="the agent counts losses of link (link_downed and observed transitions) over its flap "
            "window;\nthe threshold is the flap verdict's (detect.network.flap_downs)",
            expr=flap_expr(settings),
            for_s=60,
            severity="critical",
            summary="IB/RoCE link {{ $labels.host }} {{ $labels.device }}/{{ $labels.port }} is flapping",
            description="{{ $labels.device }} port {{ $labels.port }} on {{ $labels.host }} lost its link "
            "{{ $value }} times within the agent's flap window; every job crossing it can stall or abort. "
            "Drain the host and check the cable, transceiver and switch port.",
        ),
        AlertRule(
            alert="SentinelIbPortDegraded",
            group="sentinel-network",
            expr=f'max by ({VERDICT_BY}) (sentinel_verdict_open{{kind="degraded",reason=~"ib_.*"}}) == 1',
            for_s=DEGRADED_FOR_S,
            takes_reasons="ib_.*",  # and with it every port verdict, faulty included
            severity="warning",
            summary="An IB/RoCE port on {{ $labels.host }} is degraded ({{ $labels.reason }})",
            description='A port on {{ $labels.host }} (serving GPU {{ or $labels.gpu "several" }}, job '
            '{{ or $labels.job "none" }}) has been degraded for '
            f"{spoken(DEGRADED_FOR_S)} (reason {{{{ $labels.reason }}}}: slow rate, error budget exceeded or "
            "a loss of link). Recommended action: {{ $labels.action }}.",
        ),
        AlertRule(
            alert="SentinelIbReadErrors",
            group="sentinel-network",
            comment="the collector never dies from what it reads; this is the metric that says it could not read",
            expr="sum by (cluster, host) (increase(sentinel_ib_read_errors_total[15m])) > 0",
            for_s=900,
            severity="warning",
            summary="The agent on {{ $labels.host }} cannot read some IB/RoCE sysfs files",
            description="sentinel-agent on {{ $labels.host }} keeps failing to read or parse files under "
            "class/infiniband (see its ib_read_problem log lines); the ports it cannot read are not judged.",
        ),
    ]
