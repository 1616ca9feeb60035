"""The flight-recorder ring buffer: bounded by age and bytes, time-ordered snapshot document."""

from __future__ import annotations

import json

import msgspec

from sentinel.agent.ring import ENTRY_OVERHEAD, RingBuffer
from sentinel.components.xid.parse import xid_record
from sentinel.wire import GpuSample, NvLink, XidOccurred


def test_snapshot_document_shape_and_order() -> None:
    ring = RingBuffer("host-a", window_s=60, max_bytes=1 << 20)
    ring.append(10.0, "sample", GpuSample(gpu=0, t=10.0, temp_c=50.0))
    ring.append(12.0, "event", XidOccurred(t=12.0, gpu=0, record=xid_record(79)))
    ring.append(11.0, "sample", GpuSample(gpu=1, t=11.0))  # late arrival is placed in time order
    doc = json.loads(msgspec.json.encode(ring.snapshot(now=13.0)))  # one JSON document
    assert doc["command"] == "snapshot"  # typed: the answer says what it answers
    assert doc["host"] == "host-a"
    assert doc["window"] == [10.0, 13.0]
    assert [(e["t"], e["type"]) for e in doc["entries"]] == [
        (10.0, "sample"),
        (11.0, "sample"),
        (12.0, "event"),
    ]
    assert doc["entries"][0]["data"]["temp_c"] == 50.0
    assert doc["entries"][2]["data"]["record"]["xid"] == 79
    since = json.loads(msgspec.json.encode(ring.snapshot(now=13.0, since=11.5)))
    assert [e["t"] for e in since["entries"]] == [12.0] and since["window"] == [11.5, 13.0]


def test_age_bound() -> None:
    ring = RingBuffer("h", window_s=10, max_bytes=1 << 20)
    for t in range(30):
        ring.append(float(t), "sample", GpuSample(gpu=0, t=float(t)))
    times = [e.t for e in ring.snapshot(now=29.0).entries]
    assert times[0] == 19.0 and times[-1] == 29.0


def test_byte_bound_drops_oldest() -> None:
    ring = RingBuffer("h", window_s=10_000, max_bytes=20 * (ENTRY_OVERHEAD + 40))
    for t in range(1000):
        ring.append(float(t), "sample", GpuSample(gpu=0, t=float(t), temp_c=1.0))
    assert ring.size_bytes <= ring.max_bytes
    entries = ring.snapshot(now=999.0).entries
    assert 5 < len(entries) < 25
    assert entries[-1].t == 999.0 and ring.evicted == 1000 - len(entries)


def test_samples_are_kept_smaller_than_their_msgpack_and_come_back_whole() -> None:
    samples = [
        GpuSample(
            gpu=gpu,
            t=float(t),
            util_gpu_pct=90.0 + t,
            mem_used_bytes=60 << 30,
            temp_c=60.0 + gpu,
            power_w=600.5,
            pids=[1000 + gpu],
            nvlink=[NvLink(link=link, crc_errors=t, replay_errors=1) for link in range(18)],
        )
        for t in range(20)
        for gpu in range(8)
    ]
    ring = RingBuffer("h", window_s=10_000, max_bytes=1 << 24)
    encoded = ring.extend("sample", [(s.t, s) for s in samples])
    assert encoded == [msgspec.msgpack.encode(s) for s in samples]  # the frame gets the msgpack itself
    assert ring.size_bytes < sum(map(len, encoded)) / 2
    assert [e.data for e in ring.snapshot(now=20.0).entries] == samples


def test_a_ticks_samples_and_events_come_back_in_time_order() -> None:
    ring = RingBuffer("h", window_s=20, max_bytes=1 << 20)
    ring.extend("event", [(4.5, XidOccurred(t=4.5, gpu=1, record=xid_record(79)))])
    ring.extend("sample", [(4.0, GpuSample(gpu=0, t=4.0)), (5.0, GpuSample(gpu=1, t=5.0))])
    ring.extend("sample", [(14.2, GpuSample(gpu=0, t=14.2)), (14.9, GpuSample(gpu=1, t=14.9))])
    assert len(ring) == 5
    snapshot = ring.snapshot(now=15.0)
    assert [(e.t, type(e).__name__) for e in snapshot.entries] == [
        (4.0, "SampleEntry"),
        (4.5, "EventEntry"),
        (5.0, "SampleEntry"),
        (14.2, "SampleEntry"),
        (14.9, "SampleEntry"),
    ]
    assert snapshot.window == (4.0, 15.0)
    assert [e.t for e in ring.snapshot(now=15.0, since=14.5).entries] == [14.9]
    # the age bound holds per sample, although a tick's samples are stored together
    assert [e.t for e in ring.snapshot(now=24.6).entries] == [5.0, 14.2, 14.9]


def test_samples_in_blocks_and_not_yet_in_one_come_back_in_the_order_they_came() -> None:
    # a small byte bound makes blocks of a few ticks: some samples are in sealed blocks, the newest not yet
    ring = RingBuffer("h", window_s=1000, max_bytes=1 << 18)
    expected: list[tuple[float, str, int]] = []
    for tick in range(200):
        t = float(tick)
        ring.extend("sample", [(t, GpuSample(gpu=gpu, t=t, temp_c=40.0 + tick)) for gpu in range(4)])
        expected += [(t, "SampleEntry", gpu) for gpu in range(4)]
        if tick % 7 == 0:  # an event at the tick's own time goes after that tick's samples, as it came
            ring.extend("event", [(t, XidOccurred(t=t, gpu=tick % 4, record=xid_record(79)))])
            expected.append((t, "EventEntry", tick % 4))
    # both kinds of storage are exercised: sealed blocks and samples not in one yet
    assert ring._pending and sum(1 for e in ring._entries if e[1] == "sample") > 1
    entries = ring.snapshot(now=199.0).entries
    assert [(e.t, type(e).__name__, getattr(e.data, "gpu", None)) for e in entries] == expected
    assert all(e.data.temp_c == 40.0 + e.t for e in entries if isinstance(e.data, GpuSample))
    assert len(ring) == len(expected) and ring.size_bytes <= ring.max_bytes


def test_byte_bound_holds_with_blocks_being_filled() -> None:
    ring = RingBuffer("h", window_s=10_000, max_bytes=1 << 16)
    for tick in range(3000):
        t = float(tick)
        ring.extend("sample", [(t, GpuSample(gpu=gpu, t=t, temp_c=float(tick % 50))) for gpu in range(8)])
        assert ring.size_bytes <= ring.max_bytes
    entries = ring.snapshot(now=2999.0).entries
    assert entries[-1].t == 2999.0 and ring.evicted == 8 * 3000 - len(entries) == 8 * 3000 - len(ring)
    times = [e.t for e in entries]
    assert times == sorted(times) and len(set(times)) * 8 == len(times)  # whole ticks, oldest gone first
