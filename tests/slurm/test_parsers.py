"""Slurm's own output as sentinel reads it: ``sinfo`` node lines, ``scontrol listpids``, cgroup paths.

The fixtures are what Slurm 22.05 prints (captured from the real daemons the end-to-end tests start) and the
cgroup layouts slurmstepd creates under cgroup v1 (``task/cgroup``, one line per controller) and v2
(``system.slice/slurmstepd.scope``); hypothesis feeds each parser structure-aware garbage.
"""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from sentinel.agent.jobs import SlurmTask, parse_listpids, slurm_from_cgroup
from sentinel.slurm import REASON_PREFIX, SINFO_FORMAT, drain_reason, parse_sinfo

SEP = "\x1f"


def line(*fields: str) -> str:
    return SEP.join(fields)


def test_sinfo_format_asks_for_the_reason_last() -> None:
    # the reason is free text (someone else's may contain anything): it must be the last, unsplit column
    assert SINFO_FORMAT.endswith("%E")


def test_parse_sinfo_states_reasons_and_times() -> None:
    text = "\n".join(
        [
            line(
                "sn1",
                "drained",
                "root",
                "2026-12-01T10:21:25",
                "sentinel: stuck not_entered_collective v000002",
            ),
            line("sn2", "idle", "Unknown", "Unknown", "none"),
            line("sn3", "down*", "slurm", "2026-12-01T09:00:00", "Not responding"),
            line("sn4", "draining", "alice", "2026-12-01T10:00:00", "maintenance | kernel 6.8 ; rm -rf"),
            line(
                "sn1", "idle", "x", "Unknown", "none"
            ),  # the same node in a second partition: first line wins
            "garbage without separators",
        ]
    )
    nodes = {n.name: n for n in parse_sinfo(text)}
    assert sorted(nodes) == ["sn1", "sn2", "sn3", "sn4"]
    sn1 = nodes["sn1"]
    assert sn1.state == "drained" and sn1.drained_by_sentinel and sn1.unavailable
    assert sn1.reason_time == dt.datetime(2026, 12, 1, 10, 21, 25).timestamp()
    assert sn1.reason_user == "root"
    assert not nodes["sn2"].unavailable and nodes["sn2"].reason == "" and nodes["sn2"].reason_time is None
    assert nodes["sn3"].state == "down" and nodes["sn3"].not_responding and nodes["sn3"].unavailable
    assert not nodes["sn3"].drained_by_sentinel
    assert nodes["sn4"].reason == "maintenance | kernel 6.8 ; rm -rf" and not nodes["sn4"].drained_by_sentinel


def test_drain_reason_is_one_line_prefixed_and_bounded() -> None:
    assert drain_reason("faulty xid_79\nGPU 3") == f"{REASON_PREFIX} faulty xid_79 GPU 3"
    assert drain_reason("sentinel: already prefixed") == "sentinel: already prefixed"
    assert len(drain_reason("x" * 5000)) == 200


@given(st.lists(st.lists(st.text(max_size=40), max_size=7), max_size=30))
def test_parse_sinfo_never_raises(rows: list[list[str]]) -> None:
    nodes = parse_sinfo("\n".join(SEP.join(r) for r in rows))
    assert len({n.name for n in nodes}) == len(nodes)
    for n in nodes:
        assert n.name and not any(c.isspace() for c in n.name)


CGROUP_V1 = """12:pids:/slurm/uid_1000/job_4242/step_0/task_3
11:memory:/slurm/uid_1000/job_4242/step_0/task_3
10:devices:/slurm/uid_1000/job_4242/step_0
9:freezer:/slurm/uid_1000/job_4242/step_0
4:cpuset:/slurm/uid_1000/job_4242/step_0
1:name=systemd:/system.slice/slurmd.service
0::/
"""
CGROUP_V1_MULTI = "7:memory:/slurm_node17/uid_0/job_17/step_batch/task_0\n"
CGROUP_V2 = "0::/system.slice/slurmstepd.scope/job_99812/step_2/user/task_11\n"
CGROUP_V2_STEPD = "0::/system.slice/slurmstepd.scope/job_99812/step_extern/slurm\n"
CGROUP_V2_MULTI = "0::/system.slice/gpu-a-03_slurmstepd.scope/job_7/step_interactive/user/task_0\n"
NOT_SLURM = "0::/user.slice/user-1000.slice/session-3.scope\n12:pids:/docker/job_runner/abc\n"


def test_slurm_from_cgroup_v1_and_v2_layouts() -> None:
    assert slurm_from_cgroup(CGROUP_V1) == SlurmTask(job_id="4242", step="0", local_id=3)
    assert slurm_from_cgroup(CGROUP_V1_MULTI) == SlurmTask(job_id="17", step="batch", local_id=0)
    assert slurm_from_cgroup(CGROUP_V2) == SlurmTask(job_id="99812", step="2", local_id=11)
    assert slurm_from_cgroup(CGROUP_V2_STEPD) == SlurmTask(job_id="99812", step="extern", local_id=None)
    assert slurm_from_cgroup(CGROUP_V2_MULTI) == SlurmTask(job_id="7", step="interactive", local_id=0)
    assert slurm_from_cgroup(NOT_SLURM) is None
    assert slurm_from_cgroup("") is None


LISTPIDS = """PID      JOBID    STEPID   LOCALID GLOBALID
2131     4242     batch    0       0
2200     4242     0        0       4
2201     4242     0        1       5
2250     4242     extern   -       -
"""


def test_parse_listpids() -> None:
    found = parse_listpids(LISTPIDS)
    assert found[2201] == SlurmTask(job_id="4242", step="0", local_id=1, global_id=5)
    assert found[2250] == SlurmTask(job_id="4242", step="extern", local_id=None, global_id=None)
    assert 0 not in found and len(found) == 4


segments = st.one_of(
    st.sampled_from(
        ["slurm", "uid_0", "job_1", "job_", "step_0", "step_batch", "user", "task_2", "task_x", ""]
    ),
    st.text(alphabet="jobstepuidtask_0123456789/:.", max_size=20),
)


@given(st.lists(st.tuples(st.text(max_size=8), st.lists(segments, max_size=12)), max_size=20))
def test_slurm_from_cgroup_never_raises(lines: list[tuple[str, list[str]]]) -> None:
    text = "\n".join(f"{head}::/" + "/".join(parts) for head, parts in lines)
    task = slurm_from_cgroup(text)
    if task is not None:
        assert task.job_id.isdigit()


@given(
    st.lists(
        st.lists(st.one_of(st.text(max_size=12), st.integers(-5, 2**70).map(str)), max_size=7), max_size=30
    )
)
def test_parse_listpids_never_raises(rows: list[list[str]]) -> None:
    for pid, task in parse_listpids("\n".join(" ".join(r) for r in rows)).items():
        assert pid >= 0 and task.job_id.isdigit()
