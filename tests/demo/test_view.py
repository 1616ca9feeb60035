"""The live terminal view and the plain log narration, rendered from hand-built view models."""

from __future__ import annotations

import re

from sentinel.demo.model import JobView
from sentinel.demo.narrate import Narrator
from sentinel.demo.view import frame_text, render_frame
from tests.demo.helpers import fault, verdict, view

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
XID = fault(0, 10.0, "host-002", 6, "xid", xid=79)
HANG = fault(1, 20.0, "host-003", 2, "hang")
JOBS = (JobView("pretrain", "running", 96, 3), JobView("finetune", "stalled", 8, 1))


def grid_row(lines: list[str], host: str) -> str:
    """The GPU letters of ``host`` in a no-colour frame."""
    for line in lines:
        match = re.search(rf"{host} (\S+)", line)
        if match:
            return match.group(1)
    raise AssertionError(f"{host} not in the grid:\n" + "\n".join(lines))


def test_grid_cells_show_each_gpus_worst_state() -> None:
    vm = view(
        [XID, HANG],
        [
            verdict("1", "faulty", "host-002", 6, 11.0),
            verdict("2", "straggler", "host-002", 6, 12.0),
            verdict("3", "stuck", "host-003", 2, 27.0),
            verdict("4", "degraded", "host-000", 1, 28.0, state="closed"),
        ],
        t_s=30.0,
        seen=3,
        jobs=JOBS,
    )
    lines = render_frame(vm, width=120, height=60, color=False)
    assert grid_row(lines, "host-002") == "......F."
    assert grid_row(lines, "host-003") == "??S?????"  # not seen yet, except what a verdict names
    assert grid_row(lines, "host-000") == "........"  # a closed verdict no longer colours the grid


def test_silent_host_and_lost_gpu() -> None:
    vm = view([], [], t_s=5.0, down=frozenset({"host-001"}), gpu_raw={("host-000", 3): "lost"})
    lines = render_frame(vm, width=120, height=60, color=False)
    assert grid_row(lines, "host-001") == "XXXXXXXX"
    assert grid_row(lines, "host-000") == "...F...."


def test_faults_show_caught_verdict_and_delay_and_waiting() -> None:
    vm = view(
        [XID, HANG],
        [
            verdict(
                "1",
                "faulty",
                "host-002",
                6,
                12.25,
                reason="xid_79",
                action="reset_gpu",
                evidence=("Xid 79 at t",),
            )
        ],
        t_s=24.0,
        jobs=JOBS,
    )
    text = "\n".join(render_frame(vm, width=160, height=60, color=False))
    xid_line = next(line for line in text.splitlines() if "xid 79" in line and "t+10" in line)
    assert "caught after 2.2s" in xid_line and "xid_79" in xid_line and "reset_gpu" in xid_line
    hang_line = next(line for line in text.splitlines() if "hang" in line and "t+20" in line)
    assert "waiting" in hang_line and "4s" in hang_line
    assert "evidence: Xid 79 at t" in text
    assert "STALLED" in text and "finetune" in text


def test_a_fault_past_its_bound_without_verdict_is_shown_missed() -> None:
    text = "\n".join(render_frame(view([XID], [], t_s=30.0), width=160, height=60, color=False))
    assert "MISSED: no verdict within 4s" in next(line for line in text.splitlines() if "xid 79" in line)


def test_wrong_flag_is_shown() -> None:
    vm = view([HANG], [verdict("p", "stuck", "host-003", 3, 25.0)], t_s=30.0)
    text = "\n".join(render_frame(vm, width=160, height=60, color=False))
    assert "flagged wrongly" in text and "host-003 gpu 3" in text


def test_frame_fits_the_terminal_with_and_without_colour() -> None:
    many = [verdict(str(i), "faulty", "host-001", i % 8, float(i), evidence=("x" * 300,)) for i in range(40)]
    vm = view([XID, HANG], many, t_s=50.0, jobs=JOBS)
    for width, height in ((40, 10), (80, 24), (200, 50)):
        for color in (False, True):
            lines = render_frame(vm, width=width, height=height, color=color)
            assert len(lines) <= height
            assert all(len(ANSI.sub("", line)) <= width for line in lines)
            assert color or not any(ANSI.search(line) for line in lines)
    coloured = render_frame(vm, width=200, height=50, color=True)
    assert any("\x1b[31;1m■" in line for line in coloured)


def test_big_fleet_falls_back_to_one_cell_per_host() -> None:
    vm = view([], [verdict("1", "stuck", "host-700", 4, 3.0)], t_s=5.0, n_hosts=1024)
    lines = render_frame(vm, width=100, height=30, color=False)
    assert any("one cell per host" in line for line in lines)
    cells = "".join(line for line in lines if re.fullmatch(r"[.sDSFX?]+", line))
    assert cells[700] == "S" and cells.count("S") == 1
    assert len(lines) <= 30


def test_frame_text_redraws_in_place() -> None:
    text = frame_text(["a", "b"])
    assert text.startswith("\x1b[H") and text.endswith("\x1b[J")
    assert text.count("\x1b[K\n") == 2


def test_narrator_tells_each_change_once() -> None:
    narrator = Narrator(status_every_s=1000.0)
    first = narrator.lines(view([XID, HANG], [], t_s=11.0, jobs=JOBS))
    assert any("fault injected: xid 79 on host-002 gpu 6" in line for line in first)
    assert not any("hang" in line for line in first)
    assert any("job finetune: stalled" in line for line in first)
    assert any("status:" in line for line in first)
    stamps = [float(re.match(r"\[t\+\s*([\d.]+)s\]", line).group(1)) for line in first]  # type: ignore[union-attr]
    assert stamps == sorted(stamps)  # told in time order
    v = verdict(
        "1", "faulty", "host-002", 6, 12.5, reason="xid_79", action="reset_gpu", evidence=("e1", "e2")
    )
    second = narrator.lines(view([XID, HANG], [v], t_s=13.0, jobs=JOBS))
    assert len(second) == 1
    assert "verdict opened: faulty on host-002 gpu 6" in second[0]
    assert "action=reset_gpu" in second[0] and "after 2.5s" in second[0] and "evidence: e1; e2" in second[0]
    closed = verdict("1", "faulty", "host-002", 6, 12.5, state="closed")
    third = narrator.lines(view([XID, HANG], [closed], t_s=14.0, jobs=JOBS))
    assert len(third) == 1 and "closed" in third[0]
    assert narrator.lines(view([XID, HANG], [closed], t_s=15.0, jobs=JOBS)) == []
