"""Forgetting a host (retention, eviction) leaves nothing of it behind: in the fleet, in any detector, in the
aggregator's own per-host bookkeeping. Verified by walking everything reachable from the aggregator."""

from __future__ import annotations

import gc
import types
from pathlib import Path
from typing import Any

import msgspec

from sentinel.aggregator.detectors.hardware import HardwareDetector
from sentinel.aggregator.detectors.network import NetworkDetector
from sentinel.aggregator.server import Aggregator
from sentinel.aggregator.verdicts import Change, Verdict
from sentinel.config.aggregator import AggregatorConfig, FleetConfig, IncidentsConfig
from sentinel.wire import Batch, Drops, Hello, encode
from tests.aggregator.helpers import TOKEN, hello, kernel_xid, sample, straggler_of

FORGET_S = 3600.0
_decode = msgspec.msgpack.Decoder(Hello)
_decode_batch = msgspec.msgpack.Decoder(Batch)


def strings_reachable(root: object, skip: tuple[type, ...]) -> set[str]:
    """Every str reachable from ``root`` through containers and instances (not through types, modules,
    functions or ``skip`` instances: the verdict history is kept on purpose, bounded by closed_verdicts_kept)."""
    seen: set[int] = set()
    found: set[str] = set()
    stack: list[Any] = [root]
    opaque = (
        type,
        types.ModuleType,
        types.FunctionType,
        types.CodeType,
        types.BuiltinFunctionType,
        bytes,
        int,
        float,
        *skip,
    )
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            found.add(obj)
            continue
        if isinstance(obj, opaque):
            continue
        stack.extend(gc.get_referents(obj))
    return found


def feed(aggregator: Aggregator, name: str, now: float, *, clock: float = 1980.0, **batch: Any) -> None:
    """A hello and a batch as they come off the wire (decoded from msgpack: the test keeps no reference)."""
    engine = aggregator.engine
    view = engine.hello(_decode.decode(encode(hello(name))), now)
    frame = Batch(
        seq=int(now), t=now, samples=[sample(i, now, sm_clock_mhz=clock) for i in range(8)], **batch
    )
    engine.ingest(view, _decode_batch.decode(encode(frame)), now)


def test_a_forgotten_host_leaves_no_memory_in_any_detector(tmp_path: Path) -> None:
    config = AggregatorConfig(
        fleet=FleetConfig(host_forget_after_s=FORGET_S), incidents=IncidentsConfig(enabled=False)
    )
    aggregator = Aggregator(config, tokens=[TOKEN], state_dir=tmp_path)
    engine = aggregator.engine
    for t in range(0, 60, 2):
        now = float(t)
        for i in range(6):
            feed(aggregator, f"real-{i}", now)
        feed(
            aggregator, "fake-slow", now, clock=1200.0
        )  # a straggler host: streaks in the straggler detector
        xid = kernel_xid(now, 3, 79)
        feed(aggregator, "fake-xid", now, events=[xid], drops=Drops(samples=3))  # hardware + drops
        engine.tick(now)
        aggregator.streams._log_drops("fake-xid", Batch(seq=0, t=now, drops=Drops(samples=3)))
    fakes = {"fake-slow", "fake-xid"}
    # the memory this test is about exists before the hosts are forgotten
    hardware = engine.detectors["hardware"]
    network = engine.detectors["network"]
    assert isinstance(hardware, HardwareDetector) and isinstance(network, NetworkDetector)
    assert any(h == "fake-xid" for h, _ in hardware.flagged)
    assert any(v.host == "fake-slow" and v.detector == "straggler" for v in engine.book.open.values())
    assert fakes <= set(network.quiet)
    assert fakes <= aggregator.pushback.marked
    assert "fake-xid" in aggregator.streams._drops_logged
    assert fakes <= strings_reachable(aggregator, ())

    for name in fakes:
        engine.disconnected(name)
    later = 60.0 + FORGET_S + 1.0
    for i in range(6):
        feed(aggregator, f"real-{i}", later)
    engine.tick(later)
    engine.tick(later + config.detect.straggler.eval_interval_s)

    assert set(engine.fleet.hosts) == {f"real-{i}" for i in range(6)}
    assert not any(v.host in fakes for v in engine.book.open.values())
    assert not any(h in fakes for h, _ in hardware.flagged)
    assert not any(
        s.finding is not None and s.finding.host in fakes for s in straggler_of(engine).streaks.values()
    )
    assert not fakes & set(network.quiet)
    assert not fakes & aggregator.pushback.marked
    assert not fakes & set(aggregator.streams._drops_logged)
    assert not fakes & engine.fleet.changed_hosts
    # nothing reachable from the aggregator names them, but the closed-verdict history (bounded)
    leftover = {s for s in strings_reachable(aggregator, (Verdict, Change)) if s.startswith("fake-")}
    assert leftover == set()


def test_straggler_detector_forgets_a_host_s_streaks_at_once(tmp_path: Path) -> None:
    """Without the hook its streaks would last ``persistence`` more evaluations, and a stream of names
    evicted at max_hosts would keep them all."""
    config = AggregatorConfig(fleet=FleetConfig(host_forget_after_s=FORGET_S))
    aggregator = Aggregator(config, tokens=[TOKEN], state_dir=tmp_path)
    engine = aggregator.engine
    for t in range(0, 40, 2):
        for i in range(6):
            feed(aggregator, f"real-{i}", float(t))
        feed(aggregator, "fake-slow", float(t), clock=1200.0)
        engine.tick(float(t))
    assert any(
        s.finding is not None and s.finding.host == "fake-slow" for s in straggler_of(engine).streaks.values()
    )
    engine.forget_host("fake-slow", 40.0)
    assert not any(
        s.finding is not None and s.finding.host == "fake-slow" for s in straggler_of(engine).streaks.values()
    )
