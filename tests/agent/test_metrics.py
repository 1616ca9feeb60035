"""/metrics: the catalog's names and labels, promtool-clean, and the control API on the same port."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sentinel.agent import Agent
from sentinel.agent.metrics import AgentCounters, AgentMetricsCollector, GpuView, make_registry
from sentinel.wire import EccCounters, GpuInfo, GpuSample, NvLink, ProcInfo
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource
from tests.support import need_binary

GPU_LABELS = {"cluster", "host", "gpu", "uuid", "pci_bus", "job", "rank"}


async def _agent(tmp_path: Path) -> Agent:
    config = make_config(
        tmp_path, metrics={"listen_host": "127.0.0.1", "listen_port": 0}, agent={"cluster": "c1"}
    )
    source = FakeSource(gpus=2)
    source.lost = {1}
    agent = Agent(config, source)
    await agent.start()
    await agent.step()
    agent.sink.set_procs([ProcInfo(gpu=0, pid=10, job_id="train-a", rank=3)])
    agent.counters.xid[(1, 79, "critical")] += 1
    agent.counters.log_events[("nccl_warn_net", "warning")] += 2
    return agent


async def _scrape(agent: Agent, path: str = "/metrics") -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{agent.http_port}{path}") as r,
    ):
        assert r.status == 200
        return await r.text()


async def test_catalog_names_and_labels(tmp_path: Path) -> None:
    agent = await _agent(tmp_path)
    try:
        text = await _scrape(agent)
    finally:
        await agent.shutdown()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "sentinel_gpu_info",
        "sentinel_gpu_up",
        "sentinel_gpu_state",
        "sentinel_gpu_utilization_ratio",
        "sentinel_gpu_memory_used_bytes",
        "sentinel_gpu_temperature_celsius",
        "sentinel_gpu_power_watts",
        "sentinel_gpu_sm_clock_hertz",
        "sentinel_gpu_throttle_reason",
        "sentinel_gpu_pcie_replay",
        "sentinel_gpu_ecc_errors",
        "sentinel_gpu_remapped_rows",
        "sentinel_gpu_xid_events",
        "sentinel_log_events",
        "sentinel_agent_collector_duration_seconds",
        "sentinel_agent_collector_success",
        "sentinel_agent_dropped",
        "sentinel_agent_spool_bytes",
        "sentinel_agent_connected",
        "sentinel_agent_last_tick_timestamp_seconds",
    ):
        assert name in families, name
    up = {s.labels["gpu"]: s for s in families["sentinel_gpu_up"].samples}
    assert set(up["0"].labels) >= GPU_LABELS
    assert up["0"].value == 1.0 and up["1"].value == 0.0
    assert (up["0"].labels["job"], up["0"].labels["rank"], up["0"].labels["cluster"]) == (
        "train-a",
        "3",
        "c1",
    )
    temps = {s.labels["gpu"]: s.value for s in families["sentinel_gpu_temperature_celsius"].samples}
    assert temps == {"0": 60.0}  # the lost GPU exports state, not stale readings
    hz = families["sentinel_gpu_sm_clock_hertz"].samples[0].value
    assert hz == 1980e6
    xid = families["sentinel_gpu_xid_events"].samples
    assert [(s.name, s.labels["gpu"], s.labels["xid"], s.value) for s in xid] == [
        ("sentinel_gpu_xid_events_total", "1", "79", 1.0)
    ]
    collectors = {s.labels["collector"] for s in families["sentinel_agent_collector_success"].samples}
    assert {"nvml", "jobs"} <= collectors


async def test_promtool_check_metrics(tmp_path: Path) -> None:
    promtool = need_binary("promtool")
    agent = await _agent(tmp_path)
    try:
        text = await _scrape(agent)
    finally:
        await agent.shutdown()
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


async def test_control_api_snapshot_and_health(tmp_path: Path) -> None:
    agent = await _agent(tmp_path)
    try:
        doc = json.loads(await _scrape(agent, "/api/v1/snapshot"))
        health = json.loads(await _scrape(agent, "/healthz"))
        url = f"http://127.0.0.1:{agent.http_port}/api/v1/snapshot?since=nan"
        async with aiohttp.ClientSession() as session, session.get(url) as r:
            assert r.status == 400 and "since" in (await r.json())["error"]
    finally:
        await agent.shutdown()
    assert doc["host"] == "host-test" and health["ok"] is True
    assert {e["type"] for e in doc["entries"]} >= {"sample"}
    assert [e["t"] for e in doc["entries"]] == sorted(e["t"] for e in doc["entries"])


def test_text_kept_between_scrapes_is_what_a_fresh_render_writes() -> None:
    """The agent keeps slow-only families' text and unchanged families between scrapes: after every change
    of fast sample, slow sample, job, GPU state or counter, its body is a fresh collector's."""
    info = GpuInfo(index=0, uuid="GPU-0", pci_bus="0000:18:00", name="Fake", nvlinks=2)
    view = GpuView(info)
    counters = AgentCounters()
    kept = AgentMetricsCollector("c1", "h1", {0: view}, counters)
    kept_registry = make_registry(kept)

    def fast(temp: float) -> GpuSample:
        return GpuSample(gpu=0, t=temp, temp_c=temp, util_gpu_pct=50.0)

    def slow(crc: int) -> GpuSample:
        sample = fast(60.0)
        sample.ecc = EccCounters(volatile_corrected=crc)
        sample.nvlink = [NvLink(link=link, crc_errors=crc + link) for link in range(2)]
        return sample

    def check() -> str:
        fresh = AgentMetricsCollector("c1", "h1", {0: view}, counters)
        body = kept.render(kept_registry).decode()
        assert body == fresh.render(make_registry(fresh)).decode()
        return body

    view.fast, view.slow = fast(50.0), slow(3)
    assert 'link="1",type="crc"} 4.0' in check()
    view.fast = fast(51.0)  # a new fast sample, the same slow one
    body = check()
    assert "sentinel_gpu_temperature_celsius{" in body and "} 51.0\n" in body
    view.slow = slow(7)
    assert 'link="1",type="crc"} 8.0' in check()
    view.job, view.rank = "train-a", "3"
    assert 'job="train-a",rank="3",link="0",type="crc"} 7.0' in check()
    counters.batches_sent += 1
    assert 'sentinel_agent_batches_sent_total{cluster="c1",host="h1"} 1.0' in check()
    view.state = "lost"
    assert "sentinel_gpu_nvlink_errors_total{" not in check()
    view.state = "ok"
    assert 'link="0",type="crc"} 7.0' in check()
