"""The node's fitness as the agent answers it (``GET /api/v1/health``) and as ``sentinel health`` prints it.

The GPUs are the fake NVML at the library boundary (the real NvmlSource reads them); the command runs as a
real subprocess against the agent's real HTTP endpoint on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from sentinel.agent import Agent
from sentinel.agent.nvml import NvmlSource
from sentinel.cli.cmd_health import job_gpus, judge
from sentinel.wire import Command, HostVerdict, VerdictsRequest
from tests.agent.conftest import make_config
from tests.agent.fakenvml import FakeNvml
from tests.support import REPO

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _agent(tmp_path: Path, clock: Clock, **metrics: object) -> Agent:
    config = make_config(
        tmp_path,
        collect={"nvml_events": False},
        metrics={"listen_host": "127.0.0.1", "listen_port": 0, **metrics},
    )
    return Agent(config, NvmlSource(), clock=clock)


async def test_local_rules_pushed_verdicts_and_cannot_tell(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    clock = Clock()
    agent = _agent(tmp_path, clock)
    try:
        before = agent.health_report()
        assert before["fit"] is None and "not open" in before["cannot_tell"]
        await agent.step()
        assert agent.health_report()["fit"] is True
        # a failed row remap: the aggregator's own memory rules, decided on the node
        fake_nvml.gpus[1].remap = (0, 1, 0, 1)
        clock.t += 1
        await agent.step()
        doc = agent.health_report()
        assert doc["fit"] is False
        gpu1 = doc["gpus"][1]
        assert gpu1["fit"] is False and doc["gpus"][0]["fit"] is True
        assert [(r["kind"], r["reason"], r["action"], r["source"]) for r in gpu1["reasons"]] == [
            ("faulty", "row_remap_failure", "rma", "local")
        ]
        # what only the aggregator sees is pushed back; a job-level action warns, a drain-level one is unfit
        pushed = [
            HostVerdict(id="v7", kind="stuck", reason="not_entered_collective", action="restart_app", gpu=0),
            HostVerdict(id="v8", kind="degraded", reason="pcie_replays", action="drain", gpu=0),
        ]
        result = await agent.handle_command(Command(id="c1", request=VerdictsRequest(verdicts=pushed)))
        assert result.ok
        gpu0 = agent.health_report()["gpus"][0]
        assert gpu0["fit"] is False and [r["verdict"] for r in gpu0["reasons"]] == ["v7", "v8"]
        await agent.handle_command(Command(id="c2", request=VerdictsRequest(verdicts=pushed[:1])))
        assert agent.health_report()["gpus"][0]["fit"] is True
        # an agent that stopped collecting cannot vouch for the node
        clock.t += 120
        stale = agent.health_report()
        assert stale["fit"] is None and "old" in stale["cannot_tell"]
    finally:
        await agent.shutdown()


def test_judge_prolog_takes_only_the_jobs_gpus() -> None:
    doc = {
        "host": "n1",
        "fit": False,
        "cannot_tell": "",
        "host_reasons": [],
        "gpus": [
            {"index": 0, "uuid": "GPU-a", "state": "ok", "reasons": []},
            {
                "index": 1,
                "uuid": "GPU-b",
                "state": "lost",
                "reasons": [{"kind": "faulty", "reason": "gpu_lost", "action": "reboot"}],
            },
        ],
    }
    assert judge(doc, "node", {}).lines == ["GPU 1 GPU-b: faulty gpu_lost -> reboot"]
    assert judge(doc, "prolog", {"SLURM_JOB_GPUS": "0"}).fit is True
    assert judge(doc, "prolog", {"CUDA_VISIBLE_DEVICES": "GPU-b"}).fit is False
    assert judge(doc, "prolog", {}).fit is False  # the job's GPUs unknown: every GPU is judged
    unknown = judge(doc, "epilog", {"SLURM_JOB_GPUS": "0,5"})
    assert unknown.fit is None and "5" in unknown.why_not
    assert job_gpus({"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0"}) == ({"2", "3"}, "SLURM_JOB_GPUS")
    assert judge({**doc, "fit": None, "cannot_tell": "the GPU source is not open"}, "node", {}).fit is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _health(url: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CUDA_VISIBLE"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sentinel",
        "health",
        "--url",
        url,
        *args,
        cwd=REPO,
        env={**base, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def test_command_exit_codes_json_nagios_and_epilog(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    clock = Clock()
    port = _free_port()
    agent = _agent(tmp_path, clock, listen_host="127.0.0.1", listen_port=port)
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    url = f"http://127.0.0.1:{port}"
    try:
        await agent.start()
        clock.t = __import__("time").time()
        await agent.step()
        assert await _health(url) == (0, "fit: host-test, 2 GPUs checked\n")
        fake_nvml.gpus[1].remap = (0, 1, 0, 1)
        fake_nvml.gpus[0].pids = [leftover.pid]
        clock.t += 1
        await agent.step()
        code, out = await _health(url)
        uuid1 = fake_nvml.gpus[1].uuid
        assert (code, out) == (1, f"GPU 1 {uuid1}: faulty row_remap_failure -> rma\n")
        code, out = await _health(url, "--json")
        doc = json.loads(out)
        assert code == 1 and doc["fit"] is False and [g["index"] for g in doc["gpus"]] == [0, 1]
        assert doc["gpus"][1]["reasons"][0]["reason"] == "row_remap_failure"
        code, out = await _health(url, "--nagios")
        assert code == 2 and out.startswith("SENTINEL CRITICAL - GPU 1")
        # a prolog for a job on GPU 0 only: fit
        prolog = {"SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_GPUS": "0", "SLURM_JOB_ID": "77"}
        assert (await _health(url, env=prolog))[0] == 0
        # its epilog: a process still holds GPU 0 after the job ended; --kill ends it
        epilog = {**prolog, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}
        code, out = await _health(url, env=epilog)
        assert code == 1 and f"process {leftover.pid} (python" in out and "still holds the GPU" in out
        assert leftover.poll() is None
        code, out = await _health(url, "--kill", env=epilog)
        assert code == 0 and f"killed process {leftover.pid}" in out
        assert leftover.wait(5) != 0
    finally:
        leftover.kill()
        await agent.shutdown()
    # the agent gone: cannot tell, never fit
    code, out = await _health(url)
    assert code == 2 and out.startswith("cannot tell: agent at") and "not reachable" in out
    code, out = await _health(url, "--nagios")
    assert code == 3 and out.startswith("SENTINEL UNKNOWN")


@pytest.mark.parametrize("reason", ["", "Row remap pending", "xid 79", "<b>x</b>", "a" * 65, "9lives"])
def test_a_pushed_back_verdict_with_a_free_text_reason_is_refused_at_decode(reason: str) -> None:
    """Reasons are short snake_case codes (one alert series per cause); free text never reaches a label."""
    raw = msgspec.msgpack.encode({"id": "v1", "kind": "degraded", "reason": reason, "action": "drain"})
    with pytest.raises(msgspec.ValidationError, match="reason"):
        msgspec.msgpack.decode(raw, type=HostVerdict)


def test_a_pushed_back_verdict_with_a_reason_code_decodes() -> None:
    raw = msgspec.msgpack.encode({"id": "v1", "kind": "faulty", "reason": "xid_79", "action": "reset_gpu"})
    assert msgspec.msgpack.decode(raw, type=HostVerdict).reason == "xid_79"
