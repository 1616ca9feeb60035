"""The typed record of one InfiniBand / RoCE port: the same struct on the wire, in the rules and in
``sentinel agent once --json`` (contract section 8's ``ib_ports`` entries).

A :class:`PortReading` is what sysfs (or the simulator) says at one instant; the agent's
:class:`~sentinel.components.ib.tracker.PortTracker` turns consecutive readings into an :class:`IbPort`:
the reading plus what only history can tell — counter rates per second, counter increases over the error
budget window, and the link-down events within the flap window (kept in the agent's state directory, so an
agent restart does not forget a flapping link).
"""

from __future__ import annotations

from typing import Any

import msgspec

#: Counter files whose increase is an error (IBTA PortCounters); data and packet counters are not.
ERROR_COUNTERS: tuple[str, ...] = (
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
#: Receive / link-integrity errors: bad packets arriving, or the link failing its integrity check.
RECEIVE_ERROR_COUNTERS: tuple[str, ...] = (
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
#: ``port_xmit_data`` / ``port_rcv_data`` count 32-bit words (IBTA: octets divided by 4).
DATA_WORD_BYTES = 4


class PortReading(msgspec.Struct, frozen=True, kw_only=True):
    """One port as read at one instant, before any history is applied."""

    device: str  # mlx5_0
    port: int  # 1
    state: str  # active, down, init, armed, ... (lower-case name after "4: ")
    phys_state: str  # linkup, disabled, polling, ... (lower-case, spaces removed)
    rate_gbps: float
    link_layer: str  # InfiniBand or Ethernet, as sysfs prints it
    counters: dict[str, int] = {}  # counters/ and hw_counters/ by file name
    netdev: str = ""  # the RoCE port's network interface (ens1f0np0)
    pci_bus: str = ""  # the HCA's PCI address, dddd:bb:dd.f
    numa_node: int | None = None
    gpus: list[int] = []  # indices of the GPUs this port serves
    locality: str = ""  # pcie_switch | numa | "" (how the GPUs were matched)

    @property
    def key(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def up(self) -> bool:
        return self.state == "active" and self.phys_state == "linkup"


class IbPort(msgspec.Struct, frozen=True, kw_only=True):
    """A port reading plus its history-derived fields; what the agent ships and the rules judge."""

    device: str
    port: int
    state: str
    phys_state: str
    rate_gbps: float
    link_layer: str
    counters: dict[str, int] = {}
    gpus: list[int] = []
    netdev: str = ""
    pci_bus: str = ""
    numa_node: int | None = None
    locality: str = ""
    t: float = 0.0  # agent time of the reading
    #: counter increase per second since the previous reading (absent on the first reading or a reset)
    rates: dict[str, float] = {}
    #: increase of each error counter over the error window (``window_s``), agent restarts included
    window_increase: dict[str, int] = {}
    window_s: float = 0.0
    #: agent times of link-down events within the flap window (from link_downed and observed transitions)
    downs: list[float] = []
    flap_window_s: float = 0.0
    #: the port has been seen up (active, LinkUp) by this agent, now or before (persisted)
    seen_up: bool = False
    #: when the port went down (agent time), while it is down
    down_since: float | None = None
    #: the kernel's latest lines about this port within the flap window (``ib0: Link down``, ``Cable
    #: unplugged``): evidence of why, shown with the port rules' findings
    kernel_log: list[str] = []

    @property
    def key(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def up(self) -> bool:
        return self.state == "active" and self.phys_state == "linkup"


def contract_view(port: IbPort | PortReading) -> dict[str, Any]:
    """The contract section 8 object, every named field present, then the extensions."""
    data: dict[str, Any] = msgspec.to_builtins(port)
    head = {
        name: data.pop(name)
        for name in ("device", "port", "state", "phys_state", "rate_gbps", "link_layer", "counters", "gpus")
    }
    return head | data
