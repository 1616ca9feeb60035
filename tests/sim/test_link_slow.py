"""Communication fail-slow through the real agents and the real engine (sentinel sim): a slow rail, loud
or silent, named with the job's cost; an HCA that disappears named as the stall's cause; and nothing named
when the job is uniformly slower or a rail is slow while its GPU runs no job."""

from __future__ import annotations

from typing import Any

import msgspec

from sentinel.aggregator.detectors.link_pace import LinkPaceDetector
from sentinel.config.aggregator import AggregatorConfig
from sentinel.sim.runner import run_scenario
from sentinel.sim.scenario import load_scenario, load_scenario_text
from tests.support import REPO

SCENARIOS = REPO / "examples" / "scenarios"


def verdicts(text_or_name: str) -> list[dict[str, Any]]:
    if text_or_name.endswith(".toml"):
        scenario = load_scenario(SCENARIOS / text_or_name)
    else:
        scenario = load_scenario_text(text_or_name)
    return list(run_scenario(scenario).report()["verdicts"])


def test_a_slow_rail_is_named_with_the_jobs_cost_and_the_ports_counters() -> None:
    (verdict,) = verdicts("link_slow.toml")
    assert (verdict["kind"], verdict["reason"], verdict["action"]) == ("degraded", "link_slow", "drain")
    assert (verdict["host"], verdict["gpu"], verdict["rank"], verdict["job"]) == (
        "host-002",
        5,
        21,
        "train-a",
    )
    assert verdict["t_s"] - 120.0 <= 60.0
    head, pace, *why = verdict["evidence"]
    assert head.startswith("port mlx5_5/1 on host-002 slows job train-a by ")
    cost = int(head.split(" by ")[1].split("%")[0])
    assert 20 <= cost <= 40, head  # 0.5 s of a 1.0 s step stretched 1.6x: ~30 %
    assert "of the extra time is communication" in pace
    assert {line.split(": ")[1].split(" ")[0] for line in why} >= {"port_xmit_wait", "np_cnp_sent"}


def test_a_silent_slow_rail_is_named_by_its_throughput() -> None:
    (verdict,) = verdicts("link_slow_silent.toml")
    assert (verdict["host"], verdict["gpu"], verdict["reason"]) == ("host-001", 2, "link_slow")
    assert any("below its peers' median" in line for line in verdict["evidence"])
    assert not any("port_xmit_wait" in line for line in verdict["evidence"])


def test_a_lost_hca_is_down_and_explains_the_stall() -> None:
    found = {(v["kind"], v["reason"], v["host"], v["gpu"], v["rank"]) for v in verdicts("nic_lost.toml")}
    assert found == {
        ("faulty", "ib_port_down", "host-001", 3, 11),
        ("stuck", "ib_port_down", "host-001", 3, 11),
    }


SLOW_JOB = """
seed = 5
duration_s = 200
[cluster]
hosts = 4
gpus_per_host = 8
[[jobs]]
id = "train-a"
compute_s = 0.5
comm_s = 0.5
{extra}
"""


def test_a_job_slower_because_every_rank_computes_more_names_no_link() -> None:
    """Every GPU of every host slowed 1.6x (a larger input for all): slower, but in compute, and no rail
    stands out."""
    faults = "".join(
        f'[[faults]]\nat_s = 120.0\nhost = "host-{h:03d}"\nkind = "straggler"\nslowdown = 1.6\n'
        for h in range(4)
    )
    result = run_scenario(load_scenario_text(SLOW_JOB.format(extra=faults)))
    assert not [v for v in result.report()["verdicts"] if v["reason"] == "link_slow"]
    assert result.engine is not None
    detector = result.engine.detectors[LinkPaceDetector.name]
    assert isinstance(detector, LinkPaceDetector)
    pace = detector.latest["train-a"]
    assert pace.slowdown > 0.2 and pace.comm_share is not None and pace.comm_share < 0.5, pace


def test_a_slow_rail_whose_gpu_runs_no_job_is_named_by_nothing() -> None:
    """The job runs on hosts 0-1; host-003's rail is slow and idle: no job pays for it."""
    text = SLOW_JOB.replace('id = "train-a"', 'id = "train-a"\nhosts = ["host-000", "host-001"]')
    fault = '[[faults]]\nat_s = 120.0\nhost = "host-003"\ngpu = 1\nkind = "link_slow"\nslowdown = 1.6\n'
    assert verdicts(text.format(extra=fault)) == []


def test_silent_is_only_a_link_slow_parameter() -> None:
    bad = SLOW_JOB.format(
        extra='[[faults]]\nat_s = 1.0\nhost = "host-000"\ngpu = 0\nkind = "hang"\nsilent = true\n'
    )
    try:
        load_scenario_text(bad)
    except Exception as exc:
        assert "silent" in str(exc)
    else:
        raise AssertionError("silent accepted on a hang")
    assert msgspec.to_builtins(load_scenario(SCENARIOS / "link_slow_silent.toml").faults[0])["silent"] is True


def test_a_rail_so_slow_the_job_stalls_is_the_stalls_network_cause() -> None:
    """Every rank inside the all_reduce, none late, no port down: the port standing out among the rails
    (the same judgement) is the stuck verdict's cause, on the rank it serves."""
    found = verdicts("link_slow_stall.toml")
    stuck = [v for v in found if v["kind"] == "stuck"]
    assert stuck and {(v["reason"], v["host"], v["gpu"], v["rank"], v["action"]) for v in stuck} == {
        ("link_slow", "host-003", 6, 30, "drain")
    }
    assert stuck[0]["t_s"] - 60.0 <= 10.0
    assert any(
        "port_xmit_wait" in line and "against its peers' median" in line for line in stuck[0]["evidence"]
    )
    assert {(v["host"], v["gpu"]) for v in found} == {("host-003", 6)}


def test_the_stall_question_follows_the_link_pace_setting() -> None:
    """The stuck detector asks the same judgement with the same settings: with ``[detect.link_pace]``
    switched off, no standing-out rail is the stall's cause either."""
    config = AggregatorConfig()
    off = msgspec.structs.replace(config.detect.link_pace, enabled=False)
    config = msgspec.structs.replace(config, detect=msgspec.structs.replace(config.detect, link_pace=off))
    report = run_scenario(load_scenario(SCENARIOS / "link_slow_stall.toml"), config).report()
    assert not [v for v in report["verdicts"] if v["reason"] == "link_slow"]
