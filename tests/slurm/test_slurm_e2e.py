"""End to end on a real Slurm: verdicts drain nodes, a node drains itself, the breaker stops the next drain.

On 127.0.0.1: munged, slurmctld and four slurmd (gn1, gn2: a real ``srun``-launched torch gloo job with the
probe, watched by two real agents; sim3, sim4: ``sentinel agent run --simulate`` on simulated GPUs), a real
aggregator with remediation acting (``stuck`` verdicts drain, nothing else; the breaker allows two sentinel
drains), and ``sentinel health --drain`` as Slurm's HealthCheckProgram on sim3.

1. A rank of the srun job hangs → the stuck verdict names it on gn2 → the aggregator drains gn2 with
   ``sentinel: stuck not_entered_collective GPU 1 job <id> rank 3 <verdict>``, within seconds of the verdict.
2. GPU 1 of sim3 raises Xid 79 (the scenario) → its agent finds it faulty by itself → the HealthCheckProgram
   (``sentinel health --drain``) drains sim3 with ``sentinel: GPU 1 ...: faulty xid_79 -> reboot``; the
   aggregator, whose policy does not drain faulty GPUs here, does not act on it.
3. A simulated rank hangs on sim4 → stuck verdict → the breaker (two sentinel drains already in Slurm)
   refuses; sim4 stays in service; ``sentinel_remediation_breaker_open`` is 1 and the alert rule fires on
   that value (promtool). Dry run is covered against the real Slurm in test_remediation.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psutil
import pytest

from sentinel.agent import Agent
from sentinel.agent.jobs import JobMapper, parse_listpids, run_listpids
from sentinel.config.agent import AgentConfig
from sentinel.config.aggregator import (
    AggregatorConfig,
    BreakerConfig,
    FleetConfig,
    IncidentsConfig,
    RemediationConfig,
    RemediationRule,
)
from sentinel.slurm import SINFO_FORMAT, parse_sinfo
from tests.agent.fakes import FakeSource
from tests.aggregator.helpers import TOKEN, Running, running_aggregator
from tests.slurm.cluster import SlurmCluster, available, free_port
from tests.support import REPO, need, need_binary, need_module

pytestmark = pytest.mark.timeout(170)

GLOO_NODES = ("gn1", "gn2")
RANKS_PER_NODE = 2
CULPRIT = 3  # gn2, local rank 1
NODES = (*GLOO_NODES, "sim3", "sim4")


def _agent_config(tmp: Path, host: str, url: str, token: Path, sockets: Path) -> AgentConfig:
    data = {
        "agent": {"host": host, "state_dir": str(tmp / host / "state")},
        "collect": {"tick_s": 0.5, "slow_tick_s": 2.0, "nvml_timeout_s": 1.0, "procs_interval_s": 2.0},
        "kmsg": {"enabled": False},
        "probe": {"socket_path": str(sockets / f"{host}.sock")},
        "metrics": {"listen_host": ""},
        "stream": {
            "aggregator_url": url,
            "token_file": str(token),
            "backoff_initial_s": 0.2,
            "backoff_max_s": 1.0,
        },
        "systemd": {"notify": False},
    }
    return msgspec.convert(data, AgentConfig)


def _sim_config(tmp: Path, host: str, url: str, token: Path) -> tuple[Path, int]:
    port = free_port()
    path = tmp / f"{host}.toml"
    path.write_text(
        f"""
