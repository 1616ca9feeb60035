"""The frame built from the ring buffer's bytes is the frame the batch encodes to, shrunk or not."""

from __future__ import annotations

import pytest

from sentinel.agent.batch import Encoded, fit_frame
from sentinel.agent.ring import RingBuffer
from sentinel.components.xid.parse import xid_record
from sentinel.fr.heads import FrHeads, PgHead
from sentinel.wire import Batch, Drops, Event, GpuSample, LogLine, NvLink, ProcInfo, XidOccurred, encode


def _batch(heads: int, events: int, text: int = 40) -> Batch:
    samples = [
        GpuSample(gpu=i, t=5.0, temp_c=60.0 + i, pids=[100 + i], nvlink=[NvLink(link=0, crc_errors=i)])
        for i in range(8)
    ]
    evs: list[Event] = [XidOccurred(t=4.0, gpu=1, record=xid_record(79))]
    evs += [LogLine(t=5.0, text="x" * text + str(i)) for i in range(events)]
    pgs = [PgHead(pg_name="tp0", ranks=list(range(256)))]
    return Batch(
        seq=7,
        t=5.0,
        samples=samples,
        events=evs,
        heads=[FrHeads(rank=r, t=5.0, host="h", pgs=pgs) for r in range(heads)],
        procs=[ProcInfo(gpu=0, pid=100, job_id="j", rank=0)],
        drops=Drops(samples=3),
    )


def _encoded(batch: Batch) -> Encoded:
    ring = RingBuffer("h", window_s=60, max_bytes=1 << 30)
    return Encoded(
        samples=ring.extend("sample", [(s.t, s) for s in batch.samples]),
        events=ring.extend("event", [(e.t, e) for e in batch.events]),
        heads=ring.extend("heads", [(batch.t, h) for h in batch.heads]),
    )


@pytest.mark.parametrize(
    ("heads", "events", "max_bytes"),
    [
        (4, 3, 1 << 20),  # fits: nothing cut
        (64, 40, 20_000),  # heads halved until it fits
        (64, 400, 8_000),  # every head gone, then events halved
    ],
)
def test_frame_from_the_ring_bytes_is_the_plain_encoding(heads: int, events: int, max_bytes: int) -> None:
    batch = _batch(heads, events)
    plain = fit_frame(batch, max_bytes)
    spliced = fit_frame(batch, max_bytes, _encoded(batch))
    assert spliced.data == plain.data
    assert (spliced.heads_cut, spliced.events_cut) == (plain.heads_cut, plain.events_cut)
    assert spliced.batch == plain.batch
    assert encode(spliced.batch) == spliced.data  # the frame says what the returned batch holds
    assert len(spliced.data) <= max_bytes
    assert (plain.heads_cut > 0, plain.events_cut > 0) == (max_bytes < 1 << 20, events == 400)


def test_encoded_parts_of_another_batch_are_refused() -> None:
    batch = _batch(4, 3)
    with pytest.raises(ValueError):
        fit_frame(batch, 1 << 20, _encoded(_batch(3, 3)))
