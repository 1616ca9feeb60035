"""Bounds on real sockets: what an agent reports it dropped is accounted, sizes and times are bounded."""

from __future__ import annotations

import time
from pathlib import Path

import structlog

from sentinel.wire import Drops
from tests.aggregator.helpers import agent, batch, running_aggregator


def reported_drops(running: object, host: str, what: str) -> float | None:
    registry = running.aggregator.metrics.registry  # type: ignore[attr-defined]
    return registry.get_sample_value(
        "sentinel_agent_reported_drops_total", {"cluster": "default", "host": host, "what": what}
    )


async def test_batch_drops_are_counted_per_host_and_logged(tmp_path: Path) -> None:
    async with running_aggregator(tmp_path) as running, agent(running, "host-a") as conn:
        with structlog.testing.capture_logs() as logs:
            for seq, drops in enumerate((Drops(samples=120, probe=3), Drops(samples=5), Drops(events=-7))):
                frame = batch(seq, time.time())
                frame.drops = drops
                await conn.send(frame)
                assert await conn.ack() == seq
            # a resend is not counted twice
            frame = batch(0, time.time())
            frame.drops = Drops(samples=120)
            await conn.send(frame)
            assert await conn.ack() == 0
        assert reported_drops(running, "host-a", "samples") == 125
        assert reported_drops(running, "host-a", "probe") == 3
        assert reported_drops(running, "host-a", "events") is None  # a negative count is nonsense, ignored
        lines = [e for e in logs if e["event"] == "agent_reported_drops"]
        assert len(lines) == 1 and lines[0]["host"] == "host-a"  # one line a minute per host, not per batch
