"""Prometheus rules as typed data: an alert, a recording rule, and the YAML text they render to.

The code that owns a fact owns its alert: a component's ``<name>/alerts.py`` (``alerts(settings) ->
list[AlertRule]``) reads its thresholds from the settings its verdict rule reads, and its severity and
action from :mod:`sentinel.components.vocab`; ``sentinel rules build`` (:mod:`sentinel.ops.rules`) renders
every owner's rules into ``rules/sentinel.rules.yml``. The renderer needs no YAML library: each string is
written in the one style that reads back as exactly that string (plain, folded, literal or quoted).
"""

from __future__ import annotations

import re
import textwrap
from typing import Annotated, Final, Literal, get_args

import msgspec

from sentinel.components.vocab import Action, Severity

#: The rule groups of the rule file, in file order.
Group = Literal[
    "sentinel-recording",
    "sentinel-fleet",
    "sentinel-gpu",
    "sentinel-network",
    "sentinel-jobs",
    "sentinel-self",
    "sentinel-remediation",
]
GROUPS: Final[tuple[Group, ...]] = get_args(Group)

#: Where each alert's runbook lives, relative to the repository (rewritten at deploy time: docs/deploy.md).
RUNBOOKS_DIR: Final = "docs/runbooks"

AlertName = Annotated[str, msgspec.Meta(pattern=r"^Sentinel[A-Z][A-Za-z0-9]*$")]
RecordName = Annotated[str, msgspec.Meta(pattern=r"^[a-z_]+:[a-z0-9_]+:[a-z0-9_]+$")]
Seconds = Annotated[int, msgspec.Meta(ge=0)]


def reasons_taken(rules: list[AlertRule]) -> str:
    """The regex of every reason that ``rules`` page for in place of the GPU alerts (never empty)."""
    taken = sorted({rule.takes_reasons for rule in rules if rule.takes_reasons})
    return "|".join(taken) or "$^"


def runbook_path(alert: str) -> str:
    """The runbook of ``alert``: ``docs/runbooks/<alert>.md``."""
    return f"{RUNBOOKS_DIR}/{alert}.md"


