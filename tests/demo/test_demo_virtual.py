"""The demo's scenarios and the demo's own judgement, on a virtual clock: no wall-clock luck.

`test_demo_run.py` runs the short demo in real time over real sockets (kept as a smoke test: under load it
depends on the machine keeping up). This runs the same scenarios — the built-in default and the compressed
short one — on virtual time through the same path: `sentinel sim`'s runner, i.e. a real agent (built inline)
on every simulated host feeding the real aggregator engine — and judges the verdicts with the demo's
`outcome.evaluate`: every fault caught on its GPU within its bound, nothing flagged wrongly, and the same
verdicts every run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel.config.aggregator import AggregatorConfig
from sentinel.demo import scenarios
from sentinel.demo.outcome import Outcome, Verdict, detection_bound_s, evaluate
from sentinel.sim.runner import run_scenario
from tests.demo.helpers import SHORT, tune_for_short_runs


def _judge(path: Path | None, config: AggregatorConfig) -> tuple[Outcome, list[Verdict]]:
    scenario = scenarios.load(path)
    result = run_scenario(scenario, config)
    verdicts = [
        Verdict(
            id=v.id,
            kind=v.kind,
            host=v.host,
            gpu=v.gpu,
            job=v.job,
            rank=v.rank,
            reason=v.reason,
            action=v.action,
            evidence=tuple(v.evidence),
            opened_s=v.opened_at,
            state="open",
        )
        for v in result.opened
    ]
    outcome = evaluate(scenarios.faults_of(scenario), verdicts, scenario.duration_s)
    return outcome, verdicts


@pytest.mark.parametrize("which", ["default", "short"])
def test_the_demo_scenario_is_caught_on_virtual_time_with_nothing_flagged_wrongly(which: str) -> None:
    config = AggregatorConfig()
    if which == "short":
        tune_for_short_runs(config)
    outcome, verdicts = _judge(None if which == "default" else SHORT, config)
    assert outcome.all_caught, outcome
    assert outcome.wrong == (), outcome.wrong
    for catch in outcome.catches:
        if catch.verdict is not None:
            assert (catch.verdict.host, catch.verdict.gpu) == (catch.fault.host, catch.fault.gpu)
            assert catch.delay_s is not None and catch.delay_s <= detection_bound_s(catch.fault.kind), catch
    # virtual time: the same verdicts at the same instants, every run
    again = _judge(None if which == "default" else SHORT, config)[1]
    assert [(v.kind, v.host, v.gpu, v.opened_s) for v in again] == [
        (v.kind, v.host, v.gpu, v.opened_s) for v in verdicts
    ]
