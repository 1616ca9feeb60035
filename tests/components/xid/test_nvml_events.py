"""The xid signal through the real NVML code path: Xids from NVML's event set, and one Xid reported by NVML
and by the kernel log merged into one event with the line's detail."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sentinel.agent import Agent
from sentinel.agent.nvml import NvmlSource
from sentinel.wire import XidOccurred
from tests.agent.conftest import make_config
from tests.agent.fakenvml import FakeNvml
from tests.support import sent


async def test_xid_events_through_the_event_set(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    agent = Agent(make_config(tmp_path), NvmlSource())
    await agent.step(1.0)
    fake_nvml.push_xid(1, 79)
    fake_nvml.push_xid(0, 13)
    events: list[XidOccurred] = []
    deadline = time.monotonic() + 5
    while len(events) < 2 and time.monotonic() < deadline:
        batch = sent(await agent.step())
        events += [e for e in batch.events if isinstance(e, XidOccurred)]
        await asyncio.sleep(0.05)
    assert sorted((e.gpu, e.record.xid, e.severity) for e in events) == [
        (0, 13, "warning"),
        (1, 79, "critical"),
    ]
    text = agent.render_metrics().decode()
    assert any(
        line.startswith("sentinel_gpu_xid_events_total{") and 'gpu="1"' in line and 'xid="79"' in line
        for line in text.splitlines()
    )
    await agent.shutdown()


async def test_nvml_and_kernel_reports_of_one_xid_become_one_event_with_the_lines_detail(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    config = make_config(
        tmp_path, kmsg={"enabled": True, "path": str(kmsg)}, collect={"xid_merge_wait_s": 5.0}
    )
    agent = Agent(config, NvmlSource())
    await agent.step(1.0)
    fake_nvml.push_xid(0, 149)  # NVML's bare report comes first ...
    deadline = time.monotonic() + 5
    while not len(agent.xids) and time.monotonic() < deadline:
        await agent.step()
        await asyncio.sleep(0.02)
    assert len(agent.xids) == 1  # ... and waits for the kernel's
    nvml_t = agent.xids._pending[(0, 149)][1].t
    line = "NVRM: Xid (PCI:0000:18:00): 149, pid=4242, name=python3, Nonfatal NETIR_LINK_EVT, Link 02\n"
    with kmsg.open("a") as f:
        f.write(line)
    batch = sent(await agent.step())
    [event] = [e for e in batch.events if isinstance(e, XidOccurred)]
    assert (event.gpu, event.record.xid, event.severity, event.t) == (0, 149, "warning", nvml_t)
    assert event.record.pid == 4242 and event.merged is True and "Nonfatal" in event.text
    await agent.shutdown()


async def test_a_flood_of_one_xid_line_is_one_event_per_window_with_its_count(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    """5,000 copies of one Xid 95 line: the first is sent at once, the rest as one event counting them."""
    kmsg = tmp_path / "kmsg"
    line = "NVRM: Xid (PCI:0000:18:00): 95, pid=4242, name=python3, Uncontained memory error\n"
    kmsg.write_text("")
    config = make_config(
        tmp_path,
        kmsg={"enabled": True, "path": str(kmsg)},
        collect={"xid_merge_wait_s": 0.0, "xid_flood_window_s": 10.0, "nvml_events": False},
    )
    agent = Agent(config, NvmlSource())
    await agent.step(1.0)
    with kmsg.open("a") as f:
        f.write(line * 5000)
    events: list[XidOccurred] = []
    for now in (2.0, 3.0, 4.0, 13.0, 14.0, 30.0):
        batch = sent(await agent.step(now))
        events += [e for e in batch.events if isinstance(e, XidOccurred)]
    assert [(e.gpu, e.record.xid, e.count) for e in events] == [(0, 95, 1), (0, 95, 4999)]
    assert events[1].record.pid == 4242
    with kmsg.open("a") as f:  # the same line after the flood ended: sent at once again
        f.write(line)
    batch = sent(await agent.step(31.0))
    assert [e.count for e in batch.events if isinstance(e, XidOccurred)] == [1]
    await agent.shutdown()
