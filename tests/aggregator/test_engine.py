"""The detector contract: each detector in isolation, self-metrics, switched off in config, SIGHUP reload."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from sentinel.aggregator.detectors.base import Detector, Evaluation, Observation
from sentinel.aggregator.engine import Engine, EngineMetrics
from sentinel.aggregator.metrics import AggregatorMetrics
from sentinel.aggregator.server import Aggregator
from sentinel.components.xid.parse import xid_record
from sentinel.config import load_aggregator_config
from sentinel.config.aggregator import AggregatorConfig, DetectConfig
from sentinel.wire import Batch, XidOccurred
from tests.aggregator.helpers import hello, kernel_xid, sample


class Broken(Detector):
    name = "straggler"  # stands in for one of the real ones

    def evaluate(self, seen: Observation) -> Evaluation | None:
        raise ZeroDivisionError("a bug in one rule")


class Recorder(EngineMetrics):
    def __init__(self) -> None:
        self.runs: list[tuple[str, bool]] = []

    def detector_run(self, name: str, seconds: float, ok: bool) -> None:
        assert seconds >= 0
        self.runs.append((name, ok))


def _silent_host_engine(
    config: AggregatorConfig | None = None, metrics: EngineMetrics | None = None
) -> Engine:
    engine = Engine(config, metrics=metrics)
    engine.hello(hello("h0", 2), 0.0)
    return engine


def test_an_exception_in_one_detector_is_counted_and_the_others_still_run() -> None:
    metrics = Recorder()
    engine = _silent_host_engine(metrics=metrics)
    engine.detectors["straggler"] = Broken(engine.config)
    engine.tick(30.0)  # h0 silent for 30 s
    assert [v.kind for v in engine.book.open.values()] == ["host_silent"]
    assert engine.failures["straggler"] == 1
    assert ("straggler", False) in metrics.runs and ("host_silent", True) in metrics.runs


def test_detector_self_metrics_are_exported() -> None:
    registry = CollectorRegistry()
    metrics = AggregatorMetrics("c1", registry)
    engine = _silent_host_engine(metrics=metrics)
    engine.detectors["stuck"] = type("BrokenStuck", (Broken,), {"name": "stuck"})(engine.config)
    engine.tick(1.0)
    failures = registry.get_sample_value(
        "sentinel_aggregator_detector_failures_total", {"cluster": "c1", "detector": "stuck"}
    )
    assert failures == 1.0
    assert (
        registry.get_sample_value(
            "sentinel_aggregator_detector_success", {"cluster": "c1", "detector": "stuck"}
        )
        == 0.0
    )
    assert (
        registry.get_sample_value(
            "sentinel_aggregator_detector_success", {"cluster": "c1", "detector": "host_silent"}
        )
        == 1.0
    )
    assert (
        registry.get_sample_value(
            "sentinel_aggregator_detector_duration_seconds_count", {"cluster": "c1", "detector": "hardware"}
        )
        or 0
    ) >= 1


def test_a_detector_switched_off_opens_nothing_and_its_open_verdicts_close() -> None:
    engine = _silent_host_engine()
    engine.tick(30.0)
    assert [v.detector for v in engine.book.open.values()] == ["host_silent"]
    off = msgspec.structs.replace(engine.config, detect=DetectConfig(disabled=["host_silent"]))
    changes = engine.reconfigure(off, 31.0)
    assert [(c.what, c.verdict.close_reason) for c in changes] == [("closed", "detector disabled")]
    engine.tick(60.0)
    assert engine.book.open == {}
    # hardware off: a critical Xid opens nothing either
    engine.reconfigure(
        msgspec.structs.replace(off, detect=DetectConfig(disabled=["hardware", "host_silent"])), 61
    )
    view = engine.fleet.hosts["h0"]
    engine.ingest(
        view,
        Batch(
            seq=1,
            t=62.0,
            samples=[sample(0, 62.0)],
            events=[XidOccurred(t=62.0, gpu=0, record=xid_record(79))],
        ),
        62.0,
    )
    engine.tick(62.0)
    assert engine.book.open == {}
    engine.reconfigure(AggregatorConfig(), 63.0)  # back on: the latched Xid is still known
    engine.tick(63.0)
    assert [v.reason for v in engine.book.open.values()] == ["xid_79"]


def test_an_unknown_detector_name_is_refused_by_the_config(tmp_path: Path) -> None:
    path = tmp_path / "aggregator.toml"
    path.write_text('[detect]\ndisabled = ["stragler"]\n')
    with pytest.raises(Exception, match=r"detect\.disabled"):
        load_aggregator_config(path)


def test_reload_applies_a_good_file_and_refuses_a_bad_one_keeping_the_old(tmp_path: Path) -> None:
    path = tmp_path / "aggregator.toml"
    path.write_text("[fleet]\nhost_silent_after_s = 10.0\n")
    aggregator = Aggregator(
        load_aggregator_config(path),
        tokens=["t"],
        registry=CollectorRegistry(),
        state_dir=tmp_path,
        clock=lambda: 5.0,
    )
    path.write_text('[detect]\ndisabled = ["straggler"]\n[fleet]\nhost_silent_after_s = 20.0\n')
    assert aggregator.reload(lambda: load_aggregator_config(path))
    assert aggregator.engine.config.detect.disabled == ["straggler"]
    assert aggregator.engine.config.fleet.host_silent_after_s == 20.0
    path.write_text("[fleet]\nhost_silent_after_s = -1\n")
    assert not aggregator.reload(lambda: load_aggregator_config(path))
    assert aggregator.engine.config.fleet.host_silent_after_s == 20.0  # the old one is kept
    registry = aggregator.metrics.registry
    assert (
        registry.get_sample_value(
            "sentinel_aggregator_config_reloads_total", {"cluster": "default", "result": "refused"}
        )
        == 1.0
    )
    assert (
        registry.get_sample_value("sentinel_aggregator_config_last_reload_success", {"cluster": "default"})
        == 0.0
    )


def test_sighup_reloads_the_running_daemon(tmp_path: Path) -> None:
    """The real `serve` loop: SIGHUP to this process reloads the file it was started with."""
    from sentinel.cli import cmd_aggregator

    tokens = tmp_path / "tokens"
    tokens.write_text("tok-0123456789abcdef h*\n")
    path = tmp_path / "aggregator.toml"
    base = f'[server]\nlisten_port = 0\ntokens_file = "{tokens}"\nstate_dir = "{tmp_path}"\n'
    path.write_text(base)
    seen: list[AggregatorConfig] = []
    original = Aggregator.reload

    def spy(self: Aggregator, load: object) -> bool:
        ok = original(self, load)  # type: ignore[arg-type]
        seen.append(self.engine.config)
        return ok

    async def main() -> int:
        Aggregator.reload = spy  # type: ignore[method-assign]
        try:
            task = asyncio.create_task(cmd_aggregator.serve(load_aggregator_config(path), config_path=path))
            for _ in range(200):
                await asyncio.sleep(0.01)
                if asyncio.get_running_loop()._signal_handlers.get(signal.SIGHUP):  # type: ignore[attr-defined]
                    break
            path.write_text(base + '[detect]\ndisabled = ["stuck"]\n')
            os.kill(os.getpid(), signal.SIGHUP)
            for _ in range(200):
                await asyncio.sleep(0.01)
                if seen:
                    break
            os.kill(os.getpid(), signal.SIGTERM)
            return await asyncio.wait_for(task, 20)
        finally:
            Aggregator.reload = original  # type: ignore[method-assign]

    assert asyncio.run(main()) == 0
    assert seen and seen[0].detect.disabled == ["stuck"]


def test_a_tick_in_steps_lets_batches_in_between_and_honours_a_reload_between_steps() -> None:
    """The server runs the tick one detector per step with its loop free in between: a batch ingested
    between two steps opens its hardware verdict at once (not after the tick), and a detector switched off
    by a reload between two steps does not run in that tick."""
    metrics = Recorder()
    engine = _silent_host_engine(metrics=metrics)
    stages = engine.tick_stages(30.0)  # h0 silent for 30 s
    next(stages)  # retention
    next(stages)  # the first detector
    view = engine.fleet.hosts["h0"]
    xid = kernel_xid(30.0, 1, 79)
    engine.ingest(view, Batch(seq=1, t=30.0, samples=[sample(1, 30.0)], events=[xid]), 30.0)
    assert [v.reason for v in engine.book.open.values()] == ["xid_79"]  # mid-tick, straight from ingest
    engine.reconfigure(
        msgspec.structs.replace(engine.config, detect=DetectConfig(disabled=["host_silent"])), 30.0
    )
    ran_before = len(metrics.runs)
    rest = list(stages)
    names = [name for name, _ in metrics.runs[ran_before:]]
    assert "host_silent" not in names and len(rest) >= len(names) > 0  # (a sliced detector: several steps)
    assert {v.detector for v in engine.book.open.values()} == {"hardware"}
