"""The fabric manager's service state: ``systemctl show`` parsed (fuzzed), the status the agent ships, and
the collector over an injected unit reader."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from sentinel.agent.collectors.base import Collectors
from sentinel.agent.metrics import AgentCounters
from sentinel.agent.worker import InlineWorker
from sentinel.components.fabric.collector import (
    ABSENT_RECHECK_S,
    FabricManagerCollector,
    FabricManagerMetrics,
)
from sentinel.components.fabric.manager import UNIT, parse_show, status_after
from sentinel.components.fabric.record import FabricManagerStatus

RUNNING = "LoadState=loaded\nActiveState=active\nSubState=running\n"
FAILED = "LoadState=loaded\nActiveState=failed\nSubState=failed\n"
ABSENT = "LoadState=not-found\nActiveState=inactive\nSubState=dead\n"


def test_systemctl_answers() -> None:
    assert (parse_show(RUNNING).present, parse_show(RUNNING).running) == (True, True)
    assert (parse_show(FAILED).present, parse_show(FAILED).running) == (True, False)
    assert (parse_show(ABSENT).present, parse_show(ABSENT).running) == (False, False)
    assert parse_show("").load == ""


@given(st.text(max_size=400))
def test_any_answer_parses_to_short_words(text: str) -> None:
    unit = parse_show(text)
    for value in (unit.load, unit.active, unit.sub):
        assert len(value) <= 32 and "\n" not in value and "=" not in value


@given(st.lists(st.sampled_from([RUNNING, FAILED, ABSENT]), min_size=1, max_size=20))
def test_since_moves_only_when_the_state_changes(answers: list[str]) -> None:
    status: FabricManagerStatus | None = None
    for t, text in enumerate(answers):
        new = status_after(status, parse_show(text), float(t))
        if status is not None and new.state == status.state:
            assert new.since == status.since
        else:
            assert new.since == float(t)
        status = new


class Answers:
    """A unit reader that answers from a list (the systemd boundary)."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    def show(self, unit: str) -> str:
        self.asked.append(unit)
        return self.answers.pop(0)


class Shipped:
    def __init__(self) -> None:
        self.status: list[FabricManagerStatus] = []

    def set_fabric_manager(self, status: FabricManagerStatus) -> None:
        self.status.append(status)


def run(collector: FabricManagerCollector, now: float) -> None:
    collector.workers = InlineWorker  # blocking calls on this thread, as under the simulator's virtual clock
    asyncio.run(collector.collect(now))


def test_the_collector_exports_and_ships_only_where_the_unit_exists() -> None:
    sink, metrics = Shipped(), FabricManagerMetrics("c1", "h0")
    reader = Answers(ABSENT, RUNNING, FAILED)
    collector = FabricManagerCollector(sink, reader, metrics, 15.0)
    run(collector, 0.0)
    assert sink.status == [] and next(m.samples for m in metrics.collect()) == []
    run(collector, 15.0)
    run(collector, 30.0)
    assert reader.asked == [UNIT] * 3
    assert [(s.running, s.state, s.since) for s in sink.status] == [
        (True, "active/running", 15.0),
        (False, "failed/failed", 30.0),
    ]
    [up] = next(iter(metrics.collect())).samples
    assert (up.labels["state"], up.value) == ("failed/failed", 0.0)


def asked_times(reader: Answers, seconds: int) -> list[int]:
    """The seconds at which the agent's collector scheduler (1 s ticks, virtual clock) asked ``reader``."""
    collectors = Collectors(AgentCounters(), tick_s=1.0, inline=True)
    collectors.add(FabricManagerCollector(Shipped(), reader, FabricManagerMetrics("c1", "h0"), 15.0))
    asked_at: list[int] = []
    for t in range(seconds):
        before = len(reader.asked)
        asyncio.run(collectors.run_due(float(t)))
        if len(reader.asked) > before:
            asked_at.append(t)
    return asked_at


def test_a_host_without_the_unit_asks_systemd_only_every_few_minutes() -> None:
    """Through the agent's collector scheduler on a virtual clock: every 15 s while the unit exists, every
    ABSENT_RECHECK_S while it does not, and back to 15 s once it appears."""
    reader = Answers(*([ABSENT] * 4 + [RUNNING] * 100))
    asked_at = asked_times(reader, 1300)
    absent = int(ABSENT_RECHECK_S)
    assert asked_at[:5] == [0, absent, 2 * absent, 3 * absent, 4 * absent]
    assert asked_at[5:8] == [4 * absent + 15, 4 * absent + 30, 4 * absent + 45]


def test_a_failed_read_is_asked_again_at_the_usual_interval() -> None:
    """Only systemd saying the unit does not exist slows the reads: a read that failed says nothing."""
    reader = Answers(*([""] * 3 + [RUNNING] * 10))
    asked_at = asked_times(reader, 100)
    assert asked_at[:5] == [0, 15, 30, 45, 60]