[agent]
host = "{host}"
state_dir = "{tmp / host / "state"}"
[collect]
tick_s = 0.5
slow_tick_s = 1.0
[kmsg]
enabled = false
[probe]
socket_path = ""
[metrics]
listen_host = "127.0.0.1"
listen_port = {port}
[stream]
aggregator_url = "{url}"
token_file = "{token}"
backoff_initial_s = 0.2
backoff_max_s = 1.0
[systemd]
notify = false
"""
    )
    return path, port


SCENARIO_XID = """
seed = 3
duration_s = 600
tick_s = 0.5
[cluster]
hosts = 1
gpus_per_host = 4
[[faults]]
at_s = 1.0
host = "host-000"
gpu = 1
kind = "xid"
xid = 79
"""

SCENARIO_HANG = """
seed = 4
duration_s = 600
tick_s = 0.5
[cluster]
hosts = 1
gpus_per_host = 4
[[jobs]]
id = "sim-train"
hosts = ["host-000"]
[[faults]]
at_s = 4.0
host = "host-000"
gpu = 2
kind = "hang"
"""


def _health_check(tmp: Path, sim3_config: Path, slurm_conf: Path) -> Path:
    """Slurm's HealthCheckProgram: sentinel health --drain on sim3 (the node with a sentinel agent).

    slurmd runs it with a bare environment; on a real node scontrol finds /etc/slurm/slurm.conf, here the
    throwaway configuration is named.
    """
    script = tmp / "healthcheck.sh"
    log = tmp / "healthcheck.log"
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$SLURMD_NODENAME" = sim3 ] || exit 0\n'
        f"export SLURM_CONF={slurm_conf}\n"
        f"{sys.executable} -m sentinel health --config {sim3_config} --drain >>{log} 2>&1\n"
        f'echo "exit $?" >>{log}\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return script


class SimAgent:
    """``sentinel agent run --config FILE --simulate SCENARIO --host host-000`` as its own process."""

    def __init__(self, tmp: Path, name: str, config: Path, scenario: str) -> None:
        path = tmp / f"{name}-scenario.toml"
        path.write_text(scenario)
        self.log_path = tmp / f"{name}-agent.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sentinel", "agent", "run", "--config", str(config), "--simulate", str(path),
             "--host", "host-000"],
            cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()


def _job_spec(tmp: Path, sockets: Path, control: Path) -> Path:
    nodes: dict[str, list[dict[str, Any]]] = {}
    for rank in range(len(GLOO_NODES) * RANKS_PER_NODE):
        node = GLOO_NODES[rank // RANKS_PER_NODE]
        env = {"SENTINEL_PROBE_SOCKET": str(sockets / f"{node}.sock")}
        nodes.setdefault(node, []).append({"rank": rank, "local_rank": rank % RANKS_PER_NODE, "env": env})
    spec = {
        "port": free_port(),
        "control": str(control),
        "step_s": 0.05,
        "probe_interval_s": 1.0,
        "world_size": len(GLOO_NODES) * RANKS_PER_NODE,
        "nodes": nodes,
    }
    path = control / "spec.json"
    path.write_text(json.dumps(spec))
    return path


@contextlib.asynccontextmanager
async def _gloo_agents(
    tmp: Path, running: Running, token: Path, sockets: Path, nodes: tuple[str, ...] = GLOO_NODES
) -> AsyncIterator[list[Agent]]:
    agents = [
        Agent(_agent_config(tmp, node, running.stream_url, token, sockets), FakeSource(gpus=RANKS_PER_NODE))
        for node in nodes
    ]
    tasks = [asyncio.create_task(a.run()) for a in agents]
    try:
        yield agents
    finally:
        for a in agents:
            a.request_stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)


async def _until(what: str, check: Any, timeout: float, *, every: float = 0.1, why: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s\n{why() if why else ''}")
        await asyncio.sleep(every)


def _aggregator_config() -> AggregatorConfig:
    return AggregatorConfig(
        fleet=FleetConfig(tick_s=0.5),
        incidents=IncidentsConfig(enabled=False),
        remediation=RemediationConfig(
            enabled=True,
            dry_run=False,
            rules=[RemediationRule(kind="stuck"), RemediationRule(do="none")],
            breaker=BreakerConfig(
                window_s=3600, max_drains=2, max_fraction=1.0, max_unavailable_fraction=0.9
            ),
            retry_s=2.0,
            command_timeout_s=10.0,
        ),
    )


async def test_verdicts_drain_nodes_health_check_drains_and_breaker_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(available(), "slurm-wlm and munge not installed")
    need_module("torch")
    promtool = need_binary("promtool")
    root = Path(tempfile.mkdtemp(prefix="se2e-", dir="/tmp"))  # short: unix socket paths
    sockets = root / "sock"
    sockets.mkdir()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    timings: dict[str, float] = {}
    started = time.monotonic()
    sims: list[SimAgent] = []
    job: subprocess.Popen[bytes] | None = None
    slurm: SlurmCluster | None = None
    try:
        async with running_aggregator(tmp_path / "aggregator", _aggregator_config()) as running:
            url = running.url
            sim3_config, _ = _sim_config(tmp_path, "sim3", running.stream_url, token)
            slurm = SlurmCluster(
                root / "slurm",
                NODES,
                health_check=str(_health_check(tmp_path, sim3_config, root / "slurm" / "slurm.conf")),
                health_interval_s=2,
            )
            (root / "slurm").mkdir()
            await asyncio.to_thread(slurm.start)
            monkeypatch.setenv("SLURM_CONF", str(slurm.conf))  # the aggregator's scontrol/sinfo
            timings["slurm_up_s"] = time.monotonic() - started
            cluster = slurm

            def state(node: str) -> tuple[str, str]:
                return cluster.node_state(node)

            async with _gloo_agents(tmp_path, running, token, sockets), aiohttp.ClientSession() as session:

                async def verdicts() -> list[dict[str, Any]]:
                    async with session.get(f"{url}/api/v1/verdicts") as response:
                        return list((await response.json())["verdicts"])

                # the faulty-GPU node: its agent on simulated GPUs, Slurm's health check asks it
                sims.append(SimAgent(tmp_path, "sim3", sim3_config, SCENARIO_XID))

                # 1. the srun job: 2 nodes x 2 ranks, each node's launcher forks its ranks with the probe
                control = root / "job"
                control.mkdir()
                spec = _job_spec(tmp_path, sockets, control)
                job_log = (tmp_path / "job.log").open("wb")
                job = subprocess.Popen(
                    ["srun", "-N2", "--ntasks-per-node=1", "-w", ",".join(GLOO_NODES), "--kill-on-bad-exit=1",
                     sys.executable, "-m", "tests.slurm.srun_gloo", str(spec)],
                    cwd=REPO, env={**slurm.env(), "TORCH_FR_BUFFER_SIZE": "2000"},
                    stdout=job_log, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip

                def job_output() -> str:
                    job_log.flush()
                    return (tmp_path / "job.log").read_text(errors="replace")[-3000:]

                async def job_reporting() -> bool:
                    async with session.get(f"{url}/api/v1/jobs") as response:
                        jobs = (await response.json())["jobs"]
                    for j in jobs:
                        async with session.get(f"{url}/api/v1/jobs/{j['id']}") as response:
                            ranks = (await response.json()).get("rank_list") or []
                        if len(ranks) >= len(GLOO_NODES) * RANKS_PER_NODE and all(
                            r.get("host") for r in ranks
                        ):
                            return True
                    return False

                await _until("the srun job's ranks report", job_reporting, 60, every=0.5, why=job_output)
                timings["job_reporting_s"] = time.monotonic() - started
                assert job.poll() is None, job_output()
                _job_mapping_from_listpids(slurm)
                await asyncio.sleep(2.0)  # a few healthy steps
                assert not [v for v in await verdicts() if v["kind"] == "stuck"]
                (control / "hang").write_text(str(CULPRIT))
                hung = control / f"hung_{CULPRIT}"
                await _until("the culprit stops", lambda: asyncio.sleep(0, hung.exists()), 15)

                async def stuck() -> dict[str, Any] | None:
                    return next(
                        (v for v in await verdicts() if v["kind"] == "stuck" and v["host"] == "gn2"), None
                    )

                verdict = await _until("stuck verdict on gn2", stuck, 20, why=job_output)
                assert verdict["rank"] == CULPRIT and verdict["reason"] == "not_entered_collective", verdict

                async def gn2_drained() -> tuple[str, str] | None:
                    found = await asyncio.to_thread(state, "gn2")
                    return found if "DRAIN" in found[0] else None

                gn2 = await _until("gn2 drained", gn2_drained, 15)
                drained_seen = time.time()
                assert (
                    gn2[1]
                    == f"sentinel: stuck not_entered_collective GPU 1 job {verdict['job']} rank {CULPRIT} {verdict['id']}"
                ), gn2
                timings["stuck_verdict_to_drain_seen_s"] = drained_seen - verdict["opened_at"]
                audit = [
                    json.loads(line)
                    for line in (tmp_path / "aggregator" / "remediation.jsonl").read_text().splitlines()
                ]
                done = next(r for r in audit if r["node"] == "gn2" and r["outcome"] == "done")
                timings["stuck_verdict_to_scontrol_done_s"] = done["t"] - verdict["opened_at"]
                assert timings["stuck_verdict_to_scontrol_done_s"] < 5.0, timings
                assert "DRAIN" not in (await asyncio.to_thread(state, "gn1"))[0]  # the waiting peer's node

                # 2. sim3: Xid 79 on GPU 1 → the health check drains its own node
                async def sim3_drained() -> tuple[str, str] | None:
                    found = await asyncio.to_thread(state, "sim3")
                    return found if "DRAIN" in found[0] else None

                sim3 = await _until(
                    "sim3 drained by its health check", sim3_drained, 30, every=0.2,
                    why=lambda: (tmp_path / "healthcheck.log").read_text() if (tmp_path / "healthcheck.log").exists() else "no health check ran",
                )  # fmt: skip
                timings["health_check_drain_s"] = time.monotonic() - started
                assert sim3[1].startswith("sentinel: GPU 1 ") and "faulty xid_79 -> reboot" in sim3[1], sim3
                faulty = [v for v in await verdicts() if v["host"] == "sim3" and v["kind"] == "faulty"]
                assert faulty and all("remediation" not in v for v in faulty)  # the policy left it alone
                listed = parse_sinfo(slurm.run("sinfo", "-h", "-N", "-n", "sim3", "-o", SINFO_FORMAT))
                assert listed[0].drained_by_sentinel and listed[0].reason_time is not None
                # Slurm stamps the reason to the second; the health check runs every 2 s
                timings["faulty_verdict_to_health_drain_s"] = listed[0].reason_time - faulty[0]["opened_at"]
                assert timings["faulty_verdict_to_health_drain_s"] < 2 + 2 + 1, timings
                # the next health checks find it drained and leave it (and Slurm's reason time) alone
                check_log = tmp_path / "healthcheck.log"

                async def left_alone() -> bool:
                    return "Slurm node sim3 already drained" in check_log.read_text()

                await _until("a later health check leaves sim3 alone", left_alone, 10, every=0.2)
                again = parse_sinfo(slurm.run("sinfo", "-h", "-N", "-n", "sim3", "-o", SINFO_FORMAT))[0]
                assert (again.reason, again.reason_time) == (listed[0].reason, listed[0].reason_time)

                # 3. sim4: a simulated rank hangs → stuck verdict → the breaker refuses a third drain
                sim4_config, _ = _sim_config(tmp_path, "sim4", running.stream_url, token)
                sims.append(SimAgent(tmp_path, "sim4", sim4_config, SCENARIO_HANG))

                async def refused() -> dict[str, Any] | None:
                    for v in await verdicts():
                        for rec in v.get("remediation") or []:
                            if v["host"] == "sim4" and rec["outcome"] == "refused":
                                return v | {"record": rec}
                    return None

                sim4 = await _until("breaker refuses sim4", refused, 40, every=0.3,
                                    why=lambda: sims[-1].log_path.read_text()[-2000:])  # fmt: skip
                assert sim4["kind"] == "stuck" and sim4["record"]["reason"] == "breaker_sentinel_drains", sim4
                assert "2 drains by sentinel" in sim4["record"]["detail"]
                assert "DRAIN" not in (await asyncio.to_thread(state, "sim4"))[0]
                timings["breaker_refusal_s"] = time.monotonic() - started
                async with session.get(f"{url}/metrics") as response:
                    metrics = await response.text()
                line = next(
                    x for x in metrics.splitlines() if x.startswith("sentinel_remediation_breaker_open{")
                )
                value = float(line.rsplit(" ", 1)[1])
                assert value == 1.0, line
                _alert_fires_on(promtool, tmp_path, line.split(" ", 1)[0], value)
    finally:
        if job is not None and job.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            job.wait(10)
        if slurm is not None:
            with contextlib.suppress(Exception):
                slurm.run("scancel", "--full", "-u", "root", timeout=5, check=False)
        for sim in sims:
            sim.stop()
        if slurm is not None:
            slurm.stop()
        timings["total_s"] = time.monotonic() - started
        print("timings:", json.dumps({k: round(v, 2) for k, v in timings.items()}))
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    # nothing of the throwaway cluster outlives it (slurmstepd leaves slurmd's session)
    assert slurm is not None
    left = slurm.leftovers()
    assert not left, [(p.pid, p.name()) for p in left]


def _job_mapping_from_listpids(slurm: SlurmCluster) -> None:
    """Job mapping without environ on the real step: ``scontrol listpids`` names the job of every process of
    gn2's task, the task's own global id for the task (the node launcher), and no rank for the ranks it
    forked (their rank is their environment's)."""
    text = run_listpids_with(slurm, "gn2")
    listed = parse_listpids(text)
    tasks = [
        p for p in psutil.process_iter(["cmdline"])
        if "tests.slurm.srun_gloo" in " ".join(p.info["cmdline"] or []) and p.pid in listed
    ]  # fmt: skip
    tasks = [p for p in tasks if (parent := p.parent()) is not None and parent.name() == "slurmstepd"]
    assert len(tasks) == 1, text
    launcher = tasks[0]
    mapper = JobMapper(listpids=lambda: text)
    own = mapper.slurm_task(launcher.pid)
    assert own is not None and own.global_id == 1 and own.local_id == 0 and own.step == "0", (own, text)
    ranks = [c.pid for c in launcher.children() if c.pid in listed]
    assert len(ranks) == RANKS_PER_NODE, text
    forked = mapper.slurm_task(ranks[0])
    assert forked is not None and forked.job_id == own.job_id and forked.global_id is None


def run_listpids_with(slurm: SlurmCluster, node: str) -> str:
    """:func:`sentinel.agent.jobs.run_listpids` with this cluster's SLURM_CONF (the agent's is the system's)."""
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(slurm.conf)
    try:
        return run_listpids(node) or ""
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


def _alert_fires_on(promtool: str, tmp_path: Path, series: str, value: float) -> None:
    """The breaker alert of rules/sentinel.rules.yml, evaluated by promtool on the scraped series."""
    labels = series[series.index("{") :]
    cluster = json.loads('"' + labels.split('cluster="', 1)[1].split('"', 1)[0] + '"')
    test = tmp_path / "breaker.test.yml"
    test.write_text(
        f"""rule_files:
  - {REPO / "rules" / "sentinel.rules.yml"}
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
      - series: '{series}'
        values: '{value:g}x4'
    alert_rule_test:
      - eval_time: 30s
        alertname: SentinelRemediationBreakerOpen
        exp_alerts:
          - exp_labels: {{severity: critical, cluster: {cluster}}}
            exp_annotations:
              summary: "Sentinel's drain circuit breaker is open in cluster {cluster}"
              description: "Sentinel refused to drain a node because too many nodes are already drained by sentinel within its window, or too much of the partition is down or drained. Either the fleet has a real widespread problem or a rule is misfiring; faulty nodes now stay in service until someone decides."
              runbook_url: docs/runbooks/SentinelRemediationBreakerOpen.md
"""
    )
    done = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
