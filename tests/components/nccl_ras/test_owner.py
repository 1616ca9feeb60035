"""Who listens on the RAS port: a listener owned by neither root nor a user of the queried job is never asked
— with a foreign listener presented through the injected socket table, and with real listening sockets."""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass, field

import pytest
from structlog.testing import capture_logs

from sentinel.components.nccl_ras.owner import (
    Listener,
    ProcSocketTable,
    listener_trusted,
    parse_listeners,
)
from tests.components.nccl_ras.rasserver import FakeRas
from tests.components.nccl_ras.test_collector import Sink, _finish, collector, query_once
from tests.components.nccl_ras.test_ras import load

# a /proc/net/tcp as the kernel writes it: listeners first (state 0A), then connections
TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:6D7C 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 52311 1 0 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1073 1 0 100 0 0 10 0
   2: 00000000:6D7C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1074 1 0 100 0 0 10 0
   3: garbage
   4: 0100007F:6D7C 0100007F:BBE0 01 00000000:00000000 00:00000000 00000000  4242        0 999 1 0 20 4 30 10 -1
   5: 0100007F:6D7C 00000000:0000 0A 00000000:00000000 00:00000000 00000000  4242        0 998 1 0 100 0 0 10 0
"""


def test_the_listeners_of_a_port_with_their_owners() -> None:
    # 0x6D7C = 28028; the line after the first connection is not a listener the kernel would list there
    assert parse_listeners(TABLE, 28028) == [Listener(uid=1001, inode=52311), Listener(uid=0, inode=1074)]
    assert parse_listeners(TABLE, 22) == [Listener(uid=0, inode=1073)]
    assert parse_listeners("", 28028) == []


@dataclass
class ForeignTable:
    """The OS as a test presents it: whoever listens on the port, and each process's uid."""

    listener_uid: int | None = None  # the uid of the port's listener (None: nothing listens)
    uids: dict[int, int] = field(default_factory=dict)  # pid → uid
    ports: set[int] | None = None  # the ports it listens on (None: any)

    def listeners(self, port: int) -> list[Listener]:
        if self.listener_uid is None or (self.ports is not None and port not in self.ports):
            return []
        return [Listener(uid=self.listener_uid, inode=1)]

    def uid_of(self, pid: int) -> int | None:
        return self.uids.get(pid)


def test_trust_root_or_a_user_of_the_job() -> None:
    uids = {10: 1001, 11: 1001}
    assert listener_trusted(ForeignTable(0, uids), 1, [10]).trusted  # root
    assert listener_trusted(ForeignTable(1001, uids), 2, [10, 11]).trusted  # the job's user
    untrusted = listener_trusted(ForeignTable(4242, uids), 3, [10, 11])
    assert not untrusted.trusted and untrusted.uids == (4242,) and "uid 4242" in untrusted.why
    assert not listener_trusted(ForeignTable(1001, uids), 2, []).trusted  # no job process here: nobody
    nothing = listener_trusted(ForeignTable(1001, uids, ports={2}), 9, [10])
    assert not nothing.trusted and nothing.uids == ()


async def test_a_foreign_listener_is_never_asked_and_is_logged_counted_once() -> None:
    server = FakeRas(answer=load("docs_dead.txt"))
    port = await server.start()
    table = ForeignTable(listener_uid=4242, uids={os.getpid(): 1001})
    sink = Sink(["job-1"], pids=[os.getpid()])
    c = collector(sink, port, sockets=table)
    try:
        with capture_logs() as logs:
            for t in (0.0, 100.0):  # each attempt after the back-off
                await c.collect(t)
                await _finish(c)
                await c.collect(t + 1.0)
    finally:
        await server.close()
    assert server.commands == [] and sink.got == []  # not one byte sent to it, nothing shipped
    assert c.metrics.queries["untrusted"] == 2 and c.metrics.queries["ok"] == 0
    (line,) = [e for e in logs if e["event"] == "nccl_ras_listener_untrusted"]
    assert line["owner_uids"] == [4242] and line["job"] == "job-1" and line["log_level"] == "error"
    text = "".join(m.name + str(s) for m in c.metrics.collect() for s in m.samples)
    assert "untrusted" in text
    await c.collect(150.0)
    assert c._task is None  # backed off like a refused connection


async def test_the_jobs_own_listener_is_asked() -> None:
    sink = Sink(["job-1"], pids=[4321])
    server = FakeRas(answer=load("docs_dead.txt"))
    c = await query_once(server, sink, sockets=ForeignTable(listener_uid=1001, uids={4321: 1001}))
    assert c.metrics.queries["ok"] == 1 and sink.got[0].dead_process_count == 1


def _listen_as(uid: int) -> tuple[int, int, int]:
    """A real listening socket on 127.0.0.1 owned by ``uid``: a forked child that drops to that user,
    listens and waits. Returns (pid, port, the fd that ends it when closed)."""
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing but system calls, then _exit
        try:
            os.close(ready_r)
            os.close(stop_w)  # so the parent closing its end is the child's EOF
            os.setgid(uid)
            os.setuid(uid)
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            os.write(ready_w, str(listener.getsockname()[1]).encode())
            os.read(stop_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(stop_r)
    port = int(os.read(ready_r, 16))
    os.close(ready_r)
    return pid, port, stop_w


async def test_real_sockets_a_listener_of_another_user_is_refused() -> None:
    table = ProcSocketTable()
    with socket.socket() as own:
        own.bind(("127.0.0.1", 0))
        own.listen()
        port = own.getsockname()[1]
        (mine,) = await asyncio.to_thread(table.listeners, port)
        assert mine.uid == os.geteuid()
        assert listener_trusted(table, port, [os.getpid()]).trusted
    if os.geteuid() != 0:
        assert not listener_trusted(table, port, []).trusted
        pytest.skip("a listener of another user needs root to start")
    child, port, stop = _listen_as(65534)
    try:
        (theirs,) = table.listeners(port)
        assert theirs.uid == 65534
        refused = listener_trusted(table, port, [os.getpid()])  # the job runs as root, the listener not
        assert not refused.trusted and "uid 65534" in refused.why
        assert listener_trusted(table, port, [child]).trusted  # the job's own user listens
    finally:
        os.close(stop)
        os.waitpid(child, 0)
