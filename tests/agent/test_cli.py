"""``sentinel agent``: once (fake NVML), snapshot from a running agent, one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from sentinel.agent import Agent
from sentinel.cli import main
from sentinel.wire import XidOccurred
from tests.agent.conftest import make_config
from tests.agent.fakenvml import FakeNvml
from tests.agent.fakes import FakeSource
from tests.components.ib.conftest import TREES


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


SIM_SCENARIO = """
seed = 2
duration_s = 600
[cluster]
hosts = 2
gpus_per_host = 4
[[jobs]]
id = "staging"
[[faults]]
at_s = 1.0
host = "host-001"
gpu = 1
kind = "xid"
xid = 79
"""


async def test_run_simulate_runs_the_real_agent_as_a_daemon_against_an_aggregator(tmp_path: Path) -> None:
    """``sentinel agent run --simulate SCENARIO --host NAME`` (contract section 8): the real agent, as its own
    process, on one simulated host, streaming to an aggregator; its collectors map the ranks from the
    simulated process table, fill the probe's heads with their GPU and merge the Xid from NVML and kmsg."""
    import signal
    import subprocess
    import sys

    from tests.agent.test_stream import TOKEN, FakeAggregator, wait_for

    aggregator = FakeAggregator()
    port = await aggregator.start()
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "scenario.toml").write_text(SIM_SCENARIO)
    (tmp_path / "agent.toml").write_text(
        f"""
[agent]
state_dir = "{tmp_path / "state"}"
[collect]
tick_s = 0.2
xid_merge_wait_s = 0.5
procs_interval_s = 0.2
[metrics]
listen_host = ""
[systemd]
notify = false
[stream]
aggregator_url = "ws://127.0.0.1:{port}/api/v1/stream"
token_file = "{tmp_path / "token"}"
backoff_initial_s = 0.05
"""
    )
    command = [sys.executable, "-m", "sentinel", "agent", "run", "--config", str(tmp_path / "agent.toml")]
    daemon = subprocess.Popen(
        [*command, "--simulate", str(tmp_path / "scenario.toml"), "--host", "host-001"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def events() -> list[tuple[str, int | None, str]]:
            return [(e.kind, e.gpu, e.source) for b in aggregator.batches for e in b.events]

        await wait_for(lambda: ("xid", 1, "kmsg") in events() or ("xid", 1, "nvml") in events(), 30.0)
        await wait_for(lambda: any(b.heads for b in aggregator.batches), 10.0)
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.to_thread(daemon.communicate, timeout=20)
        await aggregator.stop()
    assert daemon.returncode == 0, stderr.decode()[-2000:]
    assert {h.host for h in aggregator.hellos} == {"host-001"} and len(aggregator.hellos[-1].gpus) == 4
    procs = next(b.procs for b in aggregator.batches if b.procs)
    assert procs is not None
    assert sorted((p.gpu, p.job_id, p.rank) for p in procs) == [(g, "staging", 4 + g) for g in range(4)]
    heads = next(b.heads for b in aggregator.batches if b.heads)
    assert sorted((h.host, h.gpu, h.rank) for h in heads) == [("host-001", g, 4 + g) for g in range(4)]
    xid = next(e for b in aggregator.batches for e in b.events if isinstance(e, XidOccurred))
    assert xid.record.xid == 79 and xid.merged is True and xid.text.startswith("NVRM: Xid")


@pytest.mark.timeout(60)
def test_once_with_a_fifo_in_the_sysfs_tree_names_it_and_does_not_hang(
    fake_nvml: FakeNvml, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO where a counter file belongs used to block ``agent once`` for ever (the daemon has a deadline,
    the one-shot command had none): now it is an error naming the file, and the rest is read."""
    root = tmp_path / "sys"
    shutil.copytree(TREES / "dgx_like", root, symlinks=True)
    counters = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    (counters / "port_rcv_data").unlink()
    os.mkfifo(counters / "port_rcv_data")
    assert main(["agent", "once", "--sysfs-root", str(root)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("port_rcv_data" in e and "not a regular file" in e for e in out["errors"])
    mlx5_0 = next(p for p in out["ib_ports"] if p["device"] == "mlx5_0")
    assert "port_rcv_data" not in mlx5_0["counters"] and mlx5_0["counters"]
