"""Bridge to the signals package's log classifier, and the agent's Event for a classified line.

``sentinel.signals.classify.classify_line(line) -> Classified | None`` is written by the signals area; until it
exists (or if it fails on a line) the agent still recognises NVRM Xid lines itself, so Xid detection from
the kernel log never depends on it. The contract fields (kind, severity, xid, pci_bus, rank, seq, op,
timeout_ms) are read by name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sentinel.components.xid.parse import parse_xid
from sentinel.log import get_logger

log = get_logger(module="agent.classify")

#: the contract fields, then the extras the aggregator can use (reason, action, the logging pid, ...)
FIELDS = (
    "kind",
    "severity",
    "xid",
    "pci_bus",
    "rank",
    "seq",
    "op",
    "timeout_ms",
    "reason",
    "action",
    "pid",
    "cuda_dev",
    "local_rank",
    "peer",
    "ran_for_ms",
)
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Classification:
    kind: str
    severity: str
    fields: dict[str, str | int | float | bool | None]


def _load() -> Callable[[str], Any] | None:
    try:
        module = importlib.import_module("sentinel.signals.classify")
    except ImportError:
        return None
    fn = getattr(module, "classify_line", None)
    return fn if callable(fn) else None


class LineClassifier:
    """Classifies one log line; never raises."""

    def __init__(self) -> None:
        self._classify = _load()
        self.failures = 0

    @property
    def has_signals(self) -> bool:
        return self._classify is not None

    def __call__(self, line: str) -> Classification | None:
        result: Any = None
        if self._classify is not None:
            try:
                result = self._classify(line)
            except Exception as exc:  # a classifier bug must not stop the agent
                self.failures += 1
                if self.failures <= 5:
                    log.warning("classify_failed", error=f"{type(exc).__name__}: {exc}", line=line[:200])
                result = None
        if result is not None:
            fields: dict[str, str | int | float | bool | None] = {}
            for name in FIELDS:
                value = result.get(name) if isinstance(result, dict) else getattr(result, name, None)
                if value is None or isinstance(value, str | int | float | bool):
                    fields[name] = value
            kind = str(fields.get("kind") or "other")
            severity = str(fields.get("severity") or "info")
            if severity not in SEVERITIES:
                severity = "info"
            return Classification(kind=kind, severity=severity, fields=fields)
        xid = parse_xid(line)
        if xid is not None:
            return Classification(
                kind="xid",
                severity=xid.severity,
                fields={"kind": "xid", "severity": xid.severity, "xid": xid.xid, "pci_bus": xid.pci_bus},
            )
        return None
