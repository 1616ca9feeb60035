"""An ack means the fact is on disk: a commit the disk refuses is kept, retried and alerted, and the batches
it covers stay unacked until it succeeds; a database the store does not recognise stops the start-up.

The disk refuses for real: SQLite itself runs out of room (``max_page_count``, the same "database or disk
is full" a full file system gives), or, as root, the state directory is a small tmpfs filled to the last
byte while a real aggregator process runs.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import msgspec
import pytest

from sentinel.aggregator.acks import DurableAcks
from sentinel.aggregator.store import StateStore, StoreSchemaError, sqlite_connect
from sentinel.components.xid.parse import xid_record
from sentinel.config.aggregator import AggregatorConfig
from sentinel.wire import Ack, Batch, XidOccurred, decode_aggregator_frame, encode
from tests.aggregator.helpers import TOKEN, agent, batch, hello, running_aggregator, sample, wait_until
from tests.aggregator.procs import AggregatorProcess


class Quota:
    """Opens the store's database and can make SQLite refuse to grow it (``PRAGMA max_page_count``)."""

    def __init__(self) -> None:
        self.db: sqlite3.Connection | None = None

    def connect(self, path: Path) -> sqlite3.Connection:
        self.db = sqlite_connect(path)
        return self.db

    def full(self) -> None:
        assert self.db is not None
        (pages,) = self.db.execute("PRAGMA page_count").fetchone()
        self.db.execute(f"PRAGMA max_page_count={pages}")

    def room(self) -> None:
        assert self.db is not None
        self.db.execute("PRAGMA max_page_count=1073741823")


