"""The straggler lags worked out aside (:mod:`sentinel.fr.aside`): forked only where that is safe."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from sentinel.fr.aside import run_aside
from tests.support import REPO

CASES = Path(__file__).with_name("aside_cases.py")


def test_the_cases_in_a_process_of_one_thread() -> None:
    """``aside_cases.py`` needs a process whose only thread is the main one: a fresh pytest."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout


def test_a_process_with_other_threads_computes_the_step_itself() -> None:
    """A fork copies only the calling thread (a lock another thread holds stays held in the child), so with a
    second thread running the step is computed here, not in a child."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        parent = os.getpid()
        assert run_aside(lambda: os.getpid() == parent).result() is True
    finally:
        stop.set()
        other.join()
