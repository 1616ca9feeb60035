"""The rowremap signal's NVML read through the fake library, to its metric families."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel.agent import Agent
from sentinel.agent.nvml import NvmlSource
from tests.agent.conftest import make_config
from tests.agent.fakenvml import FakeGpu, FakeNvml
from tests.support import sent


async def test_row_remap_states_reach_metrics(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu(index=0, remap=(0, 2, 1, 0)), FakeGpu(index=1, remap=(0, 9, 0, 1))])
    fake.install(monkeypatch)
    agent = Agent(make_config(tmp_path, collect={"nvml_events": False}), NvmlSource())
    batch = sent(await agent.step(1.0))
    remaps = {s.gpu: s.remap for s in batch.samples}
    assert remaps[0] is not None and remaps[0].pending and not remaps[0].failure
    assert remaps[1] is not None and remaps[1].failure and not remaps[1].pending
    text = agent.render_metrics().decode()

    def value(name: str, gpu: int) -> str:
        line = next(x for x in text.splitlines() if x.startswith(name + "{") and f'gpu="{gpu}"' in x)
        return line.rsplit(" ", 1)[1]

    assert value("sentinel_gpu_row_remap_pending", 0) == "1.0"
    assert value("sentinel_gpu_row_remap_pending", 1) == "0.0"
    assert value("sentinel_gpu_row_remap_failure", 1) == "1.0"
    await agent.shutdown()
