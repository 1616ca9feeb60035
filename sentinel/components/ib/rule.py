"""Port health policy: a host's port records and ``now`` in, findings with a reason and an action out.

Pure. The aggregator's network detector runs it on each host's latest records. It judges a port down for
``down_after_s`` (a port seen up before), flapping, a single recovered link loss, a rate below the
expected one, and symbol or receive errors over a per-hour budget; the kernel's own lines about the port
are added as evidence. Each threshold (:class:`PortRuleConfig`, ``[detect.network]``) documents its
default; docs/network.md describes the rules.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from typing import Annotated

import msgspec

from sentinel.components.ib.record import RECEIVE_ERROR_COUNTERS, IbPort
from sentinel.components.vocab import Action, VerdictKind


class PortRuleConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """InfiniBand / RoCE port rules (see docs/network.md for the reason behind each default)."""

    enabled: Annotated[bool, msgspec.Meta(description="judge the ports agents report")] = True
    down_after_s: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            le=3600,
            description="a port seen up before and not ACTIVE/LinkUp for this long is down (two agent ticks: "
            "a bounce shorter than that is counted by the flap rule instead)",
        ),
    ] = 2.0
    flap_downs: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=64,
            description="losses of link within the agent's flap window that make a flap (one is an event, "
            "three a pattern); SentinelIbLinkFlapping and the fleet dashboard's flaps panel are built from it "
            "(sentinel rules build --aggregator-config)",
        ),
    ] = 3
    expected_rate_gbps: Annotated[
        float,
        msgspec.Meta(
            ge=0, description="the rate every port should run at; 0: the majority of the host's up ports"
        ),
    ] = 0.0
    symbol_error_budget_per_hour: Annotated[
        float,
        msgspec.Meta(
            ge=0, description="symbol errors per hour tolerated (ibcheckerrs' SymbolErrorCounter threshold)"
        ),
    ] = 10.0
    receive_error_budget_per_hour: Annotated[
        float,
        msgspec.Meta(
            ge=0,
            description="receive / link-integrity / buffer-overrun errors per hour tolerated (ibcheckerrs' "
            "PortRcvErrors and LocalLinkIntegrityErrors threshold)",
        ),
    ] = 10.0
    ignore_devices: Annotated[
        list[str],
        msgspec.Meta(
            description="device name globs never judged (storage or management HCAs), e.g. mlx5_bond*"
        ),
    ] = []


class PortFinding(msgspec.Struct, frozen=True, kw_only=True):
    """What one rule says about one port."""

    device: str
    port: int
    kind: VerdictKind  # faulty or degraded
    action: Action
    reason: str  # ib_port_down, ib_link_flap, ib_link_downed, ib_rate_degraded, ib_symbol_errors, ...
    evidence: tuple[str, ...]
    since: float  # agent time the evidence began


#: findings about the link itself, which the kernel's lines about the port explain
_LINK_REASONS = frozenset({"ib_port_down", "ib_link_flap", "ib_link_downed"})


def expected_rate(ports: list[IbPort], cfg: PortRuleConfig, link_layer: str) -> float | None:
    """The configured rate, else the rate most up ports of ``link_layer`` run at (None: no majority)."""
    if cfg.expected_rate_gbps > 0:
        return cfg.expected_rate_gbps
    rates = Counter(p.rate_gbps for p in ports if p.up and p.link_layer == link_layer and p.rate_gbps > 0)
    if len(rates) < 1 or sum(rates.values()) < 2:
        return None
    (best, count), *rest = rates.most_common()
    if rest and rest[0][1] == count:
        return None  # a tie is no majority
    return best


def _per_hour(increase: int, window_s: float) -> float:
    # a window shorter than an hour (a young agent) is judged as a full hour: no budget alarm from one error
    return increase * 3600.0 / max(window_s, 3600.0)


def evaluate_ports(ports: list[IbPort], cfg: PortRuleConfig, now: float) -> list[PortFinding]:
    """Every finding true now for one host's ports (``now`` on the agent's clock, like the records)."""
    if not cfg.enabled:
        return []
    judged = (
        [p for p in ports if not any(fnmatch.fnmatchcase(p.device, g) for g in cfg.ignore_devices)]
        if cfg.ignore_devices
        else ports
    )
    rates = {layer: expected_rate(judged, cfg, layer) for layer in {p.link_layer for p in judged}}
    out: list[PortFinding] = []
    for port in judged:
        if port.up and not port.downs and not port.window_increase and port.down_since is None:
            want = rates[port.link_layer]
            if want is None or port.rate_gbps >= want or port.rate_gbps <= 0:
                continue  # the common case, a healthy port: nothing to say
        out.extend(_port(port, rates[port.link_layer], cfg, now))
    return out


def _port(port: IbPort, want: float | None, cfg: PortRuleConfig, now: float) -> list[PortFinding]:
    out: list[PortFinding] = []
    name = f"{port.device} port {port.port}"

    kernel = tuple(f"kernel log: {line}" for line in port.kernel_log)

    def finding(kind: VerdictKind, action: Action, reason: str, since: float, *evidence: str) -> None:
        if reason in _LINK_REASONS:
            evidence = (*evidence, *kernel)
        out.append(
            PortFinding(
                device=port.device,
                port=port.port,
                kind=kind,
                action=action,
                reason=reason,
                evidence=tuple(evidence),
                since=since,
            )
        )

    if not port.up and port.seen_up and port.down_since is not None:
        down_for = now - port.down_since
        if down_for >= cfg.down_after_s:
            finding(
                "faulty",
                "drain",
                "ib_port_down",
                port.down_since,
                f"{name} is {port.state.upper()} / {port.phys_state} for {down_for:.0f}s (was up before)",
            )
    downs = len(port.downs)
    if downs >= cfg.flap_downs:
        finding(
            "faulty",
            "drain",
            "ib_link_flap",
            port.downs[0],
            f"{name} lost its link {downs} times in the last {port.flap_window_s:.0f}s "
            f"(threshold {cfg.flap_downs})",
        )
    elif downs and (port.up or downs > 1):  # a first loss still down is judged by the port-down rule
        now_state = "is up again" if port.up else "is down right now"
        finding(
            "degraded",
            "none",
            "ib_link_downed",
            port.downs[-1],
            f"{name} lost its link {downs} time(s) in the last {port.flap_window_s:.0f}s and {now_state} "
            f"(link_downed {port.counters.get('link_downed', 0)})",
        )
    if port.up and want is not None and 0 < port.rate_gbps < want:
        source = "configured" if cfg.expected_rate_gbps > 0 else "the host's other ports"
        finding(
            "degraded",
            "drain",
            "ib_rate_degraded",
            port.t,
            f"{name} runs at {port.rate_gbps:g} Gb/s, expected {want:g} Gb/s ({source})",
        )
    symbol = port.window_increase.get("symbol_error", 0)
    if symbol and _per_hour(symbol, port.window_s) > cfg.symbol_error_budget_per_hour:
        finding(
            "degraded",
            "drain",
            "ib_symbol_errors",
            port.t - port.window_s,
            f"{name}: {symbol} symbol errors in {port.window_s / 60:.0f} min "
            f"(budget {cfg.symbol_error_budget_per_hour:g}/h)",
        )
    receive = {n: port.window_increase[n] for n in RECEIVE_ERROR_COUNTERS if port.window_increase.get(n)}
    total = sum(receive.values())
    if total and _per_hour(total, port.window_s) > cfg.receive_error_budget_per_hour:
        detail = ", ".join(f"{n} +{v}" for n, v in sorted(receive.items()))
        finding(
            "degraded",
            "drain",
            "ib_receive_errors",
            port.t - port.window_s,
            f"{name}: receive/integrity errors rising ({detail} in {port.window_s / 60:.0f} min, "
            f"budget {cfg.receive_error_budget_per_hour:g}/h)",
        )
    return out