def duration(seconds: int) -> str:
    """Prometheus' spelling of a whole number of seconds: ``30s``, ``10m``, ``1h``, ``0s``."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def spoken(seconds: int) -> str:
    """The same duration in words, for descriptions: ``10 minutes``, ``1 hour``, ``30 seconds``."""
    for unit, size in (("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds % size == 0 and (seconds or size == 1):
            count = seconds // size
            return f"{count} {unit}{'' if count == 1 else 's'}"
    raise AssertionError("unreachable: every whole number of seconds is a count of seconds")


class AlertRule(msgspec.Struct, frozen=True, kw_only=True):
    """One Prometheus alerting rule; its runbook is ``docs/runbooks/<alert>.md``."""

    alert: AlertName
    group: Group
    expr: str
    #: seconds the expression must hold before the alert fires (Prometheus ``for:``)
    for_s: Seconds
    severity: Severity
    #: the first remedy, as Alertmanager routes see it (no label when None)
    action: Action | None = None
    summary: str
    description: str
    #: why the expression is what it is, written above it in the rule file
    comment: str = ""
    #: the verdict reasons (a PromQL regex) this alert pages for in place of the GPU faulty and degraded
    #: alerts, which leave them out (a port's, a link's, a switch's, a domain's verdict); not rendered
    takes_reasons: str = ""

    @property
    def runbook_url(self) -> str:
        return runbook_path(self.alert)

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = {"severity": self.severity}
        if self.action is not None:
            labels["action"] = self.action
        return labels

    @property
    def annotations(self) -> dict[str, str]:
        return {"summary": self.summary, "description": self.description, "runbook_url": self.runbook_url}


class RecordingRule(msgspec.Struct, frozen=True, kw_only=True):
    """One Prometheus recording rule (``level:metric:operations``)."""

    record: RecordName
    group: Group
    expr: str
    comment: str = ""


Rule = AlertRule | RecordingRule

WIDTH: Final = 120
_NOT_A_STRING: Final = re.compile(
    r"^(?:[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|0x[0-9a-fA-F]+|0o[0-7]+|"
    r"true|false|yes|no|on|off|null|~|\.inf|\.nan)$",
    re.IGNORECASE,
)


def _plain_ok(text: str) -> bool:
    # Starting with a letter, underscore or slash rules out what YAML 1.1 reads as a number, a date, a
    # sexagesimal, a merge key or a value indicator.
    return (
        bool(text)
        and text == text.strip()
        and (text[0].isalpha() or text[0] in "_/")
        and ": " not in text
        and " #" not in text
        and not text.endswith(":")
        and not any(ch in text for ch in "\t\n\r")
        and text.isprintable()
        and _NOT_A_STRING.match(text) is None
    )


def _foldable(text: str) -> bool:
    # Folding turns each line break back into one space: exact when words are separated by single spaces
    # and no line would start with a space (a "more indented" line keeps its break).
    return (
        bool(text)
        and text == text.strip()
        and "  " not in text
        and not any(ch in text for ch in "\t\n\r")
        and text.isprintable()
    )


_GLUE: Final = "\x00"


def _glue_braces(text: str) -> str:
    """``text`` with the spaces inside braces (a template's ``{{ ... }}``, a selector's ``{...}``) made
    unbreakable, so a folded line never ends inside one."""
    out: list[str] = []
    depth = 0
    for ch in text:
        depth += (ch == "{") - (ch == "}")
        out.append(_GLUE if ch == " " and depth > 0 else ch)
    return "".join(out)


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar: printable characters as they are, the rest as YAML escapes."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(
                f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )
    out.append('"')
    return "".join(out)


def scalar(key: str, text: str, indent: int) -> list[str]:
    """``key: text`` as YAML lines at ``indent``, in a style that reads back as exactly ``text``."""
    pad = " " * indent
    head = f"{pad}{key}:"
    if "\n" in text:
        lines = text.split("\n")
        if (
            lines[0]
            and lines[-1]  # a literal block (strip chomping) would lose a trailing line break
            and not lines[0][0].isspace()
            and all(line == line.rstrip() and line.isprintable() for line in lines)
        ):
            return [f"{head} |-", *(f"{pad}  {line}" if line else "" for line in lines)]
    elif len(head) + 1 + len(text) <= WIDTH:
        return [f"{head} {text if _plain_ok(text) else _quoted(text)}"]
    elif _foldable(text):
        glued = _glue_braces(text)
        body = textwrap.wrap(glued, width=WIDTH - indent - 2, break_long_words=False, break_on_hyphens=False)
        return [f"{head} >-", *(f"{pad}  {line.replace(_GLUE, ' ')}" for line in body)]
    return [f"{head} {_quoted(text)}"]


def _comment(text: str, indent: int) -> list[str]:
    return [f"{' ' * indent}# {line}".rstrip() for line in text.splitlines()] if text else []


def render_rule(rule: Rule, indent: int) -> list[str]:
    """One rule as YAML lines: a list item at ``indent``."""
    pad = " " * indent
    inner = indent + 2
    if isinstance(rule, RecordingRule):
        return [
            f"{pad}- record: {rule.record}",
            *_comment(rule.comment, inner),
            *scalar("expr", rule.expr, inner),
        ]
    lines = [f"{pad}- alert: {rule.alert}", *_comment(rule.comment, inner)]
    lines += scalar("expr", rule.expr, inner)
    lines.append(f"{' ' * inner}for: {duration(rule.for_s)}")
    lines.append(f"{' ' * inner}labels:")
    for key, value in rule.labels.items():
        lines += scalar(key, value, inner + 2)
    lines.append(f"{' ' * inner}annotations:")
    for key, value in rule.annotations.items():
        lines += scalar(key, value, inner + 2)
    return lines


def render_groups(groups: dict[Group, list[Rule]], comments: dict[Group, str], header: str) -> str:
    """The rule file: ``header`` as comments, then each non-empty group in :data:`GROUPS` order."""
    lines = [*_comment(header, 0), "", "groups:"]
    first = True
    for name in GROUPS:
        rules = groups.get(name) or []
        if not rules:
            continue
        if not first:
            lines.append("")
        first = False
        lines += _comment(comments.get(name, ""), 2)
        lines += [f"  - name: {name}", "    rules:"]
        for index, rule in enumerate(rules):
            if index and isinstance(rule, AlertRule):
                lines.append("")
            lines += render_rule(rule, 6)
    return "\n".join(lines) + "\n"
