"""Shared fixtures of the agent tests: configs in tmp dirs, a fake NVML, a simple fake GPU source."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from sentinel.config.agent import AgentConfig
from tests.agent.fakenvml import FakeGpu, FakeNvml


def make_config(tmp_path: Path, **sections: dict[str, object]) -> AgentConfig:
    """An agent config confined to tmp_path: no /dev/kmsg, no /run socket, no metrics port, no stream."""
    data: dict[str, dict[str, object]] = {
        "agent": {"host": "host-test", "state_dir": str(tmp_path / "state")},
        "collect": {"tick_s": 0.1, "slow_tick_s": 0.1, "nvml_timeout_s": 0.5, "procs_interval_s": 0.1},
        "kmsg": {"enabled": False},
        "probe": {"socket_path": ""},
        "metrics": {"listen_host": ""},
        "stream": {"enabled": False},
        "systemd": {"notify": False},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return msgspec.convert(data, AgentConfig)


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    fake = FakeNvml([FakeGpu(index=0), FakeGpu(index=1)])
    fake.install(monkeypatch)
    yield fake
    for gpu in fake.gpus:  # never leave a worker thread blocked in the fake
        if gpu.hang is not None:
            gpu.hang.set()
