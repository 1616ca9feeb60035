"""Fast path for big logs: find the few lines worth parsing at C speed, parse only those.

:class:`LogScanner` works on big binary chunks: the gate (:mod:`sentinel.signals.gate`) finds the lines
that hold a signal word, newlines are counted with ``bytes.count`` while the chunk is in cache, and only
candidate lines (joined with their continuation lines for multi-line records) are classified. The output
is exactly what :func:`classify_line` on every line would give, whichever gate engine runs; long lines and
pending blocks are bounded (``MAX_LINE``, ``MAX_BLOCK``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Final

import msgspec

from sentinel.signals.classify import classify_line, classify_text, is_noise, line_events
from sentinel.signals.gate import Gate, default_gate
from sentinel.signals.record import Classified, make_event, most_severe
from sentinel.signals.stamp import line_stamp

CHUNK_SIZE: Final = 2 << 20
MAX_LINE: Final = 1 << 20
MAX_BLOCK: Final = 64 * 1024
MAX_BLOCK_LINES: Final = 40


_SECTION_HEAD_RE: Final = re.compile(r"^\s*(?:ECC Errors|ECC Mode|Remapped Rows|Retired [Pp]ages)\s*:?\s*$")
_ROOT_CAUSE_HEAD: Final = "Root Cause (first observed failure)"
_WRAP_HEAD_RE: Final = re.compile(
    r"ProcessGroupNCCL|atchdog|what\(\)|WorkNCCL|Test (?:CUDA|NCCL) failure|MISMATCH"
)
# A line that starts a new log record (so it cannot be the continuation of a hard-wrapped message).
_NEW_RECORD_RE: Final = re.compile(
    r"^(?:\s*\[|\s*\d{4}-\d\d-\d\d|[A-Z][a-z]{2} [ \d]\d \d\d:|[^\s:]{1,255}:\d{1,10}:\d{1,10} \[|[IWEF]\d{4} |"
    r"NCCL (?:INFO|WARN|version)|\s*NVRM|[\w.]{1,60}: \S|Traceback|\s*File \")"
)
_ROOT_CAUSE_LINE_RE: Final = re.compile(r"^\s*(?:\[\d{1,6}\]:|[\w ]{1,20}:)")


class LogScanner:
    """Incremental classifier for a byte stream of log text (a file, stdin, a tailed log).

    ``feed`` chunks in any size; ``finish`` at the end. Events carry the 1-based ``line`` they start on.
    With ``include_all`` every line yields an object (noise as ``other``/``info`` or ``nccl_info``).
    """

    def __init__(self, *, include_all: bool = False, gate: Gate | None = None) -> None:
        self._include_all = include_all
        self._gate = gate if gate is not None else default_gate()
        self._buffer = b""
        self._line_base = 0
        self.lines = 0
        self.bytes = 0

    def feed(self, data: bytes) -> list[Classified]:
        """Classify every complete line in ``data`` (plus what was buffered).

        The chunk itself is never copied: the buffered partial line is completed with the head of
        ``data`` and classified on its own, then the rest of ``data`` is scanned in place.
        """
        self.bytes += len(data)
        events: list[Classified] = []
        begin = 0
        if self._buffer:
            newline = data.find(b"\n")
            if newline < 0:
                buffer = self._buffer + data
                if len(buffer) <= MAX_LINE:
                    self._buffer = buffer
                    return events
                data, self._buffer = buffer, b""
            else:
                head = self._buffer + data[: newline + 1]
                self._buffer = b""
                events, used = self._process(head, 0, len(head), final=False)
                if used < len(head):
                    # A multi-line record starts there and continues in data (rare, bounded by MAX_BLOCK).
                    data = head[used:] + data[newline + 1 :]
                else:
                    begin = newline + 1
        last = data.rfind(b"\n", begin)
        if last < 0:
            rest = data[begin:]
            if len(rest) <= MAX_LINE:
                self._buffer = rest
                return events
            data, begin, last = rest + b"\n", 0, len(rest)
        more, used = self._process(data, begin, last + 1, final=False)
        events.extend(more)
        self._buffer = data[used:]
        return events

    def finish(self) -> list[Classified]:
        """Classify whatever is left (a last line without newline, a pending block)."""
        if not self._buffer:
            return []
        body = self._buffer if self._buffer.endswith(b"\n") else self._buffer + b"\n"
        self._buffer = b""
        events, _ = self._process(body, 0, len(body), final=True)
        return events

    def _candidates(self, body: bytes, begin: int, limit: int) -> list[int]:
        """Offsets of the lines of ``body[begin:limit]`` worth classifying (all of them with
        ``include_all``), ascending."""
        if not self._include_all:
            return self._gate.line_starts(body, begin, limit)
        starts = [begin]
        pos = body.find(b"\n", begin, limit)
        while 0 <= pos < limit - 1:
            starts.append(pos + 1)
            pos = body.find(b"\n", pos + 1, limit)
        return starts

    def _process(self, body: bytes, begin: int, limit: int, *, final: bool) -> tuple[list[Classified], int]:
        """Classify the complete lines in ``body[begin:limit]``; return the events and how far it got."""
        events: list[Classified] = []
        skip_until = 0
        used = limit
        count = body.count
        counted_to, newlines = begin, 0  # newlines in body[begin:counted_to]
        for start in self._candidates(body, begin, limit):
            if start < skip_until:
                continue
            end = body.find(b"\n", start)
            line = body[start:end].decode("utf-8", "replace")
            if not line.strip():
                continue
            block_end = self._block_end(body, line, end, limit, final=final)
            if block_end is None and not final and limit - start <= MAX_BLOCK:
                used = start  # the block may continue in the next chunk; keep it
                break
            if block_end is not None and block_end > end:
                event = classify_text(body[start:block_end].decode("utf-8", "replace"))
                if is_noise(event) and not self._include_all:
                    continue
                skip_until = block_end
            else:
                found = self._classify_one(line)
                if found is None:
                    continue
                event = found
            stamp, host = line_stamp(line)
            newlines += count(b"\n", counted_to, start)
            counted_to = start
            events.append(
                msgspec.structs.replace(
                    event,
                    line=self._line_base + newlines + 1,
                    time=stamp,
                    host=event.host if event.host is not None else host,
                )
            )
        newlines += count(b"\n", counted_to, used)
        self._line_base = self.lines = self._line_base + newlines
        return events, used

    def _classify_one(self, line: str) -> Classified | None:
        if not self._include_all:
            return classify_line(line)
        best = most_severe(line_events(line.rstrip("\r\n")))
        return best if best is not None else make_event("other", "info")

    @staticmethod
    def _block_end(body: bytes, head: str, end: int, limit: int, *, final: bool) -> int | None:
        """End offset of the multi-line record that ``head`` starts; ``end`` when it is a single line and
        ``None`` when the record may continue past the end of ``body`` (more data may come)."""
        accept = continuation_rule(head)
        if accept is None:
            return end
        pos = end + 1
        for _ in range(MAX_BLOCK_LINES):
            if pos >= limit:
                return pos - 1 if final else None
            nxt = body.find(b"\n", pos, limit)
            if nxt - pos > 4096 or not accept(body[pos:nxt].decode("utf-8", "replace")):
                break
            pos = nxt + 1
        return pos - 1 if pos - 1 > end else end


def continuation_rule(head: str) -> Callable[[str], bool] | None:
    """How to recognise the continuation lines of a record that starts with ``head``; ``None`` when
    ``head`` is a complete single-line record."""
    if _SECTION_HEAD_RE.match(head) is not None or "MISMATCH" in head:
        return _indented
    if _ROOT_CAUSE_HEAD in head:
        return _root_cause_line
    if _WRAP_HEAD_RE.search(head) is not None and _looks_cut(head):
        return _wrapped_continuation
    return None


def _looks_cut(head: str) -> bool:
    """A hard-wrapped message's first line stops mid-sentence; a complete one ends with . ! or )."""
    tail = head.rstrip()
    return not tail.endswith((".", "!", ")", "'", '"'))


def _indented(line: str) -> bool:
    return bool(line.strip()) and line[:1] in (" ", "\t")


def _root_cause_line(line: str) -> bool:
    return _ROOT_CAUSE_LINE_RE.match(line) is not None


def _wrapped_continuation(line: str) -> bool:
    return bool(line.strip()) and len(line) < 1000 and _NEW_RECORD_RE.match(line) is None


def scan_bytes(data: bytes, *, include_all: bool = False, gate: Gate | None = None) -> list[Classified]:
    """Classify a whole in-memory log (convenience for tests and small inputs)."""
    scanner = LogScanner(include_all=include_all, gate=gate)
    events = []
    for offset in range(0, len(data), CHUNK_SIZE):
        events.extend(scanner.feed(data[offset : offset + CHUNK_SIZE]))
    events.extend(scanner.finish())
    return events


def iter_chunks(stream: object, size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """Read a binary stream in big chunks."""
    read = getattr(stream, "read")  # noqa: B009
    while True:
        chunk = read(size)
        if not chunk:
            return
        yield chunk
