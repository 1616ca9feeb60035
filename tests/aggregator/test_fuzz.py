"""Hypothesis on the ingest path: arbitrary bytes and arbitrary well-typed frames never break the aggregator."""

from __future__ import annotations

import contextlib
import math

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.aggregator.engine import Engine
from sentinel.components.clocks.record import ClockViolations
from sentinel.fr.heads import FrHeads, InFlight, PgHead
from sentinel.wire import (
    Batch,
    EccCounters,
    Event,
    GpuSample,
    Hello,
    NvLink,
    ProcInfo,
    RowRemap,
    decode_agent_frame,
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
events = st.builds(
    Event,
    t=times,
    kind=st.sampled_from(
        ["xid", "log", "gpu_lost", "gpu_unresponsive", "gpu_reset", "reboot", "agent", "weird"]
    ),
    gpu=st.none() | small,
    xid=st.none() | st.integers(min_value=-5, max_value=70000),
    text=st.text(max_size=80),
    fields=st.dictionaries(
        st.sampled_from(["kind", "rank", "seq", "pid"]),
        st.none()
        | st.integers(-(2**63), 2**63 - 1)
        | st.sampled_from(["nccl_warn_net", "torch_watchdog_timeout"]),
        max_size=4,
    ),
)
pg_heads = st.builds(
    PgHead,
    pg_name=st.sampled_from(["0", "tp0", "x"]),
    pg_desc=st.sampled_from(["default_pg", "tp", ""]),
    ranks=st.none() | st.lists(st.integers(-2, 20), max_size=5),
    last_enqueued_seq=seqs,
    last_completed_seq=seqs,
    in_flight=st.lists(
        st.builds(InFlight, seq=seqs, op=st.text(max_size=5), age_s=floats, p2p=st.booleans()), max_size=2
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
