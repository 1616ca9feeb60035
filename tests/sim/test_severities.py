"""Each fault kind at several severities, and two faults at once, in a jittery 128-GPU job (tests/sim/scenarios).

Every rank's compute jitters ±20% per step and ranks pause 2-3 s now and then: each fault must still be
named within its bound (stragglers 60 s from 1.1x to 2x, hangs 10 s) and no other verdict may open.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sim.faulttable import judge

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.toml"))


def test_there_are_severities_subgroups_and_double_faults() -> None:
    stems = {p.stem for p in SCENARIOS}
    assert {"straggler_1_1x", "straggler_1_2x", "straggler_1_5x", "straggler_2_0x"} <= stems
    assert {"hang_tp2_subgroup", "hang_tp4_subgroup", "slow_host_1_3x", "healthy_jitter_128"} <= stems
    assert {"two_stragglers_1_3x", "straggler_then_hang", "xid79_and_straggler"} <= stems


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_fault_is_named_in_time_and_nothing_else(path: Path) -> None:
    for row in judge(path):
        assert row.false_verdicts == 0, f"{row.scenario}: {row.false_verdicts} verdict(s) no fault explains"
        if row.fault.startswith("none"):
            continue
        assert row.delay_s is not None, f"{row.scenario}: {row.fault} ({row.severity}) never named"
        assert 0 <= row.delay_s <= row.bound_s, f"{row.scenario}: {row.fault} named after {row.delay_s:.0f}s"
