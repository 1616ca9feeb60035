"""The Flight Recorder collectors: live FR heads from the probe socket (``probe``) and the dump files the
ranks write (``fr_dumps``).

A simulated host's probe datagrams go through the same validation and authorisation as the real socket's.
"""

from __future__ import annotations

from sentinel.agent.collectors.base import AgentSink
from sentinel.agent.frdump import FrDumpWatcher
from sentinel.agent.probe import ProbeServer
from sentinel.agent.source import DatagramFeed
from sentinel.components.collector import Collector


class ProbeCollector(Collector):
    """FR heads the probe socket received this tick (a simulated host's datagrams go through the same
    validation and authorisation first)."""

    name = "probe"

    def __init__(
        self, sink: AgentSink, server: ProbeServer, tick_s: float, feed: DatagramFeed | None = None
    ) -> None:
        super().__init__(tick_s)
        self.sink = sink
        self.server = server
        self.feed = feed

    async def collect(self, now: float) -> None:
        if self.feed is not None:
            for data, creds in self.feed.receive(now):
                self.server.receive(data, creds)
        self.sink.counters.queue_depth["probe"] = len(self.server)
        self.sink.add_heads(self.server.drain())
        self.sink.counters.drop_parts["probe_socket"] = self.server.rejected + self.server.overflowed

    def close(self) -> None:
        super().close()
        self.server.close()


class FrDumpCollector(Collector):
    name = "fr_dumps"

    def __init__(self, sink: AgentSink, watcher: FrDumpWatcher, interval_s: float) -> None:
        super().__init__(interval_s)
        self.sink = sink
        self.watcher = watcher

    async def collect(self, now: float) -> None:
        for event in await self.blocking(lambda: self.watcher.poll(now)):
            self.sink.add_event(event)
