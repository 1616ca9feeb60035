"""mlx5 health lines judged by what they mean for the HCA and its ports: the one decision site for the log
classifier (a line's severity and reason) and the aggregator's host verdicts (:func:`hca_finding`).

A dead HCA (its health poll reached the miss count, an unrecoverable hardware error) and a firmware fatal
error or assert take every port on it away: faulty, drain. A firmware command that timed out
(``ENABLE_HCA(0x104) timeout``) leaves the HCA unreliable but possibly passing traffic: degraded, drain.
A transceiver event (high module temperature, a cable error) concerns one port, whose own record carries
it as evidence: a warning, no host verdict.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Final

import msgspec

from sentinel.components.vocab import Action, Finding, GpuHealth, Severity, verdict_kind


class HcaCondition(msgspec.Struct, frozen=True, kw_only=True):
    """One kind of mlx5 health line: how the line is classified and what the host's verdict is."""

    reason: str
    severity: Severity
    #: the host verdict's health (``ok``: none; the line is port evidence or only logged)
    health: GpuHealth
    action: Action
    meaning: str


DEAD: Final = HcaCondition(
    reason="ib_hca_failure",
    severity="critical",
    health="faulty",
    action="drain",
    meaning="the HCA stopped answering its health poll or reported an unrecoverable hardware error: every "
    "port on it is gone; drain, then reboot or replace it",
)
FW_FATAL: Final = HcaCondition(
    reason="ib_hca_fw_fatal",
    severity="critical",
    health="faulty",
    action="drain",
    meaning="the HCA's firmware hit a fatal error or assert: its ports stop until the driver's health "
    "recovery resets it; drain until it is checked",
)
CMD_TIMEOUT: Final = HcaCondition(
    reason="ib_hca_cmd_timeout",
    severity="critical",
    health="suspect",
    action="drain",
    meaning="a firmware command never completed (the driver leaks its command slot): the HCA may still pass "
    "traffic but is not reliable; degraded, drain until it is reset",
)
MODULE: Final = HcaCondition(
    reason="ib_port_hardware",
    severity="warning",
    health="ok",
    action="none",
    meaning="a transceiver event (high module temperature, cable error): the port's record carries it",
)
#: every condition, in the order a line is tested (the HCA's own failures before a port's module event)
CONDITIONS: Final = (DEAD, FW_FATAL, CMD_TIMEOUT, MODULE)
BY_REASON: Final[dict[str, HcaCondition]] = {c.reason: c for c in CONDITIONS}

_PATTERNS: Final[tuple[tuple[re.Pattern[str], HcaCondition], ...]] = (
    (re.compile(r"health compromised|reached miss count|unrecoverable hardware error", re.IGNORECASE), DEAD),
    (
        re.compile(
            r"\bfirmware (?:fatal|assert)|\bFW (?:fatal|assert|syndrome)|fw_fatal|\bassert_var\b",
            re.IGNORECASE,
        ),
        FW_FATAL,
    ),
    (
        re.compile(
            r"\b[A-Z][A-Z0-9_]{2,40}\(0x[0-9A-Fa-f]{1,6}\)(?: op_mod\(0x[0-9A-Fa-f]{1,4}\))? timeout\b",
            re.IGNORECASE,
        ),
        CMD_TIMEOUT,
    ),
    (re.compile(r"Cable error|High Temperature|module event\[error\]|Port module event.{0,40}error"), MODULE),
)


def hca_condition(text: str) -> HcaCondition | None:
    """The condition an mlx5 line reports; ``None`` for any other line."""
    for pattern, condition in _PATTERNS:
        if pattern.search(text) is not None:
            return condition
    return None


#: lines kept per condition as a verdict's evidence
MAX_LINES: Final = 4


@dataclass(slots=True)
class HcaMemory:
    """A host's HCA health lines since its boot: per condition, when it was first seen and its latest
    lines (bounded)."""

    first: dict[str, float] = field(default_factory=dict)
    lines: dict[str, deque[str]] = field(default_factory=dict)

    def note(self, reason: str, text: str, t: float) -> None:
        """One classified mlx5 line; only the conditions that make a host verdict are kept."""
        condition = BY_REASON.get(reason)
        if condition is None or condition.health == "ok":
            return
        self.first.setdefault(reason, t)
        self.lines.setdefault(reason, deque(maxlen=MAX_LINES)).append(" ".join(text.split())[:300])


def judge_hcas(memory: HcaMemory) -> list[tuple[Finding, float]]:
    """(finding, first seen) for each HCA condition the host's lines reported."""
    out: list[tuple[Finding, float]] = []
    for reason, t in memory.first.items():
        finding = hca_finding(reason, list(memory.lines.get(reason, ())))
        if finding is not None:
            out.append((finding, t))
    return out


def hca_finding(reason: str, lines: list[str]) -> Finding | None:
    """The host's finding for the HCA lines of one condition (by the classified line's ``reason``), the
    latest lines as evidence; ``None`` for a reason that makes no host verdict."""
    condition = BY_REASON.get(reason)
    if condition is None or condition.health == "ok" or not lines:
        return None
    return Finding(
        state=condition.health,
        severity=condition.severity,
        action=condition.action,
        reason=condition.reason,
        evidence=(condition.meaning, *(f"kernel: {line}" for line in lines)),
    )


def markdown_table() -> str:
    """The mlx5 table as docs/network.md shows it."""
    rows = ["| reason | line severity | host verdict | action | meaning |", "|---|---|---|---|---|"]
    for c in CONDITIONS:
        verdict = "none (port evidence)" if c.health == "ok" else verdict_kind(c.health)
        rows.append(f"| `{c.reason}` | {c.severity} | {verdict} | `{c.action}` | {c.meaning} |")
    return "\n".join(rows) + "\n"
