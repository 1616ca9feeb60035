"""sd_notify on a real NOTIFY_SOCKET: READY, WATCHDOG from the loop, STATUS, STOPPING."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

from sentinel.agent import Agent
from sentinel.systemd import SystemdNotifier
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource


def _receive_all(sock: socket.socket) -> list[str]:
    out: list[str] = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_notifier_abstract_and_path_addresses(tmp_path: Path) -> None:
    name = f"sentinel-test-{os.getpid()}-{time.monotonic_ns()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind("\0" + name)
    server.setblocking(False)
    notifier = SystemdNotifier(env={"NOTIFY_SOCKET": "@" + name})
    assert notifier.ready("starting") and notifier.status("ok")
    assert _receive_all(server) == ["READY=1\nSTATUS=starting", "STATUS=ok"]
    notifier.close()
    server.close()
    assert not SystemdNotifier(env={}).ready()
    broken = SystemdNotifier(env={"NOTIFY_SOCKET": str(tmp_path / "absent.sock")})
    assert not broken.ready() and broken.errors == 1  # counted, never raised


async def test_agent_notifies_ready_watchdog_and_stopping(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.setblocking(False)
    env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())}
    notifier = SystemdNotifier(env=env)
    assert notifier.watchdog_s == 0.2
    agent = Agent(make_config(tmp_path, collect={"tick_s": 0.05}), FakeSource(gpus=2), notifier=notifier)
    task = asyncio.create_task(agent.run())
    received: list[str] = []
    deadline = time.monotonic() + 10
    while sum(m == "WATCHDOG=1" for m in received) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        received += _receive_all(server)
    agent.request_stop()
    await asyncio.wait_for(task, 10)
    received += _receive_all(server)
    server.close()
    assert received[0].startswith("READY=1\nSTATUS=2 GPUs (0 not ok)")
    assert received.count("WATCHDOG=1") >= 3
    assert received[-1] == "STOPPING=1"
    assert not SystemdNotifier(env={**env, "WATCHDOG_PID": "1"}).watchdog_s  # meant for another process
