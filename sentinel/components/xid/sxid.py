"""NVSwitch SXids: which are fatal, and what sentinel does about one. The one decision site for the log
classifier (a line's severity and action) and the aggregator's switch verdicts (:func:`switch_finding`).

Fatal or not: the line's own word first, then the severity number of the driver's continuation line, then
NVIDIA's list of non-fatal SXids (Fabric Manager user guide, "Non-Fatal NVSwitch SXid Errors" and the
notable ones it says can be ignored); an SXid nobody calls non-fatal is taken as fatal. NVIDIA: a fatal
SXid stops the NVLink traffic through that switch (the GPUs behind it lose their NVLink peers, their jobs
see Xid 74 or 45) and needs the switch and its GPUs reset with the fabric manager restarted; a non-fatal
one is corrected or retried by the hardware, logged, and work goes on.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from sentinel.components.vocab import Action, Finding, GpuHealth, Severity

#: SXids NVIDIA lists as non-fatal: single-bit ECC errors the switch corrects, TX replays, and the
#: Minion DLREQ interrupt NVIDIA says can be ignored.
NON_FATAL_SXIDS: Final = frozenset(
    {
        11004,
        11012,
        11021,
        11022,
        11023,
        12021,
        12023,
        15008,
        15011,
        19049,
        19055,
        19057,
        19059,
        19062,
        19065,
        19068,
        19071,
        20001,
        22013,
        24001,
        24002,
        24003,
    }
)

#: the line's own word; the first one wins (``Fatal``/``Non-fatal``, any case for the latter)
_WORD_RE: Final = re.compile(r"\b(?:(?P<non>(?i:Non-?fatal))|Fatal)\b")
#: the driver's second line of an SXid: ``Severity 1 Engine instance 60 Sub-engine instance 00`` (the
#: driver's severity enum: 0 non-fatal, 1 fatal)
_SEVERITY_RE: Final = re.compile(r"^\s*Severity (?P<n>\d) Engine instance\b")
#: the driver's data line of an SXid (``Data {0x..., 0x...}``): register words of the event its first
#: line reported, nothing new
_DATA_RE: Final = re.compile(r"^\s*Data \{")


class SwitchAction(msgspec.Struct, frozen=True, kw_only=True):
    """What sentinel does for one class of SXid, and why (the docs' table is rendered from these)."""

    severity: Severity
    #: the host verdict's health (``faulty`` at once, ``suspect`` only when repeated, ``ok`` never)
    health: GpuHealth
    action: Action
    nvidia: str
    why: str = ""


#: fatal / non-fatal / an event's data line -> the line's severity and the host's verdict.
SWITCH_ACTIONS: Final[dict[str, SwitchAction]] = {
    "fatal": SwitchAction(
        severity="critical",
        health="faulty",
        action="reboot",
        nvidia="fatal: the switch's NVLink traffic stopped; stop the GPU work, reset the NVSwitches and the GPUs "
        "(or reboot), restart nvidia-fabricmanager",
        why="sentinel has no switch or baseboard reset: a node reboot resets every GPU and NVSwitch and "
        "restarts the fabric manager; the faulty verdict drains the node first",
    ),
    "non_fatal": SwitchAction(
        severity="warning",
        health="suspect",
        action="none",
        nvidia="non-fatal: corrected or retried by the switch; logged, work goes on",
        why="counted per switch; only a repeating one (detect.fabric.nonfatal_sxids within "
        "detect.fabric.nonfatal_window_s) makes the host degraded, with no action",
    ),
    "data": SwitchAction(
        severity="critical",
        health="ok",
        action="none",
        nvidia="the register words of an SXid reported on the line before",
        why="critical unless NVIDIA lists the code as non-fatal (the line does not say); the event is judged "
        "and counted on its first line, so a data line makes no verdict and asks for nothing",
    ),
}


#: the reason of an event's severity line (``Severity N Engine instance ...``): it can make a switch fatal
#: (when its first line was lost), but the aggregator does not count it as another non-fatal SXid
CONTINUED: Final = "sxid_continued"
#: the reason of an event's data line: no verdict at all
DATA: Final = "sxid_data"


class SXidJudgement(msgspec.Struct, frozen=True, kw_only=True):
    """One SXid line judged: fatal or not (``None``: nobody says), whether it only continues an event, and
    the severity, action and reason the classifier gives the line."""

    fatal: bool | None
    continuation: bool
    severity: Severity
    action: Action
    reason: str


def sxid_fatal(code: int, rest: str) -> bool | None:
    """Whether an SXid line reports a fatal error; ``None`` when neither the line nor NVIDIA's list says."""
    head = rest[:40]
    word = _WORD_RE.search(head)
    if word is not None:
        return word.group("non") is None
    severity = _SEVERITY_RE.match(head)
    if severity is not None:
        return severity.group("n") != "0"
    if code in NON_FATAL_SXIDS:
        return False
    return None


def judge_sxid(code: int, rest: str) -> SXidJudgement:
    """The line's judgement: ``rest`` is the text after the code. An event's severity line continues it
    (``sxid_continued``); its data line only adds register words (``sxid_data``, no action); a line nobody
    calls non-fatal is fatal."""
    fatal = sxid_fatal(code, rest)
    data = _DATA_RE.match(rest) is not None
    continuation = data or _SEVERITY_RE.match(rest[:40]) is not None
    rule = SWITCH_ACTIONS["non_fatal" if fatal is False else "fatal"]
    return SXidJudgement(
        fatal=fatal,
        continuation=continuation,
        severity=rule.severity,
        action="none" if data else rule.action,
        reason=DATA if data else CONTINUED if continuation else f"sxid_{code}",
    )


def switch_finding(sxid: int, switch: str, severity: Severity, count: int, threshold: int) -> Finding | None:
    """The host's finding for an NVSwitch's SXids as the agent classified them: a fatal one (``critical``)
    at once; non-fatal ones (``warning``) only when ``count`` of them reached ``threshold`` in the window."""
    where = f"NVSwitch {switch or '(address not printed)'}"
    if severity == "critical":
        rule = SWITCH_ACTIONS["fatal"]
        what = f"{where}: fatal SXid {sxid}; the host's GPUs lost their NVLink peers through it"
    elif count >= threshold:
        rule = SWITCH_ACTIONS["non_fatal"]
        what = f"{where}: {count} non-fatal SXid {sxid} within the window"
    else:
        return None
    return Finding(
        state=rule.health,
        severity=rule.severity,
        action=rule.action,
        reason=f"sxid_{sxid}",
        evidence=(what, f"NVIDIA: {rule.nvidia}"),
    )


def markdown_table() -> str:
    """The SXid table as docs/signals.md shows it (a test keeps the doc in sync)."""
    lines = [
        "| SXid | NVIDIA says | line severity | host verdict | action | why |",
        "|---|---|---|---|---|---|",
    ]
    verdicts = {"faulty": "faulty", "suspect": "degraded when repeated", "ok": "none"}
    for name, rule in SWITCH_ACTIONS.items():
        lines.append(
            f"| {name.replace('_', '-')} | {rule.nvidia} | {rule.severity} | {verdicts[rule.health]} | "
            f"`{rule.action}` | {rule.why} |"
        )
    return "\n".join(lines) + "\n"
