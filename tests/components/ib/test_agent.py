"""The real agent with the ib collector on a fixture sysfs tree: ports in the batch, metrics, restarts."""

from __future__ import annotations

from pathlib import Path

from sentinel.agent import Agent
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource
from tests.components.ib.conftest import SysfsTree
from tests.support import sent


def _agent(tmp_path: Path, tree: SysfsTree) -> Agent:
    (tmp_path / "state").mkdir(exist_ok=True)
    config = make_config(tmp_path, ib={"sysfs_root": str(tree.root), "interval_s": 0.1})
    return Agent(config, FakeSource(gpus=2))


async def test_ports_ship_with_nvml_numbering_and_metrics(tmp_path: Path, dgx: SysfsTree) -> None:
    agent = _agent(tmp_path, dgx)
    try:
        batch = sent(await agent.step(100.0))
        assert batch.ports is not None
        by = {p.device: p for p in batch.ports}
        assert by["mlx5_0"].gpus == [0]  # FakeSource's GPU 0 is at 0000:18:00, behind mlx5_0's switch
        assert by["mlx5_1"].gpus == []  # no NVML GPU behind it, and no NUMA match either
        dgx.add("mlx5_0", "symbol_error", 4)
        batch = sent(await agent.step(102.0))
        assert batch.ports is not None
        assert {p.device: p for p in batch.ports}["mlx5_0"].rates["symbol_error"] == 2.0
        text = agent.render_metrics().decode()
        assert 'sentinel_ib_port_up{cluster="default",device="mlx5_0",host="host-test",port="1"} 1.0' in text
        assert 'sentinel_ib_port_up{cluster="default",device="mlx5_3",host="host-test",port="1"} 0.0' in text
        assert (
            'sentinel_ib_port_errors_total{cluster="default",counter="symbol_error",device="mlx5_0",'
            'host="host-test",port="1"} 4.0'
        ) in text
        assert (
            'sentinel_agent_collector_success{cluster="default",collector="ib",host="host-test"} 1.0' in text
        )
    finally:
        await agent.shutdown()


async def test_link_downs_survive_an_agent_restart(tmp_path: Path, dgx: SysfsTree) -> None:
    agent = _agent(tmp_path, dgx)
    await agent.step(10.0)
    dgx.add("mlx5_1", "link_downed", 2)
    await agent.step(12.0)
    await agent.shutdown()
    restarted = _agent(tmp_path, dgx)
    try:
        dgx.add("mlx5_1", "link_downed", 1)
        batch = sent(await restarted.step(20.0))
        assert batch.ports is not None
        assert len({p.device: p for p in batch.ports}["mlx5_1"].downs) == 3
    finally:
        await restarted.shutdown()
