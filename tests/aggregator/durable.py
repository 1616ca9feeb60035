"""An aggregator process with its durable store, for the restart tests of the aggregator and of the
signals whose memory the store keeps (tests/components/<name>/test_store.py)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from sentinel.aggregator.engine import Engine
from sentinel.aggregator.latches import FleetLatches
from sentinel.aggregator.server import restore_holds
from sentinel.aggregator.state import HostView
from sentinel.aggregator.store import StateStore
from sentinel.components.xid.parse import xid_record
from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import Batch, GpuSample, Hello, XidOccurred
from tests.aggregator.helpers import sample


class Node:
    """One engine ("an aggregator process") with its store under ``state_dir``."""

    def __init__(self, state_dir: Path, now: float, config: AggregatorConfig | None = None) -> None:
        self.config = config or AggregatorConfig()
        self.engine = Engine(self.config)
        self.engine.book.restore_hold_s = restore_holds(self.config)
        self.store = StateStore(state_dir)
        self.restored = self.store.register(self.engine.book, now)
        self.restored += self.store.register(FleetLatches(self.engine.fleet), now)
        self.seq = 0
        self.views: dict[str, HostView] = {}

    def hello(self, message: Hello, now: float) -> None:
        self.views[message.host] = self.engine.hello(message, now)

    def send(self, host: str, t: float, samples: list[GpuSample] | None = None, **kwargs: object) -> None:
        samples = samples if samples is not None else [sample(i, t) for i in range(8)]
        self.seq += 1
        self.engine.ingest(self.views[host], Batch(seq=self.seq, t=t, samples=samples, **kwargs), t)  # type: ignore[arg-type]

    def persist(self) -> None:
        self.store.flush()
        assert self.store.wait_idle()

    def crash(self) -> None:
        """What a kill -9 leaves: only what was committed (no final flush)."""
        self.store.abandon()

    def open(self) -> list[tuple[str, str, str | None, int | None, str, float]]:
        return sorted(
            (v.id, v.kind, v.host, v.gpu, v.reason, v.opened_at) for v in self.engine.book.open.values()
        )


def xid(t: float, gpu: int, code: int, pid: int | None = None) -> XidOccurred:
    return XidOccurred(t=t, gpu=gpu, record=msgspec.structs.replace(xid_record(code), pid=pid))
