"""The typed record of one network interface: its state, speed and ``statistics/`` counters, plus the
per-second rates since the agent's previous reading. The same struct travels in ``Batch.netdevs``."""

from __future__ import annotations

import msgspec

#: interfaces read per host (and carried per batch)
MAX_NETDEVS = 64

#: the root qdisc's counters, merged into ``counters`` under these names: a packet that waited for the
#: shaper (``overlimits``), was dropped, or was put back (``requeues``): the interface's egress wait
QDISC_COUNTERS: tuple[str, ...] = ("qdisc_overlimits", "qdisc_drops", "qdisc_requeues")

#: counters whose increase means packets lost or refused on the interface (retransmitted by TCP above it)
ERROR_COUNTERS: tuple[str, ...] = (
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
    "rx_crc_errors",
    "rx_missed_errors",
    "rx_fifo_errors",
    "tx_fifo_errors",
    "tx_carrier_errors",
    "tx_aborted_errors",
)


#: the ``statistics/`` files read (each read of one makes the driver gather its statistics: the rest of the
#: directory, compression, multicast, heartbeat and window errors, is left alone)
READ_COUNTERS: frozenset[str] = frozenset(
    {"rx_bytes", "tx_bytes", "rx_packets", "tx_packets", *ERROR_COUNTERS}
)


class NetdevReading(msgspec.Struct, frozen=True, kw_only=True):
    """One interface as read at one instant."""

    name: str  # eth0, ens6f0np0, veth-a
    operstate: str = ""  # up, down, unknown, lowerlayerdown, ...
    speed_mbps: int | None = None  # None where the driver reports none (virtual devices, link down)
    counters: dict[str, int] = {}  # statistics/<file> by file name, plus the root qdisc's qdisc_* counters
    ifindex: int = 0
    qdisc: str = ""  # the root qdisc's kind (tbf, mq, fq_codel, noqueue); "" when not read
    qdisc_backlog_bytes: int = 0


class Netdev(msgspec.Struct, frozen=True, kw_only=True):
    """A reading plus its rates per second since the previous one (absent on the first or after a reset)."""

    name: str
    operstate: str = ""
    speed_mbps: int | None = None
    counters: dict[str, int] = {}
    t: float = 0.0  # agent time of the reading
    rates: dict[str, float] = {}
    qdisc: str = ""
    qdisc_backlog_bytes: int = 0
