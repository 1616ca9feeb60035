"""scripts/gpu-check's comparison: sentinel's `agent once --json` (on the fake NVML) vs an nvidia-smi -q -x
document of the same two GPUs. Not run on a real GPU here: no GPU in CI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sentinel.cli import main
from sentinel.components.device.smi_check import compare, render
from tests.agent.fakenvml import FakeNvml

XML = (Path(__file__).parent / "data" / "nvidia_smi_q.xml").read_text()


def _once(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    main(["agent", "once", "--json", "--sysfs-root", "/nonexistent"])
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_same_host_same_values(fake_nvml: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    rows = compare(_once(capsys), XML)  # type: ignore[arg-type]
    fields = {r.field for r in rows}
    assert {"uuid", "pci_bus", "vbios", "driver", "pcie_width", "temp_c", "mem_temp_c", "power_w"} <= fields
    assert [r for r in rows if r.differs] == []
    assert "0 differ" in render(rows)


def test_a_wrong_reading_is_flagged(fake_nvml: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    fake_nvml.gpus[1].vbios = "96.00.74.00.01"
    fake_nvml.gpus[1].pcie_width = (8, 16)
    fake_nvml.gpus[0].power_mw = 300_000
    rows = compare(_once(capsys), XML)  # type: ignore[arg-type]
    flagged = {(r.gpu, r.field) for r in rows if r.differs}
    assert flagged == {(1, "vbios"), (1, "pcie_width"), (0, "power_w")}
    assert "DIFFERS" in render(rows)
