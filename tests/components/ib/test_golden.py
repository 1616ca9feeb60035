"""``sentinel agent once --json --sysfs-root DIR`` end to end, against checked-in expected output.

node_exporter style: the fixture tree is read through the real CLI (the fake NVML at the library boundary
provides the GPUs, numbered as NVML numbers them), and the ``ib_ports`` / ``errors`` part of the output must
equal ``golden/<tree>.json``. After a deliberate change, regenerate with::

    SENTINEL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/components/ib/test_golden.py

and review the diff like code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sentinel.cli import main
from tests.agent.fakenvml import FakeGpu, FakeNvml
from tests.components.ib.conftest import TREES, SysfsTree

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("SENTINEL_UPDATE_GOLDEN", "") == "1"


def _once(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["agent", "once", "--json", "--sysfs-root", str(root)])
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return code, out


def _check(name: str, document: dict[str, object]) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with SENTINEL_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"output differs from {path} (SENTINEL_UPDATE_GOLDEN=1 to accept)"


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    buses = ["00000000:18:00.0", "00000000:1A:00.0", "00000000:3A:00.0", "00000000:5D:00.0"]
    fake = FakeNvml([FakeGpu(index=i, bus_id=bus) for i, bus in enumerate(buses)])
    fake.install(monkeypatch)
    return fake


def test_dgx_like_tree_matches_golden(four_gpus: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _once(TREES / "dgx_like", capsys)
    assert code == 0
    assert len(out["inventory"]) == 4
    _check("dgx_like", {"ib_ports": out["ib_ports"], "errors": out["errors"]})


def test_contract_fields_and_formats(four_gpus: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    _, out = _once(TREES / "dgx_like", capsys)
    ports = out["ib_ports"]
    assert isinstance(ports, list) and ports
    for port in ports:
        assert list(port)[:8] == [
            "device", "port", "state", "phys_state", "rate_gbps", "link_layer", "counters", "gpus"
        ]  # fmt: skip
        assert isinstance(port["port"], int) and isinstance(port["rate_gbps"], float)
        assert port["state"] in ("active", "down", "init", "armed")
        assert all(isinstance(v, int) for v in port["counters"].values())


def test_changed_tree_and_damaged_files(
    dgx: SysfsTree, four_gpus: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    dgx.link_down("mlx5_0")
    dgx.set("mlx5_1", "rate", "200 Gb/sec (2X NDR)")
    dgx.set("mlx5_2", "counters/port_rcv_errors", "garbage")
    code, out = _once(dgx.root, capsys)
    assert code == 0
    by = {p["device"]: p for p in out["ib_ports"]}
    assert (by["mlx5_0"]["state"], by["mlx5_0"]["phys_state"]) == ("down", "disabled")
    assert by["mlx5_0"]["counters"]["link_downed"] == 2
    assert by["mlx5_1"]["rate_gbps"] == 200.0
    assert "port_rcv_errors" not in by["mlx5_2"]["counters"]
    assert [e for e in out["errors"] if "port_rcv_errors" in e]


def test_no_source_readable_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _once(tmp_path, capsys)  # no NVML library here (nor in CI), no class/infiniband
    if any(e.startswith("nvml: cannot initialise") for e in out["errors"]):
        assert code == 2
        assert any("class/infiniband: not found" in e for e in out["errors"])
    else:
        assert code == 0  # a host with a real GPU driver
