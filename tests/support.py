"""Helpers shared by tests.

Tests that need an optional external component (Prometheus, Alertmanager, torch, Chromium, promtool,
systemd-analyze) call :func:`need`: outside CI they skip with a one-line reason; with
``SENTINEL_REQUIRE_E2E=1`` (set by ``.ci/run``) a missing component is a failure, so CI cannot pass by
skipping.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sentinel.wire import Batch

REPO = Path(__file__).resolve().parent.parent
#: a test's subprocess that imports torch: a few seconds quiet, over a minute on a loaded 2-core CI machine
#: (the import alone took 28-60 s at load 5, and a 120 s bound was within 15 s of failing); bounded below
#: pytest's 300 s per test, so such a run fails with its own message
TORCH_PROCESS_TIMEOUT_S = 240
#: The real data nobody here wrote (logs from real clusters, PyTorch Flight Recorder dumps), copied from
#: the shared corpus given to the project, so that a fresh clone runs every test without it.
CORPUS = REPO / "tests" / "data" / "corpus"


def require_e2e() -> bool:
    return os.environ.get("SENTINEL_REQUIRE_E2E", "") == "1"


def need(available: bool, reason: str) -> None:
    """Skip (or fail under SENTINEL_REQUIRE_E2E=1) when a component is missing."""
    if available:
        return
    if require_e2e():
        pytest.fail(f"required component missing: {reason}", pytrace=False)
    pytest.skip(reason)


def need_binary(name: str) -> str:
    path = shutil.which(name)
    need(path is not None, f"{name} not installed")
    assert path is not None
    return path


def need_module(name: str) -> None:
    need(importlib.util.find_spec(name) is not None, f"python module {name} not installed")


def corpus_path(*parts: str) -> Path:
    path = CORPUS.joinpath(*parts)
    assert path.exists(), f"test corpus file missing: {path}"
    return path


JOURNAL_REMOTE = Path("/lib/systemd/systemd-journal-remote")


def write_journal(path: Path, entries: list[dict[str, str | int]]) -> None:
    """Write real journal file ``path`` (must end in ``.journal``) holding ``entries``: they are
    serialised in journald's export format and converted by ``systemd-journal-remote``, so
    ``journalctl --directory``/``--file`` reads them as it reads a host's own journal (cursors, boots,
    ``-k``, ``-f`` and all)."""
    need(JOURNAL_REMOTE.exists(), "systemd-journal-remote not installed")
    export = "".join("".join(f"{key}={value}\n" for key, value in entry.items()) + "\n" for entry in entries)
    subprocess.run(
        [str(JOURNAL_REMOTE), "-o", str(path), "-"],
        input=export.encode(),
        check=True,
        capture_output=True,
        timeout=60,
    )


def sent(batch: Batch | None) -> Batch:
    """The batch an agent's tick spooled (:meth:`sentinel.agent.agent.Agent.step`): fails if it was held."""
    assert batch is not None, "the agent held this tick (stream.coalesce_ticks)"
    return batch
