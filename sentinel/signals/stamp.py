"""The timestamp and host a log line carries in front of its message, kept as printed.

``sentinel logs classify`` reports where and when a line says it happened, not when we read it. The
common wrappers are recognised at the start of the line only (linear, bounded):

* syslog / ``journalctl`` short: ``Dec  2 10:43:35 worker4 kernel: ...`` → time ``Dec  2 10:43:35``,
  host ``worker4``;
* ISO 8601 (log shippers, ``journalctl -o short-iso``, ``dmesg --time-format iso``):
  ``2025-11-24T03:20:21.001125857Z ...``, optionally followed by a host before ``kernel:``;
* ``dmesg -T``: ``[Sun Feb 23 16:24:36 2025] ...``;
* ``dmesg``: ``[ 5107.644336] ...`` (seconds since boot, kept as ``5107.644336``);
* Python logging / glog-style ``[2024-05-08 08:47:31,261] ...`` and ``2024-05-08 08:47:31,261 ...``.
"""

from __future__ import annotations

import re
from typing import Final

_SYSLOG_RE: Final = re.compile(
    r"^(?P<time>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,9})?) (?P<host>[A-Za-z0-9][\w.-]{0,62})"
    r"(?= kernel:| [\w.@/-]{1,40}\[\d{1,10}\]:)"
)
_ISO_RE: Final = re.compile(
    r"^\[?(?P<time>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)\]?"
    r"(?: (?P<host>[A-Za-z0-9][\w.-]{0,62})(?= kernel:| [\w.@/-]{1,40}\[\d{1,10}\]:))?"
)
_DMESG_T_RE: Final = re.compile(r"^\[(?P<time>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]?\d \d\d:\d\d:\d\d \d{4})\]")
_DMESG_RE: Final = re.compile(r"^\[\s{0,12}(?P<time>\d{1,10}\.\d{1,9})\]")


def line_stamp(line: str) -> tuple[str | None, str | None]:
    """``(time, host)`` printed at the start of ``line``; ``None`` for what it does not carry."""
    head = line[:200].lstrip()
    if not head:
        return None, None
    first = head[0]
    if first.isdigit() or first == "[":
        iso = _ISO_RE.match(head)
        if iso is not None:
            return iso.group("time"), iso.group("host")
        if first == "[":
            dmesg_t = _DMESG_T_RE.match(head)
            if dmesg_t is not None:
                return dmesg_t.group("time"), None
            dmesg = _DMESG_RE.match(head)
            if dmesg is not None:
                return dmesg.group("time"), None
        return None, None
    syslog = _SYSLOG_RE.match(head)
    if syslog is not None:
        return syslog.group("time"), syslog.group("host")
    return None, None
