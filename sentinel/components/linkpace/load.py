"""A link's load from its record: bytes per second both ways and the wait / congestion rates the link-pace
rule compares (an IB/RoCE port's counters and hw_counters, or a network interface's statistics and root
qdisc), from the per-second rates the agent computed between its two latest reads; a wait that did not
move is left out (a missing name reads as zero)."""

from __future__ import annotations

from sentinel.components.ib.record import DATA_WORD_BYTES, IbPort
from sentinel.components.linkpace.rule import WAIT_COUNTERS
from sentinel.components.netdev.record import Netdev


def port_load(port: IbPort) -> tuple[float, dict[str, float]]:
    rates = port.rates
    data = (rates.get("port_xmit_data", 0.0) + rates.get("port_rcv_data", 0.0)) * DATA_WORD_BYTES
    return data, {name: value for name in WAIT_COUNTERS if (value := rates.get(name, 0.0))}


def netdev_load(netdev: Netdev) -> tuple[float, dict[str, float]]:
    rates = netdev.rates
    data = rates.get("rx_bytes", 0.0) + rates.get("tx_bytes", 0.0)
    return data, {name: value for name in WAIT_COUNTERS if (value := rates.get(name, 0.0))}
