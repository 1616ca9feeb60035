"""A live process's Python stacks through ``py-spy dump --json --nonblocking``, bounded in time and bytes.

py-spy reads the interpreter's memory from outside with ``process_vm_readv``; ``--nonblocking`` leaves the
process running (no ptrace stop), so the ``ptrace()`` system call is never made and the agent's unit keeps
it filtered out. A rank hung in a collective has a still stack, which is read exactly; a running thread may
be caught mid-change. No restart, injected code or signal handler is needed. py-spy is one static binary
for every CPython version (the agent's Python need not match the job's) and its JSON is parsed into typed
frames rather than scraped. Reading another user's process passes the kernel's ptrace access check with
``CAP_SYS_PTRACE``. The reader is a subprocess with a deadline whose output is read up to a byte limit;
past either it is killed and the stack is reported as not read.
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

import msgspec

from sentinel.components.bounds import MAX_SHORT_CHARS
from sentinel.wire import StackFrame, ThreadStack

#: frames kept per thread (innermost first); a deeper stack keeps its innermost and outermost ones
MAX_FRAMES = 128
#: threads kept per process
MAX_THREADS = 256


class StackReader(Protocol):
    """Reads the Python stacks of a live process: (threads, error); error is "" on success."""

    def __call__(self, pid: int, timeout_s: float, max_bytes: int) -> tuple[list[ThreadStack], str]: ...


class _PyFrame(msgspec.Struct):
    name: str = ""
    filename: str = ""
    line: int = 0


class _PyThread(msgspec.Struct):
    thread_id: int = 0
    thread_name: str | None = None
    active: bool = False
    owns_gil: bool = False
    frames: list[_PyFrame] = []


_dump_decoder = msgspec.json.Decoder(list[_PyThread])


def parse_dump(data: bytes, max_frames: int = MAX_FRAMES) -> list[ThreadStack]:
    """``py-spy dump --json`` output → typed thread stacks (innermost frame first), each bounded.

    Raises :class:`ValueError` for output that is not py-spy's JSON.
    """
    try:
        threads = _dump_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"not py-spy JSON: {str(exc)[:200]}") from None
    out: list[ThreadStack] = []
    for thread in threads[:MAX_THREADS]:
        frames = thread.frames
        cut = max(0, len(frames) - max_frames)
        if cut:
            head = max_frames // 2
            frames = frames[:head] + frames[len(frames) - (max_frames - head) :]
        out.append(
            ThreadStack(
                thread_id=thread.thread_id,
                name=(thread.thread_name or "")[:MAX_SHORT_CHARS],
                active=thread.active,
                owns_gil=thread.owns_gil,
                frames=[
                    StackFrame(name=f.name[:MAX_SHORT_CHARS], file=f.filename[-MAX_SHORT_CHARS:], line=f.line)
                    for f in frames
                ],
                frames_cut=cut,
            )
        )
    return out


def find_py_spy(configured: str = "") -> str | None:
    """The py-spy binary: the configured path, else on PATH, else next to this interpreter (a venv), else
    where the installed ``py-spy`` wheel put it."""
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    found = shutil.which("py-spy")
    if found:
        return found
    candidates = [Path(sys.executable).parent / "py-spy", Path(sys.prefix) / "bin" / "py-spy"]
    import importlib.metadata  # here: its imports (email, zipfile) are memory the agent keeps for one lookup

    try:  # installed with this package (the ``stacks`` extra): the wheel's own record names the binary
        files = importlib.metadata.distribution("py-spy").files or []
        candidates += [Path(str(f.locate())) for f in files if f.name == "py-spy"]
    except importlib.metadata.PackageNotFoundError:
        pass
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            return str(candidate.resolve())
    return None


def read_bounded(argv: list[str], timeout_s: float, max_bytes: int) -> tuple[bytes, str]:
    """Run ``argv`` (no shell, no stdin); (stdout, error). Killed past ``timeout_s`` or ``max_bytes``."""
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    except OSError as exc:
        return b"", f"cannot run {Path(argv[0]).name}: {exc}"
    out = bytearray()
    err = bytearray()
    deadline = time.monotonic() + timeout_s
    problem = ""
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        open_streams = 2
        while open_streams:
            left = deadline - time.monotonic()
            if left <= 0:
                problem = f"no answer within {timeout_s:g} s"
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    continue
                buffer: bytearray = key.data
                buffer += chunk
            if len(out) > max_bytes:
                problem = f"output over {max_bytes} bytes"
                break
            del err[4096:]
    if problem:
        proc.kill()
    code = proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    if problem:
        return b"", problem
    if code != 0:
        detail = err.decode("utf-8", "replace").strip().splitlines()
        return b"", f"exit {code}: {detail[-1][:300] if detail else 'no message'}"
    return bytes(out), ""


class PySpy:
    """:class:`StackReader` over the ``py-spy`` binary (``binary``: its path; "" finds it)."""

    def __init__(self, binary: str = "") -> None:
        self._configured = binary
        self._found = False
        self._binary: str | None = None

    @property
    def binary(self) -> str | None:
        """The binary, looked up on the first stack read (the lookup reads package metadata, whose modules
        an agent that never reads a stack would keep in memory)."""
        if not self._found:
            self._binary, self._found = find_py_spy(self._configured), True
        return self._binary

    def __call__(self, pid: int, timeout_s: float, max_bytes: int) -> tuple[list[ThreadStack], str]:
        if self.binary is None:
            return [], "py-spy not installed (pip install 'sentinel[stacks]')"
        argv = [self.binary, "dump", "--pid", str(pid), "--json", "--nonblocking"]
        data, error = read_bounded(argv, timeout_s, max_bytes)
        if error:
            return [], error
        try:
            return parse_dump(data), ""
        except ValueError as exc:
            return [], str(exc)
