"""Simulated IB ports: one 400G NDR InfiniBand port per GPU (``mlx5_<gpu>``, behind the GPU's PCIe switch,
as on a DGX H100), readings shaped exactly like :mod:`sentinel.components.ib.sysfs`'s, and the network
faults of a scenario:

* ``port_down`` — from ``at_s`` the port is ``DOWN`` / ``Disabled``, ``link_downed`` counts the loss, the
  kernel logs an mlx5 module error, and the GPU's rank stalls in its next collective (NCCL is silent: no
  NET error yet), so the stall's only explanation is the port.
* ``link_flap`` — from ``at_s`` the link drops for ``FLAP_DOWN_S`` (shorter than a read interval: the state is rarely seen down, link_downed counts it) every ``FLAP_PERIOD_S`` and comes back;
  ``link_downed`` counts every drop (also the ones between two readings).
* ``link_degraded`` — from ``at_s`` the link runs at ``rate_gbps`` and symbol errors accumulate.
* ``link_slow`` — from ``at_s`` the port carries its rank's traffic ``slowdown`` times slower (its data
  counters grow that much slower); unless ``silent``, its wait (``port_xmit_wait``), congestion (CNPs) and
  retransmission (``out_of_sequence``) counters climb, with a few symbol errors.
* ``nic_lost`` — from ``at_s`` the HCA is gone from sysfs (the scan no longer finds the port).

A port whose GPU runs a job carries traffic from the job's start (``BUSY_BYTES_PER_S``, with the wait a
loaded port always has); an idle port's data counters stand still.

Pure model: time is passed in, nothing reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from sentinel.components.ib.record import DATA_WORD_BYTES, PortReading
from sentinel.components.ib.sysfs import PortScan

INF = float("inf")
RATE_GBPS = 400.0
FLAP_PERIOD_S = 20.0
FLAP_DOWN_S = 1.0
SYMBOL_ERRORS_PER_S = 0.5
BUSY_BYTES_PER_S = 6e9  # a loaded 400G rail, both directions together
BUSY_WAIT_PER_S = 2e5  # port_xmit_wait ticks a healthy loaded port accumulates
#: what a slow, non-silent port adds per second: its sends wait, the fabric marks and drops its packets
SLOW_WAIT_PER_S = 5e6
SLOW_CNP_PER_S = 400.0
SLOW_OUT_OF_SEQUENCE_PER_S = 50.0
SLOW_SYMBOL_ERRORS_PER_S = 0.02
_RATE_TEXT = {400.0: "4X NDR", 200.0: "2X NDR", 100.0: "1X NDR"}


@dataclass
class SimPort:
    device: str
    pci_bus: str
    gpu: int
    down_at: float = INF
    flap_at: float = INF
    degraded_at: float = INF
    degraded_rate: float = RATE_GBPS
    busy_from: float = INF  # a job's rank runs on the GPU: the port carries its traffic from then on
    slow_at: float = INF
    slowdown: float = 1.0
    silent: bool = False
    lost_at: float = INF
    _healthy: PortReading | None = None
    _busy: PortReading | None = None

    def _flaps(self, t: float) -> tuple[int, bool]:
        """Drops started by ``t`` and whether the link is down at ``t``."""
        if t < self.flap_at:
            return 0, False
        since = t - self.flap_at
        return int(since // FLAP_PERIOD_S) + 1, since % FLAP_PERIOD_S < FLAP_DOWN_S

    def reading(self, t: float) -> PortReading:
        if t < min(self.down_at, self.flap_at, self.degraded_at, self.slow_at):
            if t < self.busy_from:
                if self._healthy is None:  # before any fault or traffic the port reads the same every time
                    self._healthy = self._read(t)
                return self._healthy
            if self._busy is None:  # before any fault a busy port differs only in its traffic counters
                self._busy = self._read(t)
                return self._busy
            return msgspec.structs.replace(self._busy, counters=self._counters(t, 0))
        return self._read(t)

    def _read(self, t: float) -> PortReading:
        drops, flapping_down = self._flaps(t)
        down = t >= self.down_at
        drops += 1 if down else 0
        rate = self.degraded_rate if t >= self.degraded_at else RATE_GBPS
        state, phys = ("down", "disabled") if down or flapping_down else ("active", "linkup")
        return PortReading(
            device=self.device,
            port=1,
            state=state,
            phys_state=phys,
            rate_gbps=rate,
            link_layer="InfiniBand",
            counters=self._counters(t, drops),
            pci_bus=self.pci_bus,
            numa_node=0 if self.gpu < 4 else 1,
            gpus=[self.gpu],
            locality="pcie_switch",
        )

    def _counters(self, t: float, drops: int) -> dict[str, int]:
        """The port's counters at ``t``, ``drops`` losses of link so far."""
        symbol = int((t - self.degraded_at) * SYMBOL_ERRORS_PER_S) if t >= self.degraded_at else 0
        busy = max(0.0, t - self.busy_from)
        slow = max(0.0, t - self.slow_at) if busy else 0.0
        words = (BUSY_BYTES_PER_S * (busy - slow + slow / self.slowdown)) / DATA_WORD_BYTES
        loud = 0.0 if self.silent else slow
        traffic = {
            "port_xmit_data": int(words / 2),
            "port_rcv_data": int(words / 2),
            "port_xmit_wait": int(BUSY_WAIT_PER_S * busy + SLOW_WAIT_PER_S * loud),
            "np_cnp_sent": int(SLOW_CNP_PER_S * loud),
            "out_of_sequence": int(SLOW_OUT_OF_SEQUENCE_PER_S * loud),
        }
        symbol += int(SLOW_SYMBOL_ERRORS_PER_S * loud)
        return {
            "link_downed": drops,
            "link_error_recovery": 0,
            "local_link_integrity_errors": 0,
            "port_rcv_errors": 0,
            "port_rcv_remote_physical_errors": 0,
            "port_xmit_discards": 0,
            "symbol_error": symbol,
            **traffic,
        }

    def removed_line(self) -> str:
        """The kernel line mlx5_core prints when the HCA falls off the bus (PCI error recovery)."""
        return (
            f"mlx5_core {self.pci_bus}: mlx5_pci_err_detected:1233:(pid 0): Device state = 2 "
            "pci_status: 0. Enter, pci channel state = 3"
        )

    def module_error_line(self, t: float) -> str:
        """The kernel line mlx5_core prints when the transceiver fails (``mlx5_port_module_event``)."""
        return (
            f"mlx5_core {self.pci_bus}: mlx5_port_module_event:1131:(pid 0): Port module event[error]: "
            f"module {self.gpu}, Cable error, Bus stuck (I2C or data shorted)"
        )


def rate_text(rate: float) -> str:
    return f"{rate:g} Gb/sec ({_RATE_TEXT.get(rate, '4X NDR')})"


def scan(ports: list[SimPort], t: float) -> PortScan:
    return PortScan(ports=[p.reading(t) for p in ports if t < p.lost_at], present=True)
