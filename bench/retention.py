"""Memory held for hosts that went away: 3,000 made-up host names, then retention forgets them.

    flock /tmp/sentinel-bench.lock .venv/bin/python bench/retention.py [--fakes 3000] [--real 100]

In process, through the real aggregator object (engine, every detector, verdict pushback, drop logging) on a
virtual clock. Python memory is measured with tracemalloc (what the interpreter holds, not RSS, which
pymalloc does not give back to the OS), at three points: ``--real`` real hosts only (the reference), with the
fake names on top, and after ``fleet.host_forget_after_s`` has passed and the fakes are forgotten. Every
fake host reports 8 busy GPUs, one of them a slow one (straggler streaks), an Xid 79 (a hardware verdict),
agent drops and is pushed its verdicts. Prints the three figures and the ratio of the last to the reference.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import tracemalloc
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sentinel.aggregator.server import Aggregator
from sentinel.components.xid.parse import xid_record
from sentinel.config.aggregator import AggregatorConfig, FleetConfig, IncidentsConfig, StateConfig
from sentinel.log import setup_logging
from sentinel.wire import Batch, Drops, Event, GpuInfo, GpuSample, Hello, XidOccurred, encode

FORGET_S = 3600.0
_hello = msgspec.msgpack.Decoder(Hello)
_batch = msgspec.msgpack.Decoder(Batch)


def hello(name: str) -> Hello:
    gpus = [
        GpuInfo(index=i, uuid=f"GPU-{name}-{i}", pci_bus=f"0000:{0x18 + i:02x}:00", name="H100")
        for i in range(8)
    ]
    return Hello(host=name, boot_id="boot-1", gpus=gpus)


def batch(seq: int, t: float, slow: bool, xid: bool) -> Batch:
    samples = [
        GpuSample(gpu=i, t=t, util_gpu_pct=99.0, temp_c=65.0, power_w=640.0,
                  sm_clock_mhz=1200.0 if slow and i == 0 else 1980.0, sm_clock_max_mhz=1980.0)
        for i in range(8)
    ]  # fmt: skip
    events: list[Event] = (
        [
            XidOccurred(
                t=t,
                gpu=3,
                text="NVRM: Xid (PCI:0000:1b:00): 79",
                record=xid_record(79, "NVRM: Xid (PCI:0000:1b:00): 79"),
            )
        ]
        if xid
        else []
    )
    return Batch(seq=seq, t=t, samples=samples, events=events, drops=Drops(samples=1) if xid else None)


def feed(aggregator: Aggregator, names: list[str], t: float, fake: bool) -> None:
    engine = aggregator.engine
    for name in names:
        view = engine.hello(_hello.decode(encode(hello(name))), t)
        frame = _batch.decode(encode(batch(int(t), t, slow=fake, xid=fake)))
        engine.ingest(view, frame, t)
        if frame.drops is not None:
            aggregator.streams._log_drops(name, frame)


def held_mb() -> float:
    gc.collect()
    return tracemalloc.get_traced_memory()[0] / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fakes", type=int, default=3000)
    parser.add_argument("--real", type=int, default=100)
    args = parser.parse_args()
    setup_logging("aggregator", "error")  # thousands of verdict lines otherwise
    config = AggregatorConfig(
        fleet=FleetConfig(host_forget_after_s=FORGET_S),
        incidents=IncidentsConfig(enabled=False),
        state=StateConfig(enabled=False),
    )
    with tempfile.TemporaryDirectory() as tmp:
        tracemalloc.start()
        aggregator = Aggregator(config, tokens=["bench-token"], state_dir=Path(tmp))
        engine = aggregator.engine
        real = [f"real-{i:04d}" for i in range(args.real)]
        fakes = [f"fake-{i:05d}" for i in range(args.fakes)]
        for t in range(0, 30, 2):
            feed(aggregator, real, float(t), fake=False)
            engine.tick(float(t))
        reference = held_mb()
        for t in range(30, 60, 2):
            feed(aggregator, real, float(t), fake=False)
            feed(aggregator, fakes, float(t), fake=True)
            engine.tick(float(t))
        with_fakes = held_mb()
        open_fake = sum(1 for v in engine.book.open.values() if v.host and v.host.startswith("fake-"))
        for name in fakes:
            engine.disconnected(name)
        now = 60.0 + FORGET_S
        while any(h.startswith("fake-") for h in engine.fleet.hosts):  # at most 100 forgotten per tick
            feed(aggregator, real, now, fake=False)
            engine.tick(now)
            now += 2.0
        for _ in range(5):  # a few more evaluations (straggler streaks of real GPUs settle)
            feed(aggregator, real, now, fake=False)
            engine.tick(now)
            now += 2.0
        after = held_mb()
        history = len(engine.book.closed)
        engine.book.closed.clear()
        engine.book._trim()
        engine.book.by_id = {v.id: v for v in engine.book.open.values()}
        without_history = held_mb()
        tracemalloc.stop()
    left = sum(1 for h in engine.fleet.hosts if h.startswith("fake-"))
    print(
        f"hosts: {args.real} real, {args.fakes} fake (open verdicts on fakes before retention: {open_fake})"
    )
    print(f"python memory, real hosts only (reference): {reference:8.1f} MB")
    print(
        f"python memory, with the fake hosts:          {with_fakes:8.1f} MB  (+{with_fakes - reference:.1f} MB)"
    )
    print(f"python memory, after retention forgot them:  {after:8.1f} MB  (+{after - reference:.1f} MB)")
    print(
        f"  of which the closed-verdict history ({history} kept, fleet.closed_verdicts_kept): "
        f"{after - without_history:.1f} MB"
    )
    print(
        f"python memory without that history:          {without_history:8.1f} MB  (+{without_history - reference:.1f} MB)"
    )
    print(
        f"after / reference: {after / reference:.2f}x, without the history {without_history / reference:.2f}x; "
        f"fake hosts still tracked: {left}"
    )
    print("(tracemalloc, one process; figures from a shared machine)")


if __name__ == "__main__":
    main()
