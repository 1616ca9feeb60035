"""Kernel log lines about an HCA port, turned into port evidence.

The mlx5 driver's lines (``ib0: Link down``, ``Port: 1 Link DOWN``, ``Cable unplugged``, ``Bad cable``)
say *why* a port went down, which sysfs cannot: a link down, an unplugged cable or a transceiver error is a
warning, the HCA itself failing is critical. :func:`port_log_line` reads which port such a line is about (by
the HCA's PCI function), so the port's record carries it as evidence for the port rules' findings; a line
about the HCA rather than a port's link, or one that names no PCI function, is kept by the aggregator as
host evidence instead (:func:`host_evidence`).
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

#: classification reasons (sentinel.signals' kernel parser and rules) of the lines about a port's link: the
#: agent attaches such a line to the port it names
PORT_REASONS: Final = frozenset({"link_down", "ib_link_down", "ib_port_hardware"})
#: every reason of a kernel line about an HCA: its ports' links, its queues' completion errors and the HCA
#: itself failing (health poll missed, firmware command timeout, firmware fatal error)
HCA_REASONS: Final = PORT_REASONS | {
    "ib_completion_error",
    "ib_hca_failure",
    "ib_hca_fw_fatal",
    "ib_hca_cmd_timeout",
}
MAX_TEXT: Final = 300

_MLX5_RE: Final = re.compile(
    r"\bmlx5_core (?P<pci>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])(?: (?P<name>[\w.-]{1,32}))?: "
)
_IB_DEVICE_RE: Final = re.compile(r"mlx5_\d{1,4}$")
_IB_PORT_RE: Final = re.compile(r"\bPort: (?P<port>\d{1,3}) ")


class PortLogLine(msgspec.Struct, frozen=True, kw_only=True):
    """A kernel line about one HCA port: which PCI function, interface or IB device (and port) it names."""

    pci_bus: str  # 0000:17:00.0, lower case (as sysfs names the device)
    name: str  # ib0, enp23s0f0np0, mlx5_5, or "" when the line names only the PCI function
    port: int | None  # the IB port number when the line names one (mlx5_ib's "Port: 1")
    text: str


def port_log_line(message: str, reason: object) -> PortLogLine | None:
    """The port a classified kernel line is evidence about; ``None`` when it is not port evidence or
    names no PCI function."""
    if reason not in PORT_REASONS:
        return None
    match = _MLX5_RE.search(message)
    if match is None:
        return None
    port = _IB_PORT_RE.search(message, match.end())
    return PortLogLine(
        pci_bus=match.group("pci").lower(),
        name=match.group("name") or "",
        port=int(port.group("port")) if port is not None else None,
        text=" ".join(message[match.start() :].split())[:MAX_TEXT],
    )


def host_evidence(message: str, reason: object) -> bool:
    """Whether the aggregator keeps a classified kernel line as its host's HCA evidence: a line about an
    HCA that the agent does not attach to a port's record (:func:`port_log_line`: a completion error, a
    line naming no PCI function). A line either travels on the port's record or as host evidence, never
    both, so it reaches a port's verdict once."""
    return reason in HCA_REASONS and port_log_line(message, reason) is None


def names_port(line: PortLogLine, device: str, port: int, netdev: str, pci_bus: str) -> bool:
    """Whether ``line`` is about this port: by its IB device (and port number), by its interface, or by
    the HCA function (mlx5 gives each port its own PCI function) when the line names nothing the port's
    record can tell apart (an interface sysfs did not link to the port)."""
    if line.name == device:
        return line.port is None or line.port == port
    if line.name and (netdev or _IB_DEVICE_RE.match(line.name) is not None):
        return line.name == netdev  # another port's interface or IB device
    return bool(pci_bus) and line.pci_bus == pci_bus.lower()
