"""PCI topology: which GPUs an HCA serves — the ones behind the same PCIe switch, else the same NUMA node.

NCCL picks, for each GPU, the NIC closest to it in the PCI tree (``nvidia-smi topo -m``: PIX/PXB beat
PHB, which beats NODE/SYS), so a port's health matters to exactly those GPUs' ranks. The tree is read from
sysfs: ``bus/pci/devices/<addr>`` links into ``devices/pci<domain>:<bus>/<root port>/<switch ports>/...``;
two devices whose paths share the host bridge, the root port and at least one more bridge sit behind the
same PCIe switch. Without a shared switch, the NUMA node (``bus/pci/devices/<addr>/numa_node``) is the next
best tie, and is labelled as such.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sentinel.components.ib.files import read_small

_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
NVIDIA_VENDOR = "0x10de"
#: PCI class codes of GPUs: 3D controller (0x0302, data-center parts) and VGA controller (0x0300)
GPU_CLASSES = ("0x0302", "0x0300")
MAX_PCI_DEVICES = 4096
#: host bridge + root port + one more bridge in common: the same PCIe switch
SWITCH_DEPTH = 3


class PciTopology:
    """The PCI tree under ``root``; ``gpus`` (``dddd:bb:dd`` → index) as NVML numbers them, else found here."""

    def __init__(self, root: Path, gpus: dict[str, int] | None = None) -> None:
        self.root = root
        self.devices = root / "bus" / "pci" / "devices"
        self.errors: list[str] = []
        self._paths: dict[str, tuple[str, ...] | None] = {}
        self._gpus = self._find_gpus(gpus or {})

    @staticmethod
    def is_pci_address(text: str) -> bool:
        return _PCI.match(text) is not None

    def _find_gpus(self, known: dict[str, int]) -> list[tuple[str, int]]:
        try:
            names = sorted(n for n in os.listdir(self.devices) if _PCI.match(n))[:MAX_PCI_DEVICES]
        except OSError:
            return []
        if known:
            out = []
            for name in names:
                index = known.get(name[:-2])  # NVML's dddd:bb:dd is the device; GPUs are function 0
                if index is not None and name.endswith(".0"):
                    out.append((name, index))
            return out
        found = [name for name in names if self._is_gpu(name)]
        return [(name, index) for index, name in enumerate(found)]

    def _is_gpu(self, name: str) -> bool:
        try:
            vendor = read_small(self.devices / name / "vendor", 16).decode("ascii", "replace").strip()
            klass = read_small(self.devices / name / "class", 16).decode("ascii", "replace").strip()
        except OSError:
            return False
        return vendor == NVIDIA_VENDOR and klass.startswith(GPU_CLASSES)

    def path(self, address: str) -> tuple[str, ...] | None:
        """The device's chain from the host bridge down (``pci0000:15``, root port, switch ports, itself)."""
        if address in self._paths:
            return self._paths[address]
        chain: tuple[str, ...] | None = None
        try:
            real = os.path.realpath(self.devices / address)
            base = os.path.realpath(self.root / "devices")
            if real.startswith(base + os.sep):
                parts = tuple(real[len(base) + 1 :].split(os.sep))
                if parts and parts[0].startswith("pci") and parts[-1] == address:
                    chain = parts
        except OSError as exc:
            self.errors.append(f"{self.devices / address}: {exc.strerror or exc}")
        self._paths[address] = chain
        return chain

    def numa_node(self, address: str) -> int | None:
        try:
            text = read_small(self.devices / address / "numa_node", 16).decode("ascii", "replace").strip()
            node = int(text)
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

    def gpus_served(self, nic: str) -> tuple[list[int], str]:
        """GPU indices sharing a PCIe switch with ``nic`` (``pcie_switch``), else its NUMA node (``numa``)."""
        mine = self.path(nic)
        if mine is not None:
            near = []
            for address, index in self._gpus:
                theirs = self.path(address)
                if theirs is not None and _common(mine, theirs) >= SWITCH_DEPTH:
                    near.append(index)
            if near:
                return sorted(near), "pcie_switch"
        node = self.numa_node(nic)
        if node is not None:
            same = sorted(index for address, index in self._gpus if self.numa_node(address) == node)
            if same:
                return same, "numa"
        return [], ""


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a[:-1], b[:-1], strict=False):  # the devices themselves differ
        if x != y:
            break
        n += 1
    return n
