"""What persisting every host's dedup window costs the state store at 6,144 hosts (one flush's worth).

Each flush writes one ``fleet_seqs`` record per host that sent a batch since the last one — every host at
1 Hz. Measured: the snapshot on the event loop and the commit on the writer thread, for contiguous windows
(the normal case) and for windows holding a gap (the most ``seq_above`` a host can carry, DEDUP_WINDOW
seqs), against the reference of the same flush without the window holder. Prints its figures.

    .venv/bin/python bench/state_store.py [--hosts 6144] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sentinel.aggregator.latches import FleetLatches, FleetSeqWindows
from sentinel.aggregator.state import DEDUP_WINDOW, FleetState, HostView
from sentinel.aggregator.store import StateHolder, StateStore


def _fleet(hosts: int) -> FleetState:
    fleet = FleetState()
    for i in range(hosts):
        name = f"host{i:05d}"
        fleet.hosts[name] = HostView(name=name, boot_id=f"boot-{i:036d}", seq_hw=1_000_000)
    return fleet


def _round(store: StateStore, fleet: FleetState, holder: StateHolder, gap: bool) -> tuple[float, float]:
    for host in fleet.hosts.values():
        host.seq_hw += 1
        if gap:  # a seq that never came: every later one stays above the mark, up to DEDUP_WINDOW of them
            host.seq_above = set(range(host.seq_hw + 2, host.seq_hw + 2 + DEDUP_WINDOW))
        fleet.window_changed.add(host.name)
    started = time.perf_counter()
    changes = holder.snapshot()
    snap = time.perf_counter() - started
    started = time.perf_counter()
    store._commit([(holder.state_name, False, changes)])  # the writer thread's work, timed on its own
    return snap, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=6144)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(Path(tmp))
        fleet = _fleet(args.hosts)
        latches = FleetLatches(fleet)
        store._commit([(latches.state_name, True, latches.snapshot(full=True))])
        windows = FleetSeqWindows(fleet)
        for gap in (False, True):
            rounds = [_round(store, fleet, windows, gap) for _ in range(args.rounds)]
            snap = statistics.median(r[0] for r in rounds)
            commit = statistics.median(r[1] for r in rounds)
            size = (Path(tmp) / "state.sqlite3").stat().st_size + (
                Path(tmp) / "state.sqlite3-wal"
            ).stat().st_size
            print(
                f"{args.hosts} hosts, {'gap (' + str(DEDUP_WINDOW) + ' seqs above)' if gap else 'contiguous'}: "
                f"snapshot {snap * 1e3:.1f} ms on the event loop, commit {commit * 1e3:.1f} ms on the writer; "
                f"db+wal {size / 1e6:.1f} MB"
            )
        # reference: one full latches flush (what a full snapshot of the fleet's hosts costs today)
        started = time.perf_counter()
        changes = latches.snapshot(full=True)
        snap = time.perf_counter() - started
        started = time.perf_counter()
        store._commit([(latches.state_name, True, changes)])
        print(
            f"reference, full fleet_hosts flush: snapshot {snap * 1e3:.1f} ms, commit {(time.perf_counter() - started) * 1e3:.1f} ms"
        )
        store.close()


if __name__ == "__main__":
    main()
