"""Scenario files: good ones load, every kind of bad one gets one line naming the file and the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.sim.scenario import ScenarioError, load_scenario, load_scenario_text, parse_scenario

GOOD = """
seed = 7
duration_s = 300
tick_s = 1.0

[cluster]
hosts = 4
gpus_per_host = 8

[[jobs]]
id = "train-a"
hosts = ["host-000", "host-001"]

[[faults]]
at_s = 60.0
host = "host-001"
gpu = 3
kind = "xid"
xid = 79

[[faults]]
at_s = 90.0
host = "host-003"
kind = "host_down"
"""


def test_good_scenario_loads(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(GOOD)
    scenario = load_scenario(path)
    assert scenario.seed == 7 and scenario.cluster.hosts == 4
    assert scenario.host_names() == ["host-000", "host-001", "host-002", "host-003"]
    assert [f.kind for f in scenario.faults] == ["xid", "host_down"]
    assert scenario.name == "s"


def test_defaults_job_on_all_hosts() -> None:
    scenario = load_scenario_text('[cluster]\nhosts = 2\n[[jobs]]\nid = "j"\n')
    assert scenario.jobs[0].hosts is None and scenario.duration_s > 0


BAD = [
    ('[[faults]]\nat_s = 1.0\nhost = "host-000"\ngpu = 0\nkind = "meteor"\n', "faults[0].kind", "meteor"),
    (
        '[cluster]\nhosts = 4\n[[faults]]\nat_s = 1.0\nhost = "host-009"\ngpu = 0\nkind = "gpu_lost"\n',
        "faults[0].host",
        "out of range",
    ),
    (
        '[cluster]\nhosts = 4\n[[faults]]\nat_s = 1.0\nhost = "host-001"\ngpu = 8\nkind = "gpu_lost"\n',
        "faults[0].gpu",
        "out of range",
    ),
    ('[[faults]]\nat_s = 1.0\nhost = "host-001"\ngpu = 1\nkind = "xid"\n', "faults[0].xid", "required"),
    (
        '[[faults]]\nat_s = 1.0\nhost = "host-001"\ngpu = 1\nkind = "gpu_lost"\nxid = 79\n',
        "faults[0].xid",
        "not a parameter",
    ),
    ('[[faults]]\nat_s = 1.0\nhost = "host-001"\nkind = "gpu_lost"\n', "faults[0].gpu", "needs a gpu"),
    (
        '[[faults]]\nat_s = 1.0\nhost = "host-001"\ngpu = 0\nkind = "host_down"\n',
        "faults[0].gpu",
        "host fault",
    ),
    ('[[faults]]\nat_s = -1.0\nhost = "host-001"\ngpu = 0\nkind = "gpu_lost"\n', "faults[0].at_s", ">= 0"),
    ('[[faults]]\nat_s = 1.0\nhost = "host-001"\ngpu = 0\nkind = "hang"\n', "faults[0].host", "needs a job"),
    (
        '[[faults]]\nat_s = 1.0\nhost = "host-001"\ngpu = 0\nkind = "straggler"\nslowdown = 0.5\n',
        "faults[0].slowdown",
        "> 1",
    ),
    ("duration_s = 0\n", "duration_s", "> 0"),
    ("bogus = 1\n", "bogus", "unknown field"),
    ("[cluster]\nhosts = 0\n", "cluster.hosts", ">= 1"),
    ("[cluster]\nhostz = 3\n", "cluster.hostz", "unknown field"),
    ('[[jobs]]\nid = "a"\n[[jobs]]\nid = "a"\nhosts = ["host-001"]\n', "jobs[1].id", "duplicate"),
    ('[[jobs]]\nid = "a"\nhosts = ["host-077"]\n', "jobs[0].hosts[0]", "unknown host"),
    (
        '[[jobs]]\nid = "a"\nhosts = ["host-001"]\n[[jobs]]\nid = "b"\nhosts = ["host-001"]\n',
        "jobs[1].hosts[0]",
        "already runs",
    ),
    ('seed = "seven"\n', "seed", "expected int"),
    (
        '[[faults]]\nat_s = 1.0\nhost = "host-001"\nhosts = ["host-001"]\nkind = "xid_storm"\nxid = 45\n',
        "faults[0].host",
        "names hosts",
    ),
    ('[[faults]]\nat_s = 1.0\nkind = "xid_storm"\nxid = 45\n', "faults[0].hosts", "required"),
    (
        '[[faults]]\nat_s = 1.0\nhosts = ["host-001", "host-077"]\nkind = "xid_storm"\nxid = 45\n',
        "faults[0].hosts[1]",
        "unknown host",
    ),
    (
        '[[faults]]\nat_s = 1.0\nhosts = ["host-001", "host-001"]\nkind = "xid_storm"\nxid = 45\n',
        "faults[0].hosts[1]",
        "twice",
    ),
    (
        '[[faults]]\nat_s = 1.0\nhosts = ["host-001"]\ngpu = 0\nkind = "xid_storm"\nxid = 45\n',
        "faults[0].gpu",
        "omit gpu",
    ),
    ('[[faults]]\nat_s = 1.0\nhosts = ["host-001"]\nkind = "xid_storm"\n', "faults[0].xid", "required"),
    (
        '[[faults]]\nat_s = 1.0\nhosts = ["host-001"]\ngpu = 0\nkind = "gpu_lost"\n',
        "faults[0].hosts",
        "use host",
    ),
    (
        '[[faults]]\nat_s = 1.0\nhost = "host-001"\ngpu = 0\nkind = "xid_recurring"\nxid = 48\n',
        "faults[0].every_s",
        "required",
    ),
    (
        '[[faults]]\nat_s = 1.0\nhost = "host-001"\ngpu = 0\nkind = "xid_recurring"\nxid = 48\nevery_s = 1.0\n',
        "faults[0].every_s",
        ">= 5",
    ),
    (
        '[[faults]]\nat_s = 1.0\nhost = "host-001"\ngpu = 0\nkind = "xid"\nxid = 48\nevery_s = 10.0\n',
        "faults[0].every_s",
        "not a parameter",
    ),
]


@pytest.mark.parametrize(("text", "field", "problem"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_scenarios_name_file_and_field(tmp_path: Path, text: str, field: str, problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {field}: "), message
    assert problem in message
    assert "\n" not in message


def test_unreadable_and_not_toml(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")
    path = tmp_path / "x.toml"
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ScenarioError, match="not UTF-8"):
        load_scenario(path)
    path.write_text("[[faults]\n")
    with pytest.raises(ScenarioError, match="invalid TOML"):
        load_scenario(path)


def test_cli_rejects_a_bad_scenario_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[faults]]\nat_s = 1.0\nhost = "host-001"\ngpu = 0\nkind = "meteor"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "sentinel", "sim", str(path), "--report", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "faults[0].kind" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r.json").exists()


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_keys = st.sampled_from(
    [
        "seed",
        "duration_s",
        "tick_s",
        "cluster",
        "jobs",
        "faults",
        "hosts",
        "gpus_per_host",
        "kind",
        "at_s",
        "host",
        "gpu",
        "xid",
        "id",
    ]
)
_docs = st.dictionaries(_keys, _values, max_size=6)
_fault = st.fixed_dictionaries(
    {
        "at_s": st.floats(allow_nan=True, allow_infinity=True),
        "host": st.sampled_from(["host-000", "host-003", "host-999", "", "h"]),
        "kind": st.sampled_from(
            [
                "xid",
                "gpu_lost",
                "hang",
                "host_down",
                "straggler",
                "nvlink_errors",
                "zap",
                "xid_storm",
                "xid_recurring",
            ]
        ),
    },
    optional={
        "hosts": st.lists(st.sampled_from(["host-000", "host-003", "host-999", "", 7]), max_size=4),
        "every_s": st.floats(allow_nan=True),
        "gpu": st.integers(min_value=-2, max_value=20),
        "xid": st.integers(min_value=-5, max_value=70000),
        "slowdown": st.floats(allow_nan=True),
        "rate_per_s": st.floats(allow_nan=True),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        _docs,
        st.fixed_dictionaries(
            {"faults": st.lists(_fault, max_size=3)}, optional={"jobs": st.just([{"id": "j"}])}
        ),
    )
)
def test_fuzz_scenario_documents_load_or_fail_in_one_line(doc: dict[str, object]) -> None:
    try:
        scenario = parse_scenario(doc, "fuzz.toml")
    except ScenarioError as exc:
        assert str(exc).startswith("fuzz.toml: ") and "\n" not in str(exc)
    else:
        assert scenario.duration_s > 0
        for fault in scenario.faults:
            assert fault.host in scenario.host_names()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_scenario_text_never_raises_anything_else(text: str) -> None:
    try:
        load_scenario_text(text, "t.toml")
    except ScenarioError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("t.toml: ")
