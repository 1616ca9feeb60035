"""The aggregator pushes a host's open verdicts back to its agent (for ``sentinel health``), on every change."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from sentinel.wire import Batch, Command, VerdictsRequest, decode_aggregator_frame
from tests.aggregator.helpers import agent, running_aggregator, sample

pytestmark = pytest.mark.timeout(30)


async def _next_verdicts(conn: object) -> VerdictsRequest:
    ws = conn.ws  # type: ignore[attr-defined]
    while True:
        msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        frame = decode_aggregator_frame(msg.data)
        if isinstance(frame, Command) and isinstance(frame.request, VerdictsRequest):
            return frame.request


async def test_open_and_closed_verdicts_reach_the_hosts_agent(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running, agent(running, "node-7", gpus=2) as conn:
        first = await _next_verdicts(conn)  # on connect: the current set (none)
        assert first.verdicts == []
        await conn.send(Batch(seq=1, t=1.0, samples=[sample(0, 1.0), sample(1, 1.0, state="lost")]))
        pushed = await _next_verdicts(conn)
        assert [(v.kind, v.reason, v.action, v.gpu) for v in pushed.verdicts] == [
            ("faulty", "gpu_lost", "reboot", 1)
        ]
        book = running.aggregator.engine.book
        assert pushed.verdicts[0].id == next(iter(book.open.values())).id
        await conn.send(Batch(seq=2, t=2.0, samples=[sample(0, 2.0), sample(1, 2.0)]))
        assert (await _next_verdicts(conn)).verdicts == []  # closed: the agent forgets it
