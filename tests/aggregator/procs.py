"""A real ``sentinel aggregator run`` process on 127.0.0.1 (port 0), for restart, crash and HA tests."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.aggregator.helpers import TOKEN


class AggregatorProcess:
    """One aggregator daemon with its own config and state directory; its log goes to ``log_path``."""

    def __init__(self, workdir: Path, name: str = "aggregator", extra_toml: str = "") -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.state_dir = workdir / "state"
        tokens = workdir / "tokens"
        tokens.write_text(f"{TOKEN}\n")
        self.config = workdir / f"{name}.toml"
        self.config.write_text(
            f'[server]\nlisten_port = 0\ntokens_file = "{tokens}"\nstate_dir = "{self.state_dir}"\n'
            f"[fleet]\ntick_s = 0.2\ncluster = {json.dumps(name)}\n{extra_toml}"
        )
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.starts = 0

    def start(self, timeout: float = 60.0) -> None:
        self.starts += 1
        log = self.log_path.open("ab")
        offset = self.log_path.stat().st_size
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sentinel", "aggregator", "run", "--config", str(self.config)],
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            with self.log_path.open("rb") as handle:
                handle.seek(offset)
                for line in handle.read().decode(errors="replace").splitlines():
                    if '"aggregator_listening"' in line:
                        record = json.loads(line)
                        self.port = int(record["addresses"][0].rsplit(":", 1)[1])
                        return
            time.sleep(0.05)
        raise AssertionError(f"aggregator did not listen within {timeout}s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stream_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/api/v1/stream"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return json.loads(response.read())

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=20)
        self.proc = None

    def stop(self) -> int:
        """SIGTERM, as systemctl stop/restart sends it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self.proc = None
        return code

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def free_port() -> int:
    """A port nothing listens on right now (for an aggregator that is down)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
