"""Read InfiniBand / RoCE ports from sysfs under a configurable root, the way the kernel lays them out.

Reads ``class/infiniband/<dev>/ports/<n>/`` (state, phys_state, rate, link_layer, counters, hw_counters,
the RoCE netdev) under ``/sys`` or ``--sysfs-root``, and the PCI tree for which GPUs a port serves
(:mod:`sentinel.components.ib.topology`). Everything is bounded; files are read without blocking and only
when regular (:mod:`.files`: a FIFO is an error, not a hang); a file that cannot be read or parsed is named
in the returned errors and the rest of the port is still reported.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sentinel.components.ib.files import read_small
from sentinel.components.ib.record import PortReading
from sentinel.components.ib.topology import PciTopology

MAX_DEVICES = 64
MAX_PORTS = 16
MAX_COUNTER_FILES = 256
MAX_FILE_BYTES = 4096
MAX_NAME = 64

_STATE = re.compile(r"^\s*(\d{1,3})\s*:\s*([A-Za-z_ ]{1,64}?)\s*$")
_RATE = re.compile(r"^\s*(\d{1,6}(?:\.\d{1,6})?)\s*Gb/sec\b")
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class SysfsFormatError(ValueError):
    """A sysfs file whose content is not what the kernel writes there."""


def parse_state(text: str) -> str:
    """``4: ACTIVE`` → ``active``; ``5: LinkUp`` → ``linkup``; ``7: Phy Test`` → ``phytest``."""
    match = _STATE.match(text)
    if match is None:
        raise SysfsFormatError(f"not '<number>: <name>': {text[:60]!r}")
    return match.group(2).replace(" ", "").lower()


def parse_rate(text: str) -> float:
    """``400 Gb/sec (4X NDR)`` → 400.0; ``2.5 Gb/sec (1X SDR)`` → 2.5."""
    match = _RATE.match(text)
    if match is None:
        raise SysfsFormatError(f"not '<number> Gb/sec ...': {text[:60]!r}")
    return float(match.group(1))


def parse_counter(text: str) -> int:
    """A counter file: one unsigned decimal integer (64-bit at most)."""
    value = text.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 20:
        raise SysfsFormatError(f"not an unsigned integer: {value[:40]!r}")
    number = int(value)
    if number >= 1 << 64:
        raise SysfsFormatError(f"counter beyond 64 bits: {value[:40]!r}")
    return number


def _read(path: Path) -> str:
    data = read_small(path, MAX_FILE_BYTES + 1)  # never blocks: a FIFO here is an error, not a hang
    if len(data) > MAX_FILE_BYTES:
        raise SysfsFormatError(f"larger than {MAX_FILE_BYTES} bytes")
    return data.decode("ascii", "replace").strip()


@dataclass
class PortScan:
    """What one read of the sysfs tree found: the ports, and every problem with a file named."""

    ports: list[PortReading] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    present: bool = False  # class/infiniband exists at all


class PortSource(Protocol):
    """Where readings come from: sysfs on a real host (:class:`SysfsPorts`), the cluster model on a
    simulated one."""

    gpus: dict[str, int]

    def read(self) -> PortScan: ...


def _sorted_names(directory: Path, limit: int) -> list[str]:
    try:
        names = sorted(name for name in os.listdir(directory) if _NAME.match(name))
    except OSError:
        return []
    return names[:limit]


class SysfsPorts:
    """The port source of a real host: ``read()`` reads every port once (blocking file I/O: run it off the
    event loop). ``gpus`` maps a GPU's PCI address (``dddd:bb:dd``, as NVML reports it) to its index; when
    empty, GPUs are found in sysfs itself (NVIDIA display/3D controllers, indexed in PCI order as NVML does).
    """

    def __init__(self, root: str | Path = "/sys", gpus: dict[str, int] | None = None) -> None:
        self.root = Path(root)
        self.gpus = dict(gpus or {})

    def read(self) -> PortScan:
        scan = PortScan()
        base = self.root / "class" / "infiniband"
        if not base.is_dir():
            return scan
        scan.present = True
        topology = PciTopology(self.root, self.gpus)
        devices = _sorted_names(base, MAX_DEVICES + 1)
        if len(devices) > MAX_DEVICES:
            scan.errors.append(f"{base}: more than {MAX_DEVICES} devices, the rest ignored")
            devices = devices[:MAX_DEVICES]
        for device in devices:
            self._device(base / device, device, topology, scan)
        scan.errors.extend(topology.errors)
        return scan

    def _device(self, path: Path, device: str, topology: PciTopology, scan: PortScan) -> None:
        pci = ""
        numa: int | None = None
        try:
            pci = os.path.basename(os.path.realpath(path / "device"))
        except OSError as exc:
            scan.errors.append(f"{path}/device: {exc.strerror or exc}")
        if pci and not topology.is_pci_address(pci):
            pci = ""
        if pci:
            numa = topology.numa_node(pci)
        netdevs = _sorted_names(path / "device" / "net", 32)
        ports_dir = path / "ports"
        for name in _sorted_names(ports_dir, MAX_PORTS):
            if not name.isdigit():
                continue
            port = int(name)
            reading = self._port(ports_dir / name, device, port, scan)
            if reading is None:
                continue
            gpus, locality = topology.gpus_served(pci) if pci else ([], "")
            netdev = self._netdev(ports_dir / name, path, port, netdevs)
            scan.ports.append(
                PortReading(
                    device=device,
                    port=port,
                    state=reading[0],
                    phys_state=reading[1],
                    rate_gbps=reading[2],
                    link_layer=reading[3],
                    counters=reading[4],
                    netdev=netdev,
                    pci_bus=pci,
                    numa_node=numa,
                    gpus=gpus,
                    locality=locality,
                )
            )

    @staticmethod
    def _port(
        path: Path, device: str, port: int, scan: PortScan
    ) -> tuple[str, str, float, str, dict[str, int]] | None:
        def field_(name: str) -> str | None:
            try:
                return _read(path / name)
            except (OSError, SysfsFormatError) as exc:
                scan.errors.append(f"{path / name}: {getattr(exc, 'strerror', None) or exc}")
                return None

        state_text = field_("state")
        if state_text is None:
            return None  # a port without a state is not a port we can judge
        try:
            state = parse_state(state_text)
        except SysfsFormatError as exc:
            scan.errors.append(f"{path / 'state'}: {exc}")
            return None
        phys_state = "unknown"
        phys_text = field_("phys_state")
        if phys_text is not None:
            try:
                phys_state = parse_state(phys_text)
            except SysfsFormatError as exc:
                scan.errors.append(f"{path / 'phys_state'}: {exc}")
        rate = 0.0
        rate_text = field_("rate")
        if rate_text is not None:
            try:
                rate = parse_rate(rate_text)
            except SysfsFormatError as exc:
                scan.errors.append(f"{path / 'rate'}: {exc}")
        link_layer = field_("link_layer") or ""
        link_layer = link_layer[:MAX_NAME] if link_layer.isprintable() else ""
        counters: dict[str, int] = {}
        for folder in ("counters", "hw_counters"):
            directory = path / folder
            names = _sorted_names(directory, MAX_COUNTER_FILES)
            for name in names:
                if len(counters) >= MAX_COUNTER_FILES:
                    scan.errors.append(f"{path}: more than {MAX_COUNTER_FILES} counters, the rest ignored")
                    break
                if name in counters:  # counters/ wins over a hw_counters/ file of the same name
                    continue
                try:
                    counters[name] = parse_counter(_read(directory / name))
                except (OSError, SysfsFormatError) as exc:
                    # some mlx5 counters cannot be read while the port is down (EINVAL): skip, name it
                    scan.errors.append(f"{directory / name}: {getattr(exc, 'strerror', None) or exc}")
        return state, phys_state, rate, link_layer, counters

    @staticmethod
    def _netdev(port_dir: Path, device_dir: Path, port: int, netdevs: list[str]) -> str:
        """The port's netdev: the RoCE GID table's, else the HCA's netdev whose dev_port matches."""
        try:
            name = _read(port_dir / "gid_attrs" / "ndevs" / "0")
            if _NAME.match(name):
                return name
        except (OSError, SysfsFormatError):
            pass
        for netdev in netdevs:
            try:
                dev_port = int(_read(device_dir / "device" / "net" / netdev / "dev_port"))
            except (OSError, ValueError, SysfsFormatError):
                continue
            if dev_port == port - 1:
                return netdev
        return netdevs[0] if len(netdevs) == 1 else ""
