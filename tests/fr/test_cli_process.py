"""``sentinel fr analyze`` as a real process: SIGTERM during a large decode, progress on a terminal only.

The dump set is thousands of hard links to the eight real dumps of ``wrapped_hang_n8`` (a hard link is a
regular file, not a symlink): a decode that lasts seconds without writing megabytes."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

DATA = Path(__file__).resolve().parent.parent / "data" / "fr" / "wrapped_hang_n8" / "pickle"
PROGRESS = b"dumps read and decoded"


def _linked_set(root: Path, ranks: int) -> Path:
    sources = sorted(DATA.iterdir())
    for r in range(ranks):
        src = sources[r % len(sources)]
        os.link(src, root / f"nccl_trace_rank_{r}.gz")
    return root


def _start(folder: Path, *extra: str, stderr: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sentinel", "fr", "analyze", str(folder), *extra],
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
    )


def _read_until(fd: int, needle: bytes, proc: subprocess.Popen[bytes], limit_s: float = 120.0) -> bytes:
    """What the pty shows until ``needle`` appears (or the process ends)."""
    seen = b""
    deadline = time.monotonic() + limit_s
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    return seen


def test_sigterm_during_a_large_decode_exits_at_once_and_leaves_no_worker(tmp_path: Path) -> None:
    folder = _linked_set(tmp_path, 4096)
    master, slave = pty.openpty()
    proc = _start(folder, "--progress-after", "0", stderr=slave)
    os.close(slave)
    try:
        seen = _read_until(master, PROGRESS, proc)
        assert PROGRESS in seen, seen[-500:]  # decoding has begun: the workers run
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert workers, "the decode runs in worker processes"
        assert proc.poll() is None, "the set must outlast the first progress line"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=2.0) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    assert proc.stdout is not None and proc.stdout.read() == b""
    for w in workers:
        alive = psutil.pid_exists(w.pid) and w.is_running() and w.status() != psutil.STATUS_ZOMBIE
        assert not alive, f"worker {w.pid} outlived the CLI"


def test_progress_on_a_terminal_only(tmp_path: Path) -> None:
    folder = _linked_set(tmp_path, 64)
    master, slave = pty.openpty()
    proc = _start(folder, "--json", "--progress-after", "0", stderr=slave)
    os.close(slave)
    try:
        seen = _read_until(master, b"\n", proc)
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(master)
    assert proc.returncode == 0
    assert b"sentinel fr analyze: 64/64 " + PROGRESS in seen
    assert out.startswith(b'{"verdict"')  # stdout carries the analysis alone
    # the same run with stderr piped: nothing but the analysis, not a byte of progress
    piped = subprocess.run(
        [sys.executable, "-m", "sentinel", "fr", "analyze", str(folder), "--json", "--progress-after", "0"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert piped.returncode == 0
    assert piped.stderr == b""
    assert piped.stdout == out
    # on a terminal, a run shorter than the threshold shows nothing either
    master, slave = pty.openpty()
    proc = _start(folder, "--json", "--progress-after", "3600", stderr=slave)
    os.close(slave)
    try:
        out2, _ = proc.communicate(timeout=120)
        tail = _read_until(master, PROGRESS, proc, limit_s=0.5)
    finally:
        os.close(master)
    assert proc.returncode == 0 and out2 == out
    assert PROGRESS not in tail


_PROBE = """
import sys
before = set(sys.modules)  # what the interpreter's start imported (site: an editable install's hook)
from sentinel.cli import main
rc = main(["fr", "analyze", sys.argv[1], "--json"])
watched = (
    "msgspec", "multiprocessing", "shutil", "sentinel.fr.coerce", "pathlib", "argparse", "typing",
    "typing_extensions", "inspect",
)
print(sorted(m for m in watched if m in sys.modules and m not in before))
import typing_extensions  # importable as ever once msgspec was imported without it
"""


def test_a_small_set_is_analyzed_without_importing_msgspec_or_multiprocessing(tmp_path: Path) -> None:
    """What a small ``fr analyze`` pays before its first dump is mostly imports: msgspec (with
    typing_extensions and inspect), multiprocessing, shutil, pathlib (with urllib.parse, fnmatch and
    ipaddress), argparse (with gettext and locale: its plain arguments are read without it) and typing
    (sentinel.fr.records) stay out of its path. A large set imports msgspec once, for its C checks of every entry,
    still without typing_extensions and inspect (sentinel.fr.coerce); the output is the same either way
    (test_hostile)."""
    for ranks, expected in ((8, "[]"), (128, "['msgspec', 'sentinel.fr.coerce', 'typing']")):
        folder = tmp_path / str(ranks)
        folder.mkdir()
        _linked_set(folder, ranks)
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, str(folder)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        lines = proc.stdout.splitlines()
        assert lines[-1] == expected, proc.stderr
        assert '"verdict": "hang"' in lines[0]
