"""The xid signal's memory in the aggregator's store: a latched Xid and the policy's repeat history survive
a restart."""

from __future__ import annotations

from pathlib import Path

from sentinel.wire import GpuWasReset
from tests.aggregator.durable import Node, xid
from tests.aggregator.helpers import hello


def test_a_latched_xid_stays_open_across_a_restart_with_its_opened_time_and_closes_on_reset(
    tmp_path: Path,
) -> None:
    first = Node(tmp_path, 0.0)
    first.hello(hello("h0"), 0.0)
    first.send("h0", 5.0, events=[xid(5.0, 3, 79)])
    before = first.open()
    assert [(k, h, g, r) for _, k, h, g, r, _ in before] == [("faulty", "h0", 3, "xid_79")]
    first.persist()
    first.crash()

    second = Node(tmp_path, 100.0)
    assert second.open() == before  # same id, same opened_at (5.0), still open
    second.hello(hello("h0"), 101.0)  # the agent comes back with the same boot id: not a reboot
    for t in range(102, 110):
        second.send("h0", float(t))  # healthy readings do not clear a latched Xid 79
        second.engine.tick(float(t))
    assert second.open() == before
    second.send("h0", 110.0, events=[GpuWasReset(t=110.0, gpu=3)])
    assert second.open() == []
    closed = second.engine.book.by_id[before[0][0]]
    assert closed.closed_at == 110.0 and closed.close_reason == "evidence gone"
    # the next verdict gets a new id, not one the restored history already used
    second.send("h0", 111.0, events=[xid(111.0, 5, 79)])
    assert second.open()[0][0] != before[0][0]


def test_the_xid_policy_repeat_history_survives_so_the_third_process_makes_the_gpu_suspect(
    tmp_path: Path,
) -> None:
    first = Node(tmp_path, 0.0)
    first.hello(hello("h0"), 0.0)
    first.send("h0", 1.0, events=[xid(1.0, 2, 13, pid=101)])
    first.send("h0", 2.0, events=[xid(2.0, 2, 13, pid=102)])
    assert first.open() == []
    first.persist()
    first.crash()

    second = Node(tmp_path, 10.0)
    second.hello(hello("h0"), 10.0)
    second.send("h0", 11.0, events=[xid(11.0, 2, 13, pid=103)])
    assert [(k, g, r) for _, k, _, g, r, _ in second.open()] == [("degraded", 2, "xid_13_repeated")]
