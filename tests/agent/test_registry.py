"""The collector registry and ``collect.disabled``: any collector can be switched off from the configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel.agent import Agent
from sentinel.agent.registry import BUILDERS, COLLECTORS
from sentinel.components import registry
from sentinel.config import ConfigError, load_agent_config
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource
from tests.support import sent


def test_the_agent_builds_exactly_the_registry_collectors() -> None:
    assert [e.name for e in COLLECTORS] == list(registry.COLLECTORS)
    assert set(BUILDERS) == set(registry.COLLECTORS)  # no builder the registry does not name


async def test_disabled_collectors_are_neither_built_nor_run(tmp_path: Path) -> None:
    on = Agent(make_config(tmp_path / "on", logs={"globs": [str(tmp_path / "*.log")]}), FakeSource(gpus=2))
    assert {"nvml", "xid", "logs", "jobs"} <= {c.name for c in on.collectors.items}
    await on.shutdown()
    config = make_config(
        tmp_path / "off", collect={"disabled": ["logs", "xid"]}, logs={"globs": [str(tmp_path / "*.log")]}
    )
    agent = Agent(config, FakeSource(gpus=2))
    names = {c.name for c in agent.collectors.items}
    assert "logs" not in names and "xid" not in names and "nvml" in names
    batch = sent(await agent.step(1.0))
    assert len(batch.samples) == 2  # the others run as before
    assert "logs" not in agent.counters.collector_success
    await agent.shutdown()


async def test_without_nvml_the_agent_still_runs_and_health_says_why_it_cannot_tell(tmp_path: Path) -> None:
    agent = Agent(make_config(tmp_path, collect={"disabled": ["nvml"]}), FakeSource(gpus=2))
    assert agent.gpu_collector is None
    assert {c.name for c in agent.collectors.items}.isdisjoint({"nvml", "xid"})  # Xids need NVML's GPUs
    batch = sent(await agent.step(1.0))
    assert batch.samples == []
    report = agent.health_report()
    assert report["fit"] is None and "nvml collector is disabled" in str(report)
    await agent.shutdown()


def test_an_unknown_collector_name_is_a_one_line_config_error(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('[collect]\ndisabled = ["ib", "infiniband"]\n')
    with pytest.raises(ConfigError) as info:
        load_agent_config(path)
    known = ", ".join(registry.COLLECTORS)
    assert str(info.value) == f"{path}: collect.disabled[1]: 'infiniband' is not a collector (one of {known})"
