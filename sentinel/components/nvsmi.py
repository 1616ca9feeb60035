"""Reader for indented ``nvidia-smi -q`` excerpts ("Section\n    Key : Value").

Only structure, no meaning: returns (path, value) pairs where path is the lower-cased chain of section
names. Values such as ``N/A`` stay text; callers decide what counts as a number.
"""

from __future__ import annotations

from typing import Final

from sentinel.text import parse_int

MAX_LINES: Final = 400


def read_sections(text: str) -> list[tuple[tuple[str, ...], str]]:
    """Flatten an indented nvidia-smi excerpt into ``((section, ..., key), value)`` pairs."""
    pairs: list[tuple[tuple[str, ...], str]] = []
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines()[:MAX_LINES]:
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = stripped.partition(":")
        key = " ".join(key.split()).lower()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(name for _, name in stack), key)
        if not sep or not value.strip():
            stack.append((indent, key))
            continue
        pairs.append((path, value.strip()))
    return pairs


def count_value(value: str) -> int | None:
    """``"639 bank(s)"`` -> 639, ``"N/A"`` -> None."""
    head = value.split(maxsplit=1)[0] if value.strip() else ""
    return parse_int(head) if head.isdigit() else None


def yes_no(value: str) -> bool | None:
    """``Yes``/``No`` -> bool; anything else (``N/A``) -> None."""
    lowered = value.strip().lower()
    if lowered in {"yes", "true", "enabled"}:
        return True
    if lowered in {"no", "false", "disabled"}:
        return False
    return None
