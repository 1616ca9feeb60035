"""Hypothesis on the ingest path: arbitrary bytes and arbitrary well-typed frames never break the aggregator."""

from __future__ import annotations

import contextlib
import math

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.aggregator.engine import Engine
from sentinel.components.clocks.record import ClockViolations
from sentinel.components.xid.parse import XidRecord
from sentinel.fr.heads import FrHeads, InFlight, PgHead
from sentinel.wire import (
    Batch,
    Command,
    CommandResult,
    EccCounters,
    FrDumpAnswer,
    FrDumpRequest,
    FrDumpWritten,
    GpuSample,
    GpuStateChanged,
    GpuWasReset,
    Hello,
    LogLine,
    NvLink,
    ProcInfo,
    RowRemap,
    Snapshot,
    SnapshotRequest,
    VerdictsRequest,
    XidOccurred,
    decode_agent_frame,
    decode_aggregator_frame,
    encode,
)
from tests.aggregator.helpers import hello

floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
small = st.integers(min_value=-3, max_value=12)
seqs = st.integers(min_value=-(2**40), max_value=2**40)
times = st.one_of(st.floats(min_value=-1e3, max_value=1e6), st.just(math.inf), st.just(math.nan))

samples = st.builds(
    GpuSample,
    gpu=small,
    t=times,
    state=st.sampled_from(["ok", "lost", "unresponsive"]),
    util_gpu_pct=st.none() | floats,
    temp_c=st.none() | floats,
    power_w=st.none() | floats,
    sm_clock_mhz=st.none() | floats,
    throttle=st.lists(st.sampled_from(["gpu_idle", "hw_thermal_slowdown", "sw_power_cap", "??"]), max_size=3),
    pcie_replay=st.none() | st.integers(min_value=-5, max_value=2**40),
    ecc=st.none() | st.builds(EccCounters, volatile_uncorrected=st.none() | st.integers(-5, 2**40)),
    remap=st.none()
    | st.builds(RowRemap, pending=st.booleans(), failure=st.booleans(), hist_none=st.none() | small),
    nvlink=st.none()
    | st.lists(
        st.builds(
            NvLink,
            link=small,
            crc_errors=st.none() | st.integers(-5, 2**40),
            replay_errors=st.none() | st.integers(-5, 2**63),
            effective_errors=st.none() | st.integers(-5, 2**40),
            effective_ber=st.none() | floats,
        ),
        max_size=3,
    ),
    violations=st.none()
    | st.builds(
        ClockViolations,
        reference_us=st.integers(-(2**63), 2**63 - 1),
        power=st.none() | st.integers(-5, 2**63),
        thermal=st.none() | st.integers(-5, 2**63),
    ),
)
big_ints = st.integers(-(2**63), 2**63 - 1)
gpus = st.none() | small
xid_records = st.builds(
    XidRecord,
    xid=st.integers(min_value=-5, max_value=70000),
    pci_bus=st.none() | st.sampled_from(["0000:1b:00", "", "zz"]),
    pid=st.none() | big_ints,
    process=st.none() | st.text(max_size=20),
    previous_xid=st.none() | big_ints,
    gpu_instance=st.none() | big_ints,
    severity=st.sampled_from(["info", "warning", "critical"]),
    action=st.sampled_from(["none", "reset_gpu", "reboot", "rma"]),
    fatal=st.booleans(),
)
events = st.one_of(
    st.builds(XidOccurred, t=times, gpu=gpus, record=xid_records, text=st.text(max_size=80)),
    st.builds(
        LogLine,
        t=times,
        gpu=gpus,
        line_kind=st.sampled_from(["nccl_warn_net", "torch_watchdog_timeout", "nccl_warn_cuda", "other"]),
        reason=st.none() | st.sampled_from(["ib_link_down", "nccl_ib_completion_error", "x"]),
        rank=st.none() | big_ints,
        seq=st.none() | big_ints,
        pid=st.none() | big_ints,
        text=st.text(max_size=80),
    ),
    st.builds(
        GpuStateChanged,
        t=times,
        gpu=gpus,
        state=st.sampled_from(["ok", "lost", "unresponsive", "unavailable"]),
        previous=st.sampled_from(["ok", "lost", "unresponsive", "unavailable"]),
    ),
    st.builds(GpuWasReset, t=times, gpu=gpus),
    st.builds(FrDumpWritten, t=times, path=st.text(max_size=20), rank=st.none() | big_ints),
)
pg_heads = st.builds(
    PgHead,
    pg_name=st.sampled_from(["0", "tp0", "x"]),
    pg_desc=st.sampled_from(["default_pg", "tp", ""]),
    ranks=st.none() | st.lists(st.integers(-2, 20), max_size=5),
    last_enqueued_seq=seqs,
    last_completed_seq=seqs,
    in_flight=st.lists(
        st.builds(
            InFlight,
            seq=seqs,
            op=st.text(max_size=5),
            age_s=floats,
            p2p=st.booleans(),
            unconfirmed=st.booleans(),
        ),
        max_size=2,
    ),
)
heads = st.builds(
    FrHeads,
    rank=st.integers(-2, 20),
    t=times,
    job_id=st.none() | st.sampled_from(["j", "k"]),
    world_size=st.none() | st.integers(-1, 64),
    gpu=st.none() | small,
    pgs=st.lists(pg_heads, max_size=2),
)
procs = st.builds(
    ProcInfo,
    gpu=small,
    pid=st.integers(0, 10),
    job_id=st.none() | st.sampled_from(["j", "k"]),
    rank=st.none() | st.integers(-2, 20),
)
batches = st.builds(
    Batch,
    seq=seqs,
    t=times,
    samples=st.lists(samples, max_size=4),
    events=st.lists(events, max_size=3),
    procs=st.none() | st.lists(procs, max_size=3),
    heads=st.lists(heads, max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_decode_or_raise_a_msgspec_error(data: bytes) -> None:
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
        decode_agent_frame(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=200))
def test_mutated_valid_frames_decode_or_raise_a_msgspec_error(noise: bytes, at: int) -> None:
    frame = encode(Batch(seq=1, t=1.0, samples=[GpuSample(gpu=0, t=1.0, util_gpu_pct=50.0)]))
    at = min(at, len(frame))
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
        decode_agent_frame(frame[:at] + noise + frame[at + len(noise) :])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(st.lists(batches, min_size=1, max_size=6), st.booleans())
def test_any_well_typed_batches_never_break_the_engine(frames: list[Batch], rehello: bool) -> None:
    engine = Engine()
    view = engine.hello(hello("fuzz", 4), 0.0)
    now = 0.0
    for frame in frames:
        now += 1.0
        # frames go over the wire first: what the aggregator ingests is what the decoder produced
        decoded = decode_agent_frame(encode(frame))
        assert isinstance(decoded, Batch)
        engine.ingest(view, decoded, now)
        engine.tick(now)
        if rehello:
            view = engine.hello(Hello(host="fuzz", boot_id=f"b{now}"), now)
    engine.tick(now + 100.0)
    for verdict in engine.book.all():
        assert verdict.kind in ("faulty", "degraded", "stuck", "straggler", "host_silent")
        assert verdict.to_dict()["state"] in ("open", "closed")


def _nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


#: what a hostile agent can put where the schema expects a value: wrong tags, huge and boundary integers,
#: deep nesting, wrong containers, strings beyond the bounds
hostile_values = st.one_of(
    st.sampled_from(["xid", "log", "gpu_state", "gpu_reset", "fr_dump", "batch", "hello", "result", ""]),
    st.text(max_size=8),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1]),
    st.integers(1, 200).map(_nested),
    st.just("x" * 20000),
    st.just({"kind": "xid"}),
    st.just([None] * 300),
    st.none(),
    st.booleans(),
    floats,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(batches, min_size=1, max_size=1),
    st.sampled_from(["type", "seq", "t", "events", "samples", "heads"]),
    st.sampled_from(["kind", "t", "gpu", "record", "line_kind", "rank", "state", "text", "extra"]),
    hostile_values,
)
def test_hostile_values_anywhere_in_a_batch_decode_to_a_bounded_batch_or_a_msgspec_error(
    frames: list[Batch], top: str, inner: str, value: object
) -> None:
    """Structure-aware: a valid batch's builtins with one value swapped for a hostile one, at the top or in
    its first event — the one decoder answers with a typed, bounded Batch or a msgspec error, never more."""
    doc = msgspec.to_builtins(frames[0])
    assert isinstance(doc, dict)
    doc["type"] = "batch"
    events = doc.get("events") or []
    if events and inner != "extra":
        events[0][inner] = value
    else:
        doc[top] = value
    try:
        data = msgspec.msgpack.encode(doc)
    except (OverflowError, RecursionError, msgspec.EncodeError):
        return  # not even encodable as msgpack: no agent could send it
    try:
        frame = decode_agent_frame(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
    if isinstance(frame, Batch):
        assert len(frame.events) <= 1 << 18
        for event in frame.events:
            assert isinstance(event, XidOccurred | LogLine | GpuStateChanged | GpuWasReset | FrDumpWritten)
            assert len(event.text) <= 4 * 4096


def test_an_event_with_an_unknown_tag_is_refused_by_the_decoder() -> None:
    doc = msgspec.to_builtins(Batch(seq=1, t=1.0, events=[GpuWasReset(t=1.0, gpu=0)]))
    doc["events"][0]["kind"] = "reboot"  # no such event: the frame is refused as a whole, never half-read
    with pytest.raises(msgspec.ValidationError, match="Invalid value 'reboot'"):
        decode_agent_frame(msgspec.msgpack.encode(doc))
    doc["events"][0] = {"kind": "xid", "t": 1.0, "gpu": 0}  # an Xid without its classified record
    with pytest.raises(msgspec.ValidationError, match="record"):
        decode_agent_frame(msgspec.msgpack.encode(doc))


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["snapshot", "fr_dump", "verdicts", "reboot", "", 7]),
    st.sampled_from(["since", "job", "wait_s", "max_bytes", "verdicts", "collect", "name"]),
    hostile_values,
)
def test_hostile_commands_decode_to_a_typed_request_or_a_msgspec_error(
    name: object, field: str, value: object
) -> None:
    """What an agent decodes from the aggregator: a typed, bounded request, or the frame is refused."""
    doc = {"type": "command", "id": "c1", "request": {"name": name, field: value}}
    try:
        data = msgspec.msgpack.encode(doc)
    except (OverflowError, RecursionError, msgspec.EncodeError):
        return
    try:
        frame = decode_aggregator_frame(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
    assert isinstance(frame, Command)
    request = frame.request
    assert isinstance(request, SnapshotRequest | FrDumpRequest | VerdictsRequest)
    if isinstance(request, FrDumpRequest):
        assert 0 <= request.wait_s <= 600 and 0 <= request.max_bytes <= 6 * 1024 * 1024
    if isinstance(request, VerdictsRequest):
        assert len(request.verdicts) <= 256


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["snapshot", "fr_dump", "batch", None]),
    st.sampled_from(["entries", "window", "host", "dumps", "triggered", "failed", "error"]),
    hostile_values,
    st.sampled_from(["sample", "event", "heads", "procs", "verdict"]),
)
def test_hostile_answers_decode_to_a_typed_answer_or_a_msgspec_error(
    command: object, field: str, value: object, entry_type: str
) -> None:
    """What the aggregator decodes from an agent's answer: a typed snapshot / dump answer, or a refusal."""
    answer: dict[str, object] = {"command": command, "host": "h", "window": [0.0, 1.0], field: value}
    if field != "entries":
        answer["entries"] = [
            {"type": entry_type, "t": 1.0, "data": {"t": 1.0, "gpu": 0, "kind": "gpu_reset"}}
        ]
    try:
        data = msgspec.msgpack.encode({"type": "result", "id": "c1", "answer": answer})
    except (OverflowError, RecursionError, msgspec.EncodeError):
        return
    try:
        frame = decode_agent_frame(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
    assert isinstance(frame, CommandResult)
    assert frame.answer is None or isinstance(frame.answer, Snapshot | FrDumpAnswer)


@pytest.mark.parametrize("where", ["seq", "events", "t", "answer"])
def test_nesting_far_deeper_than_any_encoder_allows_is_refused_in_one_pass(where: str) -> None:
    """100,000 nested arrays (bytes no msgspec encoder would produce) where a value belongs: refused with a
    validation error at the first wrong type, never a recursion error in the aggregator."""
    deep = b"\x91" * 100_000 + b"\x00"
    frames = {
        "seq": b"\x82\xa4type\xa5batch\xa3seq" + deep,
        "events": b"\x83\xa4type\xa5batch\xa3seq\x01\xa6events" + deep,
        "t": b"\x83\xa4type\xa5batch\xa3seq\x01\xa6events\x91\x82\xa4kind\xa3log\xa1t" + deep,
        "answer": b"\x83\xa4type\xa6result\xa2id\xa1c\xa6answer" + deep,
    }
    with pytest.raises(msgspec.ValidationError):
        decode_agent_frame(frames[where])
