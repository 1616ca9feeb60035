"""Which log lines can carry a signal: one multi-pattern scan over big chunks, at grep's speed or better.

Every rule that makes a line worth printing needs at least one word of :data:`GATE_PATTERNS` (the failure
words of :mod:`~sentinel.signals.rules` and the format parsers' anchors), so a line with none is noise and
only the others reach the Python classifier. Two engines give the same answer: :class:`HyperscanGate`
(Intel Hyperscan) and :class:`PythonGate` (``bytes.find`` per literal) when hyperscan is absent.
"""

from __future__ import annotations

import os
import threading
from typing import Final, Protocol

#: Literals, matched without regard to ASCII case. Grouped by the rules that need them; one literal may
#: serve several rules. Over-matching only costs time (the line is classified in Python and found to be
#: noise); a missing literal would lose events, which tests/signals/test_gate.py checks on every corpus line.
GATE_LITERALS: Final[tuple[bytes, ...]] = (
    # failure words (rules.failure_severity and the crash, launcher, comms, health rules)
    b"error",
    b"fail",
    b"fatal",
    b"exception",
    b"abort",
    b"kill",
    b"panic",
    b"crash",
    b"segfault",
    b"segmentation",
    b"core dumped",
    b"unhandled",
    b"illegal",
    b"corrupt",
    b"lockup",
    b"abnormal",
    b"terminat",
    b"out of memory",
    b"correct",
    b"recoverable",
    b"timeout",
    b"time out",
    b"timed out",
    b"timing out",
    b"hang",
    b"hung",
    b"not responding",
    b"unresponsive",
    b"health",
    b"degraded",
    b"down",
    b"unplugged",
    b"lost",
    b"retry",
    b"refused",
    b"reset",
    b"closed by",
    b"broken pipe",
    b"unreachable",
    b"mismatch",
    b"invalid",
    b"denied",
    b"stuck",
    b"throttl",
    b"limited by",
    b"insufficient",
    b"dead",
    b"missing",
    b"cancel",
    b"unavailable",
    b"violation",
    b"overflow",
    b"exceeded",
    b"no progress",
    b"preempt",
    b"exit",
    b"signal",
    b"sigsegv",
    b"sigabrt",
    b"sigbus",
    b"sigill",
    b"sigfpe",
    b"sigkill",
    b"assert",
    b"misaligned",
    b"peer access",
    b"cuda-capable",
    b"cuda initialization",
    b"driver combination",
    b"forward compatibility",
    b"cublas_status",
    b"cudnn_status",
    b"cuda_error",
    b"warn",
    b"|ccl_",
    b"traceback",
    # Xids and GPU memory (xid.py, rules._memory_events, nvidia-smi fields and sections)
    b"xid",
    b"fallen off",
    b"ecc mode",
    b"remap",
    b"retire",
    b"double",
    b"single",
    b"pending page",
    b"sram threshold",
    # kernel lines (kernel.py, rules._link_events)
    b"nvrm",
    b"nvswitch",
    b"aer:",
    b"pcie",
    b"carrier",
    b"port_err",
    b"link initiali",
    b"link reinitiali",
    b"link re-initiali",
    b"not ready",
    b"power limit",
    b"power cap",
    b"power-cap",
    b"blocked for more than",
    b"devices were found",
    b"unable to determine",
    b"device handle",
    b"nvml",
    b"stall",
    b"syndrome",
    b"peermem",
    b"nv_peer_mem",
    b"general protection",
    b"nobody cared",
    # nvidia-smi's GPU table row (its volatile uncorrected-ECC cell), read by kernel._gpu_tool_events
    b" off | ",
    b" on | ",
    # NCCL (nccl_log.py; init and version lines are info events that are not noise; error-return traces)
    b"nccl version",
    b"nranks",
    b".cc:",
    b".cu:",
    b".cpp:",
    b".h:",
    b".c:",
    b"got completion",
    b"got async event",
    b"async fatal",
    b"call to ",
    b"socket creation",
    # NCCL's socket layer and bootstrap quoted as a last error ("ncclSocketInit: ...", "socketFinalizeAccept:
    # wrong type 4 != 3", "Bootstrap : no socket interface found"); not plain "socket", which every
    # "via NET/Socket" channel line of NCCL's INFO chatter holds
    b"ncclsocket",
    b"wrong type",
    b"interface found",
    b"incomplete",
    # PyTorch (nccl_log.torch_events, the scanner's hard-wrap heads)
    b"worknccl",
    b"processgroupnccl",
    b"atchdog",
    b"eartbeat",
    b"dump",
    b"flight recorder",
    b"root cause",
    b"what()",
    b"estarting worker",
)


