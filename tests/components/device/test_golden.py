"""Golden end-to-end files for the GPU components, node_exporter style: a fixture host (fake NVML state at
the library boundary, kernel-log lines in a file standing in for /dev/kmsg) → ``sentinel agent once --json``
and the agent's batches and ``/metrics``, compared with checked-in expected output. After a deliberate
change, regenerate and review the diff like code::

    SENTINEL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/components/device/test_golden.py

Cases: the agent's one-shot JSON (a Hopper GPU and a Blackwell one: NVLink counters through field values,
clock violation time), an Xid reported by both NVML and the kernel log, one GPU lost at open, NVML gone and
back, the kernel-log cursor across an agent restart, and — fed on into the aggregator's engine — a GPU reset
clearing a latched Xid while a transient NVML stall does not.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import msgspec
import pynvml
import pytest

from sentinel.agent.agent import Agent
from sentinel.agent.nvml import NvmlSource
from sentinel.aggregator.engine import Engine
from sentinel.cli import main
from sentinel.wire import Batch, XidOccurred
from tests.agent.conftest import make_config
from tests.agent.fakenvml import FakeNvml, component_unsupported
from tests.support import sent

NVML_NOW_US = 1_800_000_000_000_000  # the fixture host's NVML clock (violation readings are stamped with it)


@pytest.fixture(autouse=True)
def _fixture_host_clock(fake_nvml: FakeNvml) -> None:
    fake_nvml.now_us = NVML_NOW_US


def _hopper_and_blackwell(fake_nvml: FakeNvml) -> None:
    """GPU 0 a Hopper with a marginal link 1; GPU 1 a Blackwell (NVLink symbol/effective errors and BERs),
    at its power limit 40% of the time."""
    h, b = fake_nvml.gpus
    h.nvlink_errors = {
        (1, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 310,
        (1, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA): 12,
        (1, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 41,
    }
    h.violations = {0: 0, 1: 2_500_000_000, 2: 0}  # power, thermal, sync boost; the rest NOT_SUPPORTED
    b.name = "NVIDIA B200"
    b.generation = "blackwell"
    b.nvlink_fields = {
        (pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS, 0): 98_765,
        (pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS, 0): 3,
        (pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER, 0): (2 << 8) | 9,  # 2e-9
        (pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER, 0): (1 << 8) | 15,  # 1e-15
    }
    b.violations = {0: 40_000_000_000, 1: 0, 2: 0, 3: 0, 10: 41_000_000_000, 11: 0}


GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("SENTINEL_UPDATE_GOLDEN", "") == "1"
BOOT = "11111111-2222-3333-4444-555555555555"
LINE_149 = "6,1001,5000000,-;NVRM: Xid (PCI:0000:18:00): 149, pid=4242, name=python3, Nonfatal NETIR_LINK_EVT, Link 02"
LINE_48 = "3,1002,6000000,-;NVRM: Xid (PCI:0000:28:00): 48, pid=777, name=train.py, An uncorrectable double bit error"


def _check(name: str, document: Any, suffix: str = "json") -> None:
    path = GOLDEN / f"{name}.{suffix}"
    text = document if isinstance(document, str) else json.dumps(document, indent=2, sort_keys=True) + "\n"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with SENTINEL_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"output differs from {path} (SENTINEL_UPDATE_GOLDEN=1 to accept)"


def _view(batches: list[Batch]) -> list[dict[str, Any]]:
    """What a golden file keeps of a batch: GPU states, events (without wall times), source health."""
    out = []
    for b in batches:
        events = [
            {k: v for k, v in msgspec.to_builtins(e).items() if k != "t"} for e in b.events if e.kind != "log"
        ]
        doc: dict[str, Any] = {"states": {str(s.gpu): s.state for s in b.samples}, "events": events}
        if b.gpu_source is not None:
            doc["gpu_source"] = msgspec.to_builtins(b.gpu_source)
        out.append(doc)
    return out


def _gpu_metrics(agent: Agent) -> str:
    return agent.metrics.render_gpu_text()


def _agent(tmp_path: Path, kmsg: Path, **collect: object) -> Agent:
    config = make_config(
        tmp_path,
        kmsg={"enabled": True, "path": str(kmsg)},
        collect={"xid_merge_wait_s": 0.5, "nvml_events": True, **collect},
    )
    agent = Agent(config, NvmlSource())
    for collector in agent.collectors.items:
        reader = getattr(collector, "reader", None)
        if reader is not None and hasattr(reader, "boot_id"):
            reader.boot_id = BOOT  # the fixture host's boot
    return agent


def test_agent_once_json_matches_golden(fake_nvml: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    _hopper_and_blackwell(fake_nvml)
    fake_nvml.gpus[1].remap = (2, 1, 1, 0)
    fake_nvml.gpus[1].pcie_width = (8, 16)
    code = main(["agent", "once", "--json", "--sysfs-root", "/nonexistent"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for sample in out["samples"]:
        sample.pop("t")
    # a component's own read (its fake in tests/components/<name>/) is its folder's to check, not this file's
    theirs = component_unsupported()
    out["unsupported"] = [key for key in out["unsupported"] if key.partition(":")[2] not in theirs]
    _check("agent_once", {k: out[k] for k in ("inventory", "samples", "unsupported")})


async def test_agent_metrics_with_the_hopper_and_blackwell_fields(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    (tmp_path / "state").mkdir()
    _hopper_and_blackwell(fake_nvml)
    agent = Agent(make_config(tmp_path, collect={"nvml_events": False}), NvmlSource())
    await agent.step(1.0)  # the first tick is a slow one
    _check("hopper_blackwell.metrics", _gpu_metrics(agent), "prom")
    await agent.shutdown()


async def test_xid_pair_and_a_gpu_lost_at_open(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    fake_nvml.gpus.append(type(fake_nvml.gpus[0])(index=2, handle_error=999))
    agent = _agent(tmp_path, kmsg)
    batches = [sent(await agent.step(1.0))]
    fake_nvml.push_xid(0, 149)
    for _ in range(100):
        if len(agent.xids):
            break
        batches.append(sent(await agent.step(1.1)))
        await __import__("asyncio").sleep(0.02)
    with kmsg.open("a") as f:
        f.write(LINE_149 + "\n" + LINE_48 + "\n")
    batches.append(sent(await agent.step(1.2)))  # 149 merged now; 48 (kernel only) waits for NVML's twin
    batches.append(sent(await agent.step(2.0)))  # 48's wait is over: sent alone
    _check("xid_pair_gpu_lost_at_open", [b for b in _view(batches) if b["events"] or b.get("gpu_source")])
    _check("xid_pair_gpu_lost_at_open.metrics", _gpu_metrics(agent), "prom")
    await agent.shutdown()


LINE_154 = "4,1003,7000000,-;NVRM: Xid (PCI:0000:28:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
LINE_13 = "4,1004,7100000,-;NVRM: Xid (PCI:0000:28:00): 13, pid=31337, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 1, SM 1): MMU Fault"


async def test_xid_pairs_154_to_none_and_13_keep_the_kernel_lines_detail(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    """NVML's bare 154 and 13 and the kernel's lines of the same occurrences: one event each, with the
    kernel line's detail (154's recovery action "None" is no fault; 13 keeps the pid the distinct-process
    rule needs)."""
    (tmp_path / "state").mkdir()
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    agent = _agent(tmp_path, kmsg)
    batches = [sent(await agent.step(1.0))]
    fake_nvml.push_xid(1, 154)
    fake_nvml.push_xid(1, 13)
    for _ in range(100):  # bounded: until the listener thread has handed both NVML reports over
        if len(agent.xids) >= 2:
            break
        batches.append(sent(await agent.step(1.1)))
        await asyncio.sleep(0.02)
    with kmsg.open("a") as f:
        f.write(LINE_154 + "\n" + LINE_13 + "\n")
    batches.append(sent(await agent.step(1.2)))
    events = [e for b in batches for e in b.events if isinstance(e, XidOccurred)]
    assert sorted(e.record.xid for e in events) == [13, 154]  # one event per occurrence
    assert {e.record.xid: e.severity for e in events}[154] != "critical"
    assert {e.record.xid: e.record.pid for e in events}[13] == 31337
    _check("xid_pairs_154_13", [b for b in _view(batches) if b["events"]])
    await agent.shutdown()


async def test_nvml_gone_and_back(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    fake_nvml.init_error = 9  # driver not loaded
    agent = _agent(tmp_path, kmsg, nvml_events=False)
    batches = [sent(await agent.step(1.0))]
    fake_nvml.init_error = 0
    batches.append(sent(await agent.step(1.2)))
    fake_nvml.gpus[1].lost = True
    batches.append(sent(await agent.step(1.4)))
    fake_nvml.down = 1  # a driver reload: NVML uninitialised
    batches.append(sent(await agent.step(1.6)))
    fake_nvml.gpus[1].lost = False
    batches.append(sent(await agent.step(1.8)))  # re-initialised: the lost GPU is back, i.e. it was reset
    _check("nvml_gone_and_back", _view(batches))
    await agent.shutdown()


async def test_kernel_log_cursor_across_an_agent_restart(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(LINE_149 + "\n")  # before the agent ever ran, this boot: read (the whole ring)
    first = _agent(tmp_path, kmsg, nvml_events=False, xid_merge_wait_s=0.0)
    seen = _view([sent(await first.step(1.0))])
    await first.shutdown()
    with kmsg.open("a") as f:
        f.write(LINE_48 + "\n")  # lands while the agent is down
    second = _agent(tmp_path, kmsg, nvml_events=False, xid_merge_wait_s=0.0)
    seen += _view([sent(await second.step(2.0))])  # only the new line: nothing lost, nothing repeated
    await second.shutdown()
    cursor = json.loads((tmp_path / "state" / "kmsg.cursor").read_text())
    assert cursor["boot_id"] == BOOT
    _check("kmsg_cursor_restart", seen)
    # a new boot: the cursor no longer applies, the whole ring of this boot is read
    third = _agent(tmp_path, kmsg, nvml_events=False, xid_merge_wait_s=0.0)
    for collector in third.collectors.items:
        reader = getattr(collector, "reader", None)
        if reader is not None and hasattr(reader, "boot_id"):
            reader.boot_id = "another-boot"
    batch = sent(await third.step(3.0))
    assert sorted(e.record.xid for e in batch.events if isinstance(e, XidOccurred)) == [48, 149]
    await third.shutdown()


async def test_a_reset_clears_a_latched_xid_and_a_transient_stall_does_not(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    """The fixture host's batches fed on into the aggregator's engine: the verdicts after each step."""
    (tmp_path / "state").mkdir()
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    agent = _agent(tmp_path, kmsg, nvml_events=False, xid_merge_wait_s=0.0)
    engine = Engine()
    host = None
    steps: list[dict[str, Any]] = []

    async def step(t: float, what: str) -> None:
        nonlocal host
        batch = sent(await agent.step(t))
        if host is None:
            host = engine.hello(agent._hello(0), t)
        engine.ingest(host, batch, t)
        engine.tick(t)
        verdicts = sorted(
            (v.kind, v.gpu, v.reason, v.action) for v in engine.book.open.values() if v.host == "host-test"
        )
        steps.append({"step": what, **_view([batch])[0], "open_verdicts": [list(v) for v in verdicts]})

    await step(1.0, "healthy")
    with kmsg.open("a") as f:
        f.write(LINE_48 + "\n")
    await step(2.0, "Xid 48 (double-bit ECC) in the kernel log: latched")
    release = threading.Event()
    fake_nvml.gpus[1].hang = release
    await step(3.0, "NVML stalls on GPU 1 past the deadline")
    fake_nvml.gpus[1].hang = None
    release.set()  # the stall ends: the blocked call returns, then the next read is answered
    workers = [w for c in agent.collectors.items for w in getattr(c, "_workers", {}).values()]
    for _ in range(500):  # bounded wait for the condition (the hung call's thread finishing), not a guess
        if not any(w.busy for w in workers):
            break
        await asyncio.sleep(0.01)
    await step(4.0, "GPU 1 answers again: a stall, not a reset; Xid 48 stays latched")
    _check("stall_keeps_xid.metrics", _gpu_metrics(agent), "prom")
    fake_nvml.gpus[1].lost = True
    await step(5.0, "GPU 1 falls off the bus")
    fake_nvml.down = 1  # the operator resets it: the driver state goes with it
    fake_nvml.gpus[1].lost = False
    await step(6.0, "NVML uninitialised by the reset: re-initialise")
    await step(7.0, "re-initialised: the lost GPU answers, it was reset; the latch clears")
    _check("reset_clears_xid", steps)
    assert steps[-1]["open_verdicts"] == []
    await agent.shutdown()


def test_golden_files_carry_no_wall_times() -> None:
    for path in GOLDEN.glob("*"):
        assert not re.search(r'"t": 1\.7\d{8}', path.read_text()), path
