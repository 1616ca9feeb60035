"""A step of the analysis worked out in a forked child: the same result, errors raised here, no child left.

Not collected with the suite: :func:`sentinel.fr.aside.run_aside` forks only in a process of one thread (a
fork copies only the calling thread), and the suite's process has others by the time these would run
(servers and watchers of earlier tests). ``tests/fr/test_aside.py`` runs this file in a fresh pytest.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sentinel.fr import analysis
from sentinel.fr.analysis import analyze
from sentinel.fr.aside import run_aside
from sentinel.fr.dumpset import analyze_dir, summarize_dir
from tests.support import CORPUS

DATA = Path(__file__).resolve().parent.parent / "data" / "fr"


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    assert threading.active_count() == 1, "run this file in a process of one thread (see the docstring)"
    yield


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


def test_the_childs_result_comes_back_and_the_child_is_reaped() -> None:
    parent = os.getpid()
    before = _children()
    step = run_aside(lambda: [(os.getpid() != parent, 2.5, "x", -(2**62))])
    assert step.result() == [(True, 2.5, "x", -(2**62))]  # computed in the child
    assert _children() == before


def test_a_child_that_delivers_nothing_leaves_the_step_to_this_process() -> None:
    parent = os.getpid()

    def compute() -> str:
        if os.getpid() != parent:
            os._exit(3)  # a child killed or failed: nothing on the pipe
        return "here"

    assert run_aside(compute).result() == "here"


def test_an_error_of_the_step_is_raised_here() -> None:
    def compute() -> None:
        raise ValueError("bad step")

    step = run_aside(compute)
    with pytest.raises(ValueError, match="bad step"):
        step.result()


def test_close_ends_a_child_whose_result_is_not_wanted() -> None:
    parent = os.getpid()
    read_fd, write_fd = os.pipe()

    def compute() -> bytes:
        return os.read(read_fd, 1) if os.getpid() != parent else b""  # the child blocks for good

    before = _children()
    step = run_aside(compute)
    assert _children() - before  # it runs
    step.close()
    assert _children() == before
    os.close(read_fd)
    os.close(write_fd)


@pytest.mark.parametrize(
    "folder",
    [
        DATA / "wrapped_hang_n8" / "pickle",
        DATA / "pp_healthy_n4" / "pickle",
        CORPUS / "flight_recorder" / "straggler_n8" / "pickle",
    ],
    ids=lambda p: p.parent.name,
)
def test_the_analysis_is_the_same_with_its_stragglers_aside(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(analysis, "ASIDE_FROM_TRACKS", 0)  # these sets are small: aside all the same
    summaries = summarize_dir(folder, workers=0)
    alone = analyze(summaries).to_json()
    forks: list[int] = []
    fork = os.fork

    def counted_fork() -> int:
        pid = fork()
        if pid:
            forks.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counted_fork)
    assert analyze(summaries, aside=True).to_json() == alone
    assert len(forks) == 1  # the lags were worked out in a child
    assert analyze_dir(folder, workers=1, aside=True).to_json() == alone