class Gate(Protocol):
    """Finds the lines of a chunk that contain at least one gate literal."""

    name: str

    def line_starts(self, body: bytes, begin: int, limit: int) -> list[int]:
        """Start offsets, ascending and unique, of the lines of ``body[begin:limit]`` with a match.

        ``begin`` is a line start and ``body[limit - 1]`` a newline.
        """
        ...

    def has_match(self, data: bytes) -> bool:
        """True when ``data`` (one line) contains a gate literal."""
        ...


class PythonGate:
    """The pure-Python engine: the chunk is lower-cased once (ASCII only, like Hyperscan's caseless mode)
    and each literal is found with ``bytes.find`` (C speed); a hit skips the rest of its line."""

    name = "python"

    def line_starts(self, body: bytes, begin: int, limit: int) -> list[int]:
        low = body[begin:limit].lower()
        size = len(low)
        starts: set[int] = set()
        find, rfind = low.find, low.rfind
        for literal in GATE_LITERALS:
            pos = find(literal)
            while pos >= 0:
                starts.add(rfind(b"\n", 0, pos) + 1)
                end = find(b"\n", pos)
                if end < 0 or end + 1 >= size:
                    break
                pos = find(literal, end + 1)
        return sorted(begin + start for start in starts)

    def has_match(self, data: bytes) -> bool:
        low = data.lower()
        return any(literal in low for literal in GATE_LITERALS)


class HyperscanGate:
    """The Hyperscan engine: all literals in one database, one block-mode scan per chunk; each hit is
    mapped to its line."""

    name = "hyperscan"

    def __init__(self) -> None:
        import hyperscan  # optional dependency: imported only here

        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._db.compile(
            expressions=list(GATE_LITERALS),
            ids=list(range(len(GATE_LITERALS))),
            elements=len(GATE_LITERALS),
            flags=[hyperscan.HS_FLAG_CASELESS | hyperscan.HS_FLAG_SINGLEMATCH] * len(GATE_LITERALS),
            literal=True,
        )
        # A database's scratch space serves one scan at a time.
        self._lock = threading.Lock()
        self._multi_lock = threading.Lock()
        self._multi = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._multi.compile(
            expressions=list(GATE_LITERALS),
            ids=list(range(len(GATE_LITERALS))),
            elements=len(GATE_LITERALS),
            flags=[hyperscan.HS_FLAG_CASELESS] * len(GATE_LITERALS),
            literal=True,
        )

    def line_starts(self, body: bytes, begin: int, limit: int) -> list[int]:
        ends: list[int] = []
        append = ends.append

        def on_match(_id: int, _start: int, end: int, _flags: int, _context: object) -> None:
            append(end)

        with self._multi_lock:
            region = body if begin == 0 and limit == len(body) else body[begin:limit]
            self._multi.scan(region, match_event_handler=on_match)
        if not ends:
            return []
        starts: list[int] = []
        line_end = -1
        rfind, find = body.rfind, body.find
        for end in sorted(ends):
            at = begin + end - 1  # the match's last byte: a literal never spans a newline
            if at <= line_end:
                continue  # another hit on a line already taken
            starts.append(rfind(b"\n", begin, at) + 1 or begin)
            newline = find(b"\n", at, limit)
            line_end = limit if newline < 0 else newline
        return starts

    def has_match(self, data: bytes) -> bool:
        found: list[bool] = []

        def on_match(_id: int, _start: int, _end: int, _flags: int, _context: object) -> None:
            found.append(True)

        with self._lock:
            self._db.scan(data, match_event_handler=on_match)
        return bool(found)


def load_gate(name: str = "auto") -> Gate:
    """``hyperscan``, ``python``, or ``auto`` (Hyperscan when it loads, else Python: same answers)."""
    if name == "python":
        return PythonGate()
    try:
        return HyperscanGate()
    except Exception:  # not installed, or this CPU lacks what the library needs
        if name == "hyperscan":
            raise
        return PythonGate()


_DEFAULT: list[Gate] = []


def default_gate() -> Gate:
    """The engine this process uses (chosen once; ``SENTINEL_LOG_GATE=python`` forces the fallback)."""
    if not _DEFAULT:
        _DEFAULT.append(load_gate(os.environ.get("SENTINEL_LOG_GATE", "auto")))
    return _DEFAULT[0]


def line_has_signal_words(line: str) -> bool:
    """True when ``line`` contains a gate literal; a line without one is noise."""
    return default_gate().has_match(line.encode("utf-8", "surrogateescape"))
