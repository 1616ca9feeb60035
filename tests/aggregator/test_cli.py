"""``sentinel aggregator run`` as systemd runs it: READY/WATCHDOG on a real NOTIFY_SOCKET, clean SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.aggregator.helpers import TOKEN


def test_aggregator_run_notifies_systemd_serves_and_stops_cleanly(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# agents\n{TOKEN}\n")
    config = tmp_path / "aggregator.toml"
    config.write_text(
        f'[server]\nlisten_port = 0\ntokens_file = "{tokens}"\nstate_dir = "{tmp_path / "state"}"\n'
        "[fleet]\ntick_s = 0.2\n"
    )
    notify_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.settimeout(0.5)
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "1000000"}
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "aggregator", "run", "--config", str(config)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        messages: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            any("READY=1" in m for m in messages) and sum("WATCHDOG=1" in m for m in messages) >= 2
        ):
            try:
                messages.append(sock.recv(4096).decode())
            except TimeoutError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert any("READY=1" in m for m in messages), messages
        assert sum("WATCHDOG=1" in m for m in messages) >= 2, messages
        # the listening address is in the structured log
        assert proc.stderr is not None
        port = None
        while port is None:
            line = proc.stderr.readline()
            assert line, "no listening line"
            record = json.loads(line)
            if record.get("event") == "aggregator_listening":
                port = int(record["addresses"][0].rsplit(":", 1)[1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
            assert json.loads(response.read())["status"] == "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as response:
            page = response.read().decode()
            assert response.headers["Content-Type"].startswith("text/html")
            assert "/api/v1/verdicts" in page or "/ui/" in page  # the status page, wired into the daemon
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        tail = []
        with_timeout = time.monotonic() + 2
        while time.monotonic() < with_timeout:
            try:
                tail.append(sock.recv(4096).decode())
            except TimeoutError:
                break
        assert any("STOPPING=1" in m for m in tail), tail
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()


def test_aggregator_run_refuses_bad_config_missing_tokens_and_a_foreign_state_db_in_one_line(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[detect.stuck]\nmin_wait_s = -1\n")
    missing = tmp_path / "missing.toml"
    missing.write_text(f'[server]\nlisten_port = 0\ntokens_file = "{tmp_path / "nope"}"\n')
    # a state database with a table named records of another schema: not touched, named, not a traceback
    state = tmp_path / "state"
    state.mkdir()
    with sqlite3.connect(state / "state.sqlite3") as db:
        db.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, payload TEXT)")
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} h*\n")
    foreign = tmp_path / "foreign.toml"
    foreign.write_text(f'[server]\nlisten_port = 0\ntokens_file = "{tokens}"\nstate_dir = "{state}"\n')
    foreign_line = f"{state / 'state.sqlite3'}: table 'records' has columns (id, payload)"
    for path, expect in (
        (bad, "detect.stuck.min_wait_s"),
        (missing, "cannot read"),
        (foreign, foreign_line),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "sentinel", "aggregator", "run", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2
        assert expect in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
