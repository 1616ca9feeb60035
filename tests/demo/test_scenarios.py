"""The built-in scenario and --hosts resizing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sentinel.demo import scenarios
from sentinel.sim.scenario import ScenarioError


def test_default_scenario_has_the_four_faults_of_the_demo_within_two_minutes() -> None:
    sc = scenarios.load(None)
    assert sc.name == "default"
    assert (sc.cluster.hosts, sc.cluster.gpus_per_host) == (16, 8)
    kinds = {(f.kind, f.xid) for f in sc.faults}
    assert kinds == {("hang", None), ("xid", 79), ("row_remap_pending", None), ("thermal_throttle", None)}
    assert max(f.at_s for f in sc.faults) <= 120 <= sc.duration_s + 1
    # every fault hits a different job-or-GPU, so each verdict has one cause
    assert len({(f.host, f.gpu) for f in sc.faults}) == 4
    hosts_with_jobs = {h for job in sc.jobs for h in (job.hosts or [])}
    assert all(f.host in hosts_with_jobs for f in sc.faults)
    faults = scenarios.faults_of(sc)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    assert next(f for f in faults if f.kind == "xid").describe() == "xid 79"


@pytest.mark.parametrize("hosts", [2, 3, 4, 7, 15, 16, 17, 33, 200])
def test_resized_default_keeps_jobs_disjoint_and_faults_on_their_jobs(hosts: int) -> None:
    sc = scenarios.load(None, hosts=hosts)
    assert sc.cluster.hosts == hosts
    owner: dict[str, str] = {}
    for job in sc.jobs:
        assert job.hosts
        for h in job.hosts:
            assert h not in owner
            owner[h] = job.id
    original = {f.kind: f for f in scenarios.load(None).faults}
    for f in sc.faults:
        assert f.host in owner
        assert owner[f.host] == next(
            j.id for j in scenarios.load(None).jobs if original[f.kind].host in (j.hosts or [])
        )
        assert f.gpu == original[f.kind].gpu


def test_too_few_hosts_is_a_one_line_error() -> None:
    with pytest.raises(
        ScenarioError, match=r"--hosts: 1 hosts are too few: the scenario.s 2 jobs need a host each"
    ) as info:
        scenarios.load(None, hosts=1)
    assert "\n" not in str(info.value)


def test_duration_override_and_bad_files(tmp_path: Path) -> None:
    assert scenarios.load(None, duration_s=30.0).duration_s == 30.0
    bad = tmp_path / "bad.toml"
    bad.write_text("seed = 1\n[[faults]]\nat_s = 1\nhost = 'host-099'\nkind = 'hang'\ngpu = 0\n")
    with pytest.raises(ScenarioError, match=r"bad.toml: faults\[0\].host"):
        scenarios.load(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("seed = = 1")
    with pytest.raises(ScenarioError, match=r"broken\.toml: invalid TOML"):
        scenarios.load(broken)
    with pytest.raises(ScenarioError, match=r"missing\.toml: cannot read"):
        scenarios.load(tmp_path / "missing.toml")
    outside = tmp_path / "named.toml"
    outside.write_text("[cluster]\nhosts = 4\n[[jobs]]\nid = 'j'\nhosts = ['host-000', 'nodeA']\n")
    with pytest.raises(ScenarioError, match=r"jobs\[0\].hosts\[1\].*cannot resize"):
        scenarios.load(outside, hosts=8)
