"""The kernel log lines of the last minutes, every one of them (not only those the classifier forwards).

Incident evidence wants the kernel's own words around a fault — the lines before an Xid, a hung-task
report, a link flap — which the event stream leaves out when they classify as nothing. The kmsg/journal
collector notes each line here; the window is bounded in lines and bytes, oldest dropped first.
"""

from __future__ import annotations

from collections import deque

from sentinel.wire import MAX_TEXT_CHARS, KernelLine

#: lines kept at most
MAX_LINES = 5000
#: characters kept at most over all lines
MAX_CHARS = 2 * 1024 * 1024


class KernelWindow:
    """A bounded, time-ordered record of recent kernel lines."""

    def __init__(self, max_lines: int = MAX_LINES, max_chars: int = MAX_CHARS) -> None:
        self.max_lines = max_lines
        self.max_chars = max_chars
        self._lines: deque[KernelLine] = deque()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._lines)

    def note(self, t: float, text: str) -> None:
        line = KernelLine(t=t, text=text[:MAX_TEXT_CHARS])
        self._lines.append(line)
        self._chars += len(line.text)
        while self._lines and (len(self._lines) > self.max_lines or self._chars > self.max_chars):
            self._chars -= len(self._lines.popleft().text)

    def between(self, t0: float, t1: float, max_bytes: int) -> tuple[list[KernelLine], bool]:
        """The lines stamped within [t0, t1], at most ``max_bytes`` of text (the ones nearest the end of the
        window kept); (lines, cut: whether some were left out for the bound)."""
        picked: list[KernelLine] = []
        used = 0
        cut = False
        for line in reversed(self._lines):
            if line.t > t1:
                continue
            if line.t < t0:
                break
            cost = len(line.text.encode("utf-8", "replace")) + 16
            if used + cost > max_bytes:
                cut = True
                break
            used += cost
            picked.append(line)
        picked.reverse()
        return picked, cut
