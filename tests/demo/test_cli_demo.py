"""``sentinel demo`` as a user runs it: options, bad input, and Ctrl-C in the middle of a run."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import REPO

SHORT = Path(__file__).parent / "data" / "short.toml"
SENTINEL = [sys.executable, "-m", "sentinel"]


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SENTINEL, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_help_describes_every_option() -> None:
    result = run("demo", "--help")
    assert result.returncode == 0
    for option in ("--scenario", "--hosts", "--duration", "--port", "--view", "--state-dir", "--no-color"):
        assert option in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "/nonexistent/x.toml"], r"/nonexistent/x.toml: cannot read"),
        (["--hosts", "1"], r"--hosts: 1 hosts are too few"),
        (["--hosts", "0"], r"argument --hosts: must be at least 1"),
        (["--duration", "-5"], r"argument --duration"),
        (["--port", "70000"], r"argument --port: port must be 0..65535"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = run("demo", *args)
    assert result.returncode == 2
    assert re.search(message, result.stderr), result.stderr
    assert "Traceback" not in result.stderr


def test_bad_scenario_field_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "s.toml"
    bad.write_text(
        "[cluster]\nhosts = 2\n[[faults]]\nat_s = 1\nhost = 'host-000'\nkind = 'meltdown'\ngpu = 0\n"
    )
    result = run("demo", "--scenario", str(bad))
    assert result.returncode == 2
    assert f"{bad}: faults[0].kind" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_port_in_use_is_one_line_and_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("demo", "--scenario", str(SHORT), "--port", str(port), "--view", "plain")
    assert result.returncode == 2
    assert f"aggregator cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_ctrl_c_stops_everything_cleanly_and_still_summarises() -> None:
    proc = subprocess.Popen(
        [*SENTINEL, "demo", "--scenario", str(SHORT), "--view", "live", "--no-color", "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "120", "LINES": "40"},
    )
    try:
        assert proc.stdout is not None
        buffered = b""
        deadline = time.monotonic() + 30
        # wait until the view shows the first injected fault being waited for or caught
        while b"t+3 " not in buffered or (b"caught" not in buffered and b"waiting" not in buffered):
            assert time.monotonic() < deadline, buffered[-2000:]
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, "demo exited early"
            buffered += chunk
        url = re.search(rb"status page (http://127\.0\.0\.1:(\d+)/)", buffered)
        assert url is not None
        port = int(url.group(2))
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = (buffered + rest).decode()
    assert proc.returncode in (0, 1), err.decode()
    assert "Traceback" not in err.decode() and "Task was destroyed" not in err.decode(), err.decode()
    assert "\x1b[H" in out and out.count("\x1b[?25l") == out.count("\x1b[?25h") == 1  # cursor given back
    assert "sentinel demo interrupted after" in out
    assert "t+3s thermal_throttle 1050 MHz" in out  # the summary lists what was injected
    assert "not injected (the demo ended first)" in out
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # the aggregator's listener is closed


def test_the_demo_aggregator_admits_every_simulated_agent_from_one_address(tmp_path: Path) -> None:
    """All simulated agents connect from 127.0.0.1: the per-peer stream and TCP limits must not refuse the
    largest scenario's agents (plus the status page)."""
    from sentinel.demo.hooks import aggregator_config
    from sentinel.sim.scenario import MAX_HOSTS

    limits = aggregator_config(tmp_path, 1.0).limits
    assert limits.max_streams_per_peer >= MAX_HOSTS
    assert limits.max_connections_per_peer > limits.max_streams_per_peer
