"""Each host's dedup window survives a restart with the state it covers, and gaps that cannot fill close."""

from __future__ import annotations

from pathlib import Path

import msgspec

from sentinel.aggregator.latches import FleetLatches, FleetSeqWindows
from sentinel.aggregator.state import FleetState, HostView
from sentinel.aggregator.store import StateStore
from sentinel.wire import Batch
from tests.aggregator.helpers import hello


class Process:
    """One aggregator process's fleet with its store, registered as the server registers them."""

    def __init__(self, state_dir: Path) -> None:
        self.fleet = FleetState()
        self.store = StateStore(state_dir)
        self.store.register(FleetLatches(self.fleet), 0.0)
        self.store.register(FleetSeqWindows(self.fleet), 0.0)

    def connect(
        self, host: str = "h0", boot_id: str = "boot-1", next_seq: int = 0, instance_id: str = ""
    ) -> HostView:
        message = msgspec.structs.replace(
            hello(host), boot_id=boot_id, next_seq=next_seq, instance_id=instance_id
        )
        return self.fleet.hello(message, 0.0)

    def send(self, view: HostView, seqs: list[int]) -> list[bool]:
        """Which of ``seqs`` were applied (False: acked as a duplicate)."""
        return [self.fleet.apply(view, Batch(seq=seq, t=float(seq)), 1.0) for seq in seqs]

    def commit(self) -> None:
        self.store.flush(0.0)
        assert self.store.wait_idle()

    def crash(self) -> None:
        """What ``kill -9`` leaves: the database as last committed (the writer thread is simply abandoned)."""
        self.store.abandon()


def test_a_resend_after_a_crash_applies_only_what_the_last_commit_did_not_cover(tmp_path: Path) -> None:
    first = Process(tmp_path)
    view = first.connect()
    assert first.send(view, list(range(0, 10))) == [True] * 10
    first.commit()
    assert first.send(view, [10, 11]) == [True, True]  # applied, not committed: lost with the crash
    first.crash()

    second = Process(tmp_path)
    view = second.connect()
    # the agent resends from its oldest unacked batch (here: all of them again, acked or not)
    assert second.send(view, list(range(0, 14))) == [False] * 10 + [True] * 4
    assert (view.seq_hw, view.seq_above) == (13, set())


def test_a_gap_below_a_connections_first_batch_closes_instead_of_growing_the_window(tmp_path: Path) -> None:
    first = Process(tmp_path)
    view = first.connect()
    first.send(view, list(range(0, 5)))
    first.commit()
    first.send(view, [5, 6])  # acked, then the crash lost them: the agent will never send 5 and 6 again
    first.crash()

    second = Process(tmp_path)
    view = second.connect()
    assert second.send(view, [7, 9, 8, 4]) == [True, True, True, False]  # out of order within a stream: kept
    assert (view.seq_hw, view.seq_above) == (9, set())
    second.commit()
    second.crash()
    third = Process(tmp_path)
    assert (third.fleet.hosts["h0"].seq_hw, third.fleet.hosts["h0"].seq_above) == (9, set())


def test_a_window_of_another_boot_is_not_restored_onto_the_new_numbering(tmp_path: Path) -> None:
    first = Process(tmp_path)
    first.send(first.connect(), list(range(0, 100)))
    first.commit()
    first.crash()

    second = Process(tmp_path)
    view = second.connect(boot_id="boot-2", next_seq=0)  # reimaged: counts from 0 again
    assert second.send(view, [0, 1, 2]) == [True, True, True]


def test_the_agent_instance_a_window_belongs_to_survives_a_restart(tmp_path: Path) -> None:
    first = Process(tmp_path)
    first.send(first.connect(instance_id="agent-a-0001"), list(range(0, 100)))
    first.commit()
    first.crash()

    second = Process(tmp_path)
    assert second.fleet.hosts["h0"].instance_id == "agent-a-0001"
    view = second.connect(next_seq=50, instance_id="agent-a-0001")  # the same agent: resends are duplicates
    assert second.send(view, [50, 99, 100]) == [False, False, True]
    view = second.connect(next_seq=0, instance_id="agent-b-0002")  # reinstalled on the same boot
    assert second.send(view, [0, 1, 2]) == [True, True, True]
    second.commit()
    second.crash()
    third = Process(tmp_path)
    host = third.fleet.hosts["h0"]
    assert (host.instance_id, host.seq_hw) == ("agent-b-0002", 2)


def test_a_forgotten_hosts_window_is_deleted_from_the_store(tmp_path: Path) -> None:
    first = Process(tmp_path)
    first.send(first.connect("h0"), [0])
    first.send(first.connect("h1"), [0])
    first.commit()
    first.fleet.forget_host("h0")
    first.commit()
    first.crash()

    second = Process(tmp_path)
    assert set(second.fleet.hosts) == {"h1"}
    rows = second.store._db.execute("SELECT key FROM records WHERE holder='fleet_seqs'").fetchall()
    assert rows == [("h1",)]
