"""``sentinel agent run`` as a process: starts without NVML, notifies systemd, serves /metrics, SIGTERM exits 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_daemon_without_gpus_runs_and_stops_cleanly(tmp_path: Path) -> None:
    port = _free_port()
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    config = tmp_path / "agent.toml"
    config.write_text(
        f"""
[agent]
host = "daemon-test"
state_dir = "{tmp_path / "state"}"
[collect]
tick_s = 0.2
[kmsg]
path = "{kmsg}"
[probe]
socket_path = "{tmp_path / "probe.sock"}"
[metrics]
listen_host = "127.0.0.1"
listen_port = {port}
[stream]
aggregator_url = "ws://127.0.0.1:{_free_port()}/api/v1/stream"
token_file = ""
"""
    )
    notify = tmp_path / "notify.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(notify))
    server.settimeout(20)
    env = {**os.environ, "NOTIFY_SOCKET": str(notify)}
    env.pop("WATCHDOG_USEC", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sentinel", "agent", "run", "--config", str(config)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert server.recv(4096).decode().startswith("READY=1")  # ready although NVML is absent
        with kmsg.open("a") as f:
            f.write(
                "3,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.\n"
            )
        deadline = time.monotonic() + 20
        entries: list[dict[str, Any]] = []  # the snapshot's JSON
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/snapshot", timeout=5) as r:
                entries = json.loads(r.read())["entries"]
            if any(e["type"] == "event" for e in entries):
                break
            time.sleep(0.1)
        events = [e["data"] for e in entries if e["type"] == "event"]
        assert events and events[0]["record"]["xid"] == 79 and events[0]["source"] == "kmsg"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert (
            'sentinel_agent_collector_success{cluster="default",collector="nvml",host="daemon-test"} 0.0'
            in metrics
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.close()
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert "Traceback" not in stderr
    assert list((tmp_path / "state" / "spool").glob("*.batch"))  # nothing was acked: all kept for later
    assert not (tmp_path / "probe.sock").exists()
