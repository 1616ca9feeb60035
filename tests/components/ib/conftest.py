"""Fixture sysfs trees copied into a temporary folder, so a test can change files between ticks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support import REPO

TREES = REPO / "tests" / "data" / "sysfs"


class SysfsTree:
    """A copy of a fixture tree; ``set`` rewrites one port file as the kernel would."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def port(self, device: str, port: int = 1) -> Path:
        return self.root / "class" / "infiniband" / device / "ports" / str(port)

    def set(self, device: str, name: str, value: str | int, port: int = 1) -> None:
        (self.port(device, port) / name).write_text(f"{value}\n")

    def counter(self, device: str, name: str, port: int = 1) -> int:
        return int((self.port(device, port) / "counters" / name).read_text())

    def add(self, device: str, name: str, delta: int, port: int = 1) -> None:
        self.set(device, f"counters/{name}", self.counter(device, name, port) + delta, port)

    def link_down(self, device: str, port: int = 1) -> None:
        self.set(device, "state", "1: DOWN", port)
        self.set(device, "phys_state", "3: Disabled", port)
        self.add(device, "link_downed", 1, port)

    def link_up(self, device: str, port: int = 1) -> None:
        self.set(device, "state", "4: ACTIVE", port)
        self.set(device, "phys_state", "5: LinkUp", port)


@pytest.fixture
def dgx(tmp_path: Path) -> SysfsTree:
    root = tmp_path / "sys"
    shutil.copytree(TREES / "dgx_like", root, symlinks=True)
    return SysfsTree(root)
