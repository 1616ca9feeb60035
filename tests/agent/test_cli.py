"""``sentinel agent``: once (fake NVML), snapshot from a running agent, one-line errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sentinel.agent import Agent
from sentinel.cli import main
from tests.agent.conftest import make_config
from tests.agent.fakenvml import FakeNvml
from tests.agent.fakes import FakeSource


def test_once_prints_inventory_and_samples(fake_nvml: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    fake_nvml.gpus[0].unsupported = {"nvmlDeviceGetSerial"}
    assert main(["agent", "once", "--config", "/nonexistent/agent.toml"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["agent", "once"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [g["uuid"] for g in out["inventory"]] == [g.uuid for g in fake_nvml.gpus]
    assert out["samples"][1]["temp_c"] == 64.0
    assert "0:serial" in out["unsupported"]


async def test_snapshot_command_talks_to_running_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(tmp_path, metrics={"listen_host": "127.0.0.1", "listen_port": 0})
    agent = Agent(config, FakeSource(gpus=2))
    await agent.start()
    await agent.step()
    try:
        code = await asyncio.to_thread(
            main, ["agent", "snapshot", "--url", f"http://127.0.0.1:{agent.http_port}"]
        )
    finally:
        await agent.shutdown()
    assert code == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # structlog, unconfigured, uses stdout
    assert doc["host"] == "host-test"
    assert sorted({e["data"]["gpu"] for e in doc["entries"] if e["type"] == "sample"}) == [0, 1]


def test_snapshot_without_agent_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "snapshot", "--url", "http://127.0.0.1:9", "--timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("error: http://127.0.0.1:9/api/v1/snapshot: agent not reachable")
        and err.count("\n") == 1
    )


def test_bad_config_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "agent.toml"
    bad.write_text("[collect]\ntick_s = 0\n")
    assert main(["agent", "run", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "collect.tick_s" in err and err.count("\n") == 1


def test_run_simulate_refuses_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text("[cluster]\nhosts = 2\ngpus_per_host = 2\n")
    assert main(["agent", "run", "--simulate", str(scenario)]) == 2
    assert capsys.readouterr().err == "error: --simulate needs --host NAME (a host of the scenario)\n"
    assert main(["agent", "run", "--simulate", str(scenario), "--host", "host-009"]) == 2
    assert (
        capsys.readouterr().err
        == f"error: --host: 'host-009' is not a host of {scenario} (host-000, host-001)\n"
    )
    (tmp_path / "bad.toml").write_text("[cluster]\nhosts = -1\n")
    assert main(["agent", "run", "--simulate", str(tmp_path / "bad.toml"), "--host", "host-000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'bad.toml'}") and err.count("\n") == 1
