"""NVML that never blinds a host: per-GPU open, re-initialisation with backoff, host-level health, /healthz.

Through the fake NVML at the library boundary (tests/agent/fakenvml.py), so pynvml's own error mapping runs.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from sentinel.agent.agent import Agent
from sentinel.agent.nvml import NvmlSource
from tests.agent.conftest import make_config
from tests.agent.fakenvml import FakeNvml
from tests.support import sent

UNKNOWN = 999
DRIVER_NOT_LOADED = 9
UNINITIALIZED = 1


def _state_dir(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return state


async def test_one_gpu_failing_at_open_is_reported_and_the_others_are_monitored(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    _state_dir(tmp_path)
    fake_nvml.gpus[1].handle_error = UNKNOWN
    agent = Agent(make_config(tmp_path), NvmlSource())
    batch = sent(await agent.step(1.0))
    states = {s.gpu: s.state for s in batch.samples}
    assert states == {0: "ok", 1: "unavailable"}
    [event] = [e for e in batch.events if getattr(e, "state", None) == "unavailable"]
    assert event.gpu == 1 and "Unknown Error" in event.text
    assert batch.gpu_source is not None
    assert (batch.gpu_source.ok, batch.gpu_source.found, batch.gpu_source.expected) == (True, 1, 2)
    assert agent.counters.collector_success["nvml"] is True
    assert "sentinel_gpu_state{" in agent.render_metrics().decode()
    await agent.shutdown()


async def test_nvml_gone_then_back_with_backoff_and_healthz_503_meanwhile(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    _state_dir(tmp_path)
    fake_nvml.init_error = DRIVER_NOT_LOADED
    config = make_config(tmp_path, metrics={"listen_host": "127.0.0.1", "listen_port": 0})
    agent = Agent(config, NvmlSource())
    await agent.start()
    batch = sent(await agent.step(1.0))
    assert batch.gpu_source is not None and not batch.gpu_source.ok
    assert "Driver Not Loaded" in batch.gpu_source.error
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{agent.http_port}/healthz") as resp:
            assert resp.status == 503
            assert "Driver Not Loaded" in (await resp.json())["gpu_source_error"]
        inits = fake_nvml.inits
        await agent.step(1.05)  # within the backoff: not asked again
        assert fake_nvml.inits == inits
        fake_nvml.init_error = 0  # the driver is loaded again
        batch = sent(await agent.step(1.0 + 0.2))  # slow_tick_s 0.1 doubled once: 0.2 s
        assert batch.gpu_source is not None and batch.gpu_source.ok and batch.gpu_source.found == 2
        assert {s.gpu for s in batch.samples if s.state == "ok"} == {0, 1}
        async with session.get(f"http://127.0.0.1:{agent.http_port}/healthz") as resp:
            assert resp.status == 200
    await agent.shutdown()


async def test_driver_reload_reinitialises_nvml_and_a_lost_gpu_back_is_a_reset(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    _state_dir(tmp_path)
    agent = Agent(make_config(tmp_path), NvmlSource())
    await agent.step(1.0)
    fake_nvml.gpus[1].lost = True
    await agent.step(2.0)
    fake_nvml.down = UNINITIALIZED  # the driver was reloaded under us (a GPU reset, an upgrade)
    batch = sent(await agent.step(3.0))
    assert agent.counters.collector_success["nvml"] is False
    assert batch.gpu_source is not None and not batch.gpu_source.ok
    fake_nvml.gpus[1].lost = False
    batch = sent(await agent.step(3.2))  # re-opened after the backoff; nvmlInit clears `down`
    assert fake_nvml.inits == 2
    assert [(e.kind, e.gpu) for e in batch.events if e.kind == "gpu_reset"] == [("gpu_reset", 1)]
    assert agent.counters.collector_success["nvml"] is True
    await agent.shutdown()


async def test_expected_gpu_count_is_learned_once_and_kept(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    state = _state_dir(tmp_path)
    agent = Agent(make_config(tmp_path), NvmlSource())
    await agent.step(1.0)
    await agent.shutdown()
    assert (state / "gpus.expected").read_text().strip() == "2"
    fake_nvml.gpus.pop()  # a GPU fell off between boots: NVML now lists one
    again = Agent(make_config(tmp_path), NvmlSource())
    batch = sent(await again.step(1.0))
    assert batch.gpu_source is not None and (batch.gpu_source.found, batch.gpu_source.expected) == (1, 2)
    await again.shutdown()