class Records:
    """A state holder whose records the test sets (large values: each needs new pages)."""

    state_name = "test"

    def __init__(self) -> None:
        self.changed: dict[str, bytes | None] = {}
        self.restored: dict[str, bytes] = {}

    def put(self, key: str, size: int = 20_000) -> None:
        self.changed[key] = key.encode() * (size // len(key))

    def snapshot(self, full: bool = False) -> dict[str, bytes | None]:
        out, self.changed = self.changed, {}
        return out

    def restore(self, records: dict[str, bytes], now: float) -> None:
        self.restored = records


def _stored(state_dir: Path) -> set[str]:
    """The keys on disk, read the way a second process reads them."""
    with sqlite3.connect(f"file:{state_dir / 'state.sqlite3'}?mode=ro", uri=True) as db:
        return {key for (key,) in db.execute("SELECT key FROM records WHERE holder='test'")}


def _until(predicate: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def _store(tmp_path: Path, quota: Quota) -> tuple[StateStore, Records]:
    store = StateStore(tmp_path, connect=quota.connect, retry_initial_s=0.01, retry_max_s=0.05)
    records = Records()
    store.register(records, 0.0)
    return store, records


def test_a_commit_the_disk_refuses_is_kept_retried_and_written_once_there_is_room(tmp_path: Path) -> None:
    quota = Quota()
    store, records = _store(tmp_path, quota)
    records.put("before")
    store.flush()
    assert store.wait_idle()
    quota.full()
    records.put("xid79")
    store.flush()
    refused = store.generation
    _until(lambda: store.commit_failures >= 3)  # retried, each attempt counted
    assert store.committed < refused and store.uncommitted_records == 1 and store.commit_lag() > 0
    records.put("later")  # flushed while failing: folded into what is kept, one record per key
    records.put("xid79", 30_000)
    store.flush()
    assert store.uncommitted_records == 2
    assert _stored(tmp_path) == {"before"}
    quota.room()
    assert store.wait_committed(store.generation)
    assert _stored(tmp_path) == {"before", "xid79", "later"}
    assert store.uncommitted_records == 0 and store.commit_lag() == 0
    assert store.write_errors == store.commit_failures >= 3
    assert store.close()


def test_the_shutdown_flush_retries_until_the_disk_takes_it(tmp_path: Path) -> None:
    quota = Quota()
    store, records = _store(tmp_path, quota)
    quota.full()
    records.put("last")
    result: list[bool] = []
    closing = threading.Thread(target=lambda: result.append(store.close(timeout_s=30.0)))
    closing.start()
    _until(lambda: store.commit_failures >= 2)
    assert closing.is_alive()  # still retrying, not given up
    quota.room()
    closing.join(30.0)
    assert result == [True]
    assert _stored(tmp_path) == {"last"}


def test_a_shutdown_the_disk_never_allows_says_so_and_leaves_the_last_commit(tmp_path: Path) -> None:
    quota = Quota()
    store, records = _store(tmp_path, quota)
    records.put("kept")
    store.flush()
    assert store.wait_idle()
    quota.full()
    records.put("refused")
    assert store.close(timeout_s=0.3) is False
    assert store.commit_failures >= 2
    assert _stored(tmp_path) == {"kept"}


class Sink:
    """Acks as the agent's socket receives them."""

    def __init__(self) -> None:
        self.closed = False
        self.acks: list[int] = []

    def send(self, payload: bytes) -> None:
        frame = decode_aggregator_frame(payload)
        assert isinstance(frame, Ack)
        self.acks.append(frame.seq)


async def test_an_ack_waits_for_the_commit_of_what_its_batch_changed(tmp_path: Path) -> None:
    quota = Quota()
    store, records = _store(tmp_path, quota)
    acks = DurableAcks(store, delay_s=0.01)
    sink = Sink()
    quota.full()
    records.put("xid79")  # what applying batch 7 changed
    acks.hold(sink, 7)
    await wait_until(lambda: store.commit_failures >= 2)
    assert sink.acks == [] and acks.waiting == 1
    records.put("next")
    acks.hold(sink, 8)
    quota.room()
    await wait_until(lambda: sink.acks == [7, 8])
    assert _stored(tmp_path) == {"xid79", "next"} and acks.waiting == 0
    # a resend of an applied batch changes nothing: its ack still follows a commit, which is immediate
    acks.hold(sink, 7)
    await wait_until(lambda: sink.acks == [7, 8, 7])
    acks.close()
    assert store.close()


async def test_acks_of_a_stream_that_ended_are_dropped_not_kept(tmp_path: Path) -> None:
    quota = Quota()
    store, records = _store(tmp_path, quota)
    acks = DurableAcks(store, delay_s=0.01)
    gone, alive = Sink(), Sink()
    quota.full()
    records.put("a")
    acks.hold(gone, 1)
    acks.hold(alive, 1)
    await wait_until(lambda: store.commit_failures >= 1)
    acks.forget(gone)  # the stream ended: the agent resends on its next connection
    assert acks.waiting == 1
    quota.room()
    await wait_until(lambda: alive.acks == [1])
    assert gone.acks == []
    acks.close()
    assert store.close()


def test_a_foreign_records_table_is_refused_in_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE records (id INTEGER PRIMARY KEY, payload TEXT)")
        db.execute("INSERT INTO records (payload) VALUES ('someone else''s')")
    with pytest.raises(StoreSchemaError) as raised:
        StateStore(tmp_path)
    message = str(raised.value)
    assert "\n" not in message and str(path) in message and "'records' has columns (id, payload)" in message
    with sqlite3.connect(path) as db:  # left as it was: nothing created, nothing deleted
        assert db.execute("SELECT payload FROM records").fetchall() == [("someone else's",)]
        assert [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["records"]


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("CREATE TABLE users (name TEXT)", "no 'meta'"),
        ("CREATE TABLE meta (name TEXT, value TEXT); CREATE TABLE records (holder, key, value)", "no schema"),
        (
            "CREATE TABLE meta (name TEXT, value TEXT); CREATE TABLE records (holder, key, value);"
            "INSERT INTO meta VALUES ('schema', '99')",
            "schema version 99",
        ),
    ],
)
def test_any_schema_the_store_does_not_read_is_refused(tmp_path: Path, setup: str, expected: str) -> None:
    with sqlite3.connect(tmp_path / "state.sqlite3") as db:
        db.executescript(setup)
    with pytest.raises(StoreSchemaError, match=expected):
        StateStore(tmp_path)


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state.sqlite3").write_bytes(b"not sqlite at all, " * 100)
    with pytest.raises(StoreSchemaError, match="not an SQLite database"):
        StateStore(tmp_path)


# -- a real full file system under a real aggregator process ---------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs as the aggregator's state directory (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a real full file system) needs root")
    mountpoint = tmp_path / "state"
    mountpoint.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mountpoint)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def _fill(directory: Path) -> Path:
    """Write a file until the file system has no byte left."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


async def _acks(ws: aiohttp.ClientWebSocketResponse, timeout: float, until: int = 0) -> list[int]:
    """The acks received within ``timeout`` (or until ``until`` came); commands (verdict pushes) are skipped."""
    acks: list[int] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0 and not (until and len(acks) >= until):
        try:
            message = await ws.receive(timeout=left)
        except TimeoutError:
            break
        frame = decode_aggregator_frame(message.data)
        if isinstance(frame, Ack):
            acks.append(frame.seq)
    return acks


def _metric(aggregator: AggregatorProcess, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(aggregator.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


async def test_a_full_disk_withholds_the_ack_and_the_verdict_survives_a_restart(
    tmp_path: Path, small_fs: Path
) -> None:
    """The attack: the state directory full while an Xid 79 batch arrives. Its verdict opens at once; its ack
    waits for the commit; space returns, the ack comes, and after a kill -9 the verdict is still there."""
    aggregator = AggregatorProcess(tmp_path)
    assert aggregator.state_dir == small_fs
    try:
        aggregator.start()
        t0 = time.time()
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(aggregator.stream_url, headers={"Authorization": f"Bearer {TOKEN}"}) as ws,
        ):
            await ws.send_bytes(encode(hello("h0")))
            await ws.send_bytes(encode(Batch(seq=1, t=t0, samples=[sample(i, t0) for i in range(8)])))
            assert await _acks(ws, 15.0, until=1) == [1]
            filler = _fill(small_fs)
            xid = XidOccurred(t=t0 + 1, gpu=3, record=xid_record(79))
            await ws.send_bytes(encode(Batch(seq=2, t=t0 + 1, events=[xid])))
            await wait_until(
                lambda: _metric(aggregator, "sentinel_aggregator_state_commit_failures_total") >= 2
            )
            (opened,) = aggregator.get("/api/v1/verdicts?state=open")["verdicts"]
            assert (opened["host"], opened["gpu"], opened["reason"]) == ("h0", 3, "xid_79")
            assert _metric(aggregator, "sentinel_aggregator_acks_waiting") == 1
            assert await _acks(ws, 0.3) == []  # the commit failed: no ack may have been sent
            filler.unlink()  # space returns: the kept commit is retried and the ack follows it
            assert await _acks(ws, 15.0, until=1) == [2]
        aggregator.kill()
        aggregator.start()
        (restored,) = aggregator.get("/api/v1/verdicts?state=open")["verdicts"]
        assert (restored["id"], restored["opened_at"]) == (opened["id"], opened["opened_at"])
    finally:
        aggregator.close()


async def test_a_stream_waiting_only_for_its_acks_is_not_closed_as_idle(small_fs: Path) -> None:
    """The agent stops at its in-flight limit while the disk refuses: it sends nothing, yet it is not idle.
    Closing it would only make it resend what this stream already holds."""
    config = msgspec.convert({"limits": {"idle_timeout_s": 0.3}}, AggregatorConfig)
    async with running_aggregator(small_fs, config) as running, agent(running, "h0") as conn:
        store = running.aggregator.store
        assert store is not None
        t = time.time()
        await conn.send(batch(1, t))
        assert await conn.ack() == 1
        filler = _fill(small_fs)
        await conn.send(Batch(seq=2, t=t + 1, events=[XidOccurred(t=t + 1, gpu=1, record=xid_record(79))]))
        # retries after 50, 100, 200, 400 and 800 ms: more than five idle timeouts without a frame
        await wait_until(lambda: store.commit_failures >= 6, timeout=30)
        assert not conn.ws.closed and "h0" in running.aggregator.by_host
        filler.unlink()
        assert await conn.ack(timeout=15) == 2
        # acked and silent: now it is idle
        await wait_until(lambda: "h0" not in running.aggregator.by_host)
