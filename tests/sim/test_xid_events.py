"""Xid storms and recurrences through the real agent of every host (scenarios written here): a real fault
inside a storm stays its GPU's, a storm of sympathetic reports names its origin, an application Xid that
recurs after resets never escalates."""

from __future__ import annotations

from sentinel.sim.runner import run_scenario
from sentinel.sim.scenario import load_scenario_text

HOSTS = '["host-000", "host-001", "host-002", "host-003"]'


def verdicts(faults: str, duration_s: int = 90) -> list[dict[str, object]]:
    text = f"""
seed = 3
duration_s = {duration_s}
[cluster]
hosts = 6
gpus_per_host = 8
[[jobs]]
id = "train-a"
hosts = {HOSTS}
{faults}
"""
    return run_scenario(load_scenario_text(text, "xid_events")).report()["verdicts"]  # type: ignore[no-any-return]


def test_a_gpu_falling_off_the_bus_before_the_teardown_storm_is_the_one_faulty_gpu() -> None:
    opened = verdicts(
        f"""
[[faults]]
at_s = 59.5
host = "host-002"
gpu = 5
kind = "xid"
xid = 79
[[faults]]
at_s = 60.0
hosts = {HOSTS}
kind = "xid_storm"
xid = 45
"""
    )
    faulty = [(v["host"], v["gpu"], v["reason"]) for v in opened if v["kind"] == "faulty"]
    assert faulty == [("host-002", 5, "xid_79")]
    storms = [v for v in opened if v["reason"] == "xid_storm"]
    assert [(v["host"], v["gpu"], v["action"]) for v in storms] == [("host-002", 5, "none")]
    # the job's stall behind the lost GPU names that GPU too; no other GPU is named at all
    assert {(v["host"], v["gpu"]) for v in opened} == {("host-002", 5)}


def test_a_storm_of_uncontained_errors_is_judged_on_each_hosts_first_gpu_only() -> None:
    """A sympathetic report echoes its own host's first error only: one faulty GPU per host, one storm."""
    opened = verdicts(
        f"""
[[faults]]
at_s = 60.0
hosts = {HOSTS}
kind = "xid_storm"
xid = 95
"""
    )
    faulty = {(v["host"], v["gpu"], v["reason"]) for v in opened if v["kind"] == "faulty"}
    assert faulty == {(f"host-00{h}", 0, "xid_95") for h in range(4)}
    assert [(v["host"], v["gpu"]) for v in opened if v["reason"] == "xid_storm"] == [("host-000", 0)]
    assert all(v["action"] != "drain" for v in opened if v["gpu"] != 0)


def recurring(code: int, every_s: float, duration_s: int) -> list[dict[str, object]]:
    """Xid ``code`` on host-001 GPU 2 from 20 s on, the GPU reset after each, back every ``every_s``."""
    fault = f"""
[[faults]]
at_s = 20.0
host = "host-001"
gpu = 2
kind = "xid_recurring"
xid = {code}
every_s = {every_s}
"""
    return verdicts(fault, duration_s=duration_s)


def test_an_application_xid_back_after_every_reset_never_escalates() -> None:
    opened = recurring(13, 15.0, 120)
    assert [v for v in opened if v["kind"] == "faulty" or v["action"] == "rma"] == []


def test_xid_79_back_after_its_reset_goes_to_rma() -> None:
    opened = recurring(79, 30.0, 70)
    mine = [(v["reason"], v["action"]) for v in opened if (v["host"], v["gpu"]) == ("host-001", 2)]
    assert ("xid_79", "reboot") in mine or ("xid_79", "reset_gpu") in mine, mine
    assert ("xid_79_recurring", "rma") in mine, mine
