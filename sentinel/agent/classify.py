"""The agent's side of log classification: one line through :func:`sentinel.signals.classify.classify_line`,
and the typed wire event (:class:`~sentinel.wire.LogLine`) of a classified line.

The classifier is pure code fed by untrusted text; should it fail on a line, the failure is counted and
logged and the agent still recognises NVRM Xid lines itself, so Xid detection from the kernel log never
depends on it. The contract fields (kind, severity, xid, pci_bus, rank, seq, op, timeout_ms) and the
extras the aggregator uses are read by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from sentinel.components.bounds import MAX_SHORT_CHARS
from sentinel.components.vocab import ACTIONS, Severity
from sentinel.components.xid.parse import parse_xid
from sentinel.log import get_logger
from sentinel.signals.classify import classify_line
from sentinel.signals.record import KINDS, Classified, Kind
from sentinel.wire import LogLine

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
    "sxid",
)
SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Classification:
    kind: str
    severity: str
    fields: dict[str, str | int | float | bool | None]


class LineClassifier:
    """Classifies one log line; never raises."""

    def __init__(self) -> None:
        self.failures = 0

    def __call__(self, line: str) -> Classification | None:
        result: Classified | None = None
        try:
            result = classify_line(line)
        except Exception as exc:  # a classifier bug must not stop the agent
            self.failures += 1
            if self.failures <= 5:
                log.warning("classify_failed", error=f"{type(exc).__name__}: {exc}", line=line[:200])
            result = None
        if result is not None:
            fields: dict[str, str | int | float | bool | None] = {}
            for name in FIELDS:
                value = getattr(result, name, None)
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


FieldValue = str | int | float | bool | None
_INT_FIELDS = ("xid", "rank", "local_rank", "seq", "timeout_ms", "pid", "cuda_dev", "ran_for_ms", "sxid")
_STR_FIELDS = ("reason", "pci_bus", "op", "peer")


def log_line(
    fields: dict[str, FieldValue],
    *,
    line_kind: str,
    t: float,
    source: str,
    gpu: int | None,
    severity: Severity,
    text: str,
) -> LogLine:
    """The wire event of one classified line: each contract field typed, anything ill-typed dropped.

    The classifier is code from another area fed by untrusted text: an int field that is not an int (or a
    bool posing as one), or a string beyond the wire's bound, is left out rather than making the aggregator
    refuse the whole batch.
    """
    action = fields.get("action")
    kind: Kind = line_kind if line_kind in KINDS else "other"
    line = LogLine(
        t=t,
        source=source,
        gpu=gpu,
        severity=severity,
        text=text,
        line_kind=kind,
        action=action if action in ACTIONS else None,
    )
    typed: dict[str, int | str | None] = {name: _int(fields.get(name)) for name in _INT_FIELDS}
    typed |= {name: _str(fields.get(name)) for name in _STR_FIELDS}
    return msgspec.structs.replace(line, **typed)


def _int(value: FieldValue) -> int | None:
    return (
        value
        if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
        else None
    )


def _str(value: FieldValue) -> str | None:
    return value[:MAX_SHORT_CHARS] if isinstance(value, str) else None
