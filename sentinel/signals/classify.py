"""One entry point from log text to contract records (docs/contracts.md §2).

* :func:`classify_line` — one physical log line, as the agent's tailer sees it; ``None`` for plain noise
  (NCCL INFO chatter, lines without any signal).
* :func:`classify_text` — one record (a line or a short multi-line block: hard-wrapped messages,
  ``nvidia-smi -q`` excerpts, torchrun "Root Cause" blocks); always returns the most severe event.
* :func:`text_events` — every event in a record, for callers that want more than the worst one.

Fast streaming over big inputs lives in :mod:`sentinel.signals.scan`, which finds candidate lines at C
speed and then calls :func:`classify_line` / :func:`classify_text` on them only.
"""

from __future__ import annotations

import itertools
import re
from typing import Final

from sentinel.components.ecc import rule as ecc_rule
from sentinel.components.ecc.parse import parse_ecc, parse_retired_pages
from sentinel.components.ecc.rule import evaluate_ecc, evaluate_retired_pages
from sentinel.components.nvsmi import read_sections
from sentinel.components.rowremap import rule as row_remap_rule
from sentinel.components.rowremap.parse import parse_row_remap
from sentinel.components.rowremap.rule import evaluate_row_remap
from sentinel.components.vocab import Finding
from sentinel.components.xid.parse import parse_xid
from sentinel.signals.gate import line_has_signal_words
from sentinel.signals.kernel import kernel_events
from sentinel.signals.nccl_log import chatter_event, global_rank, nccl_events, torch_events, torch_rank
from sentinel.signals.ocr import repair
from sentinel.signals.record import (
    KIND_RANK,
    Classified,
    Kind,
    finding_event,
    make_event,
    most_severe,
    severity_key,
)
from sentinel.signals.rules import rule_events
from sentinel.text import bounded

#: An NCCL INFO line (``host:pid:tid [dev] NCCL INFO``, NCCL <= 2.4 without ``NCCL``, behind at most three
#: wrapper tokens such as a pdsh host or a shipper timestamp) whose payload is not an init, version or
#: error-trace line: plain chatter. The scanner uses the same expression on bytes (ASCII semantics), so
#: the fast path and :func:`classify_line` agree on what is noise. The plain prefix is tried first and
#: the possessive ``+`` quantifiers never backtrack, so a line costs one linear attempt.
CHATTER_PATTERN: Final = (
    r"\S++ (?:\[\d{1,3}\] |(?:\S++ ){1,3}?\[\d{1,3}\] )(?:NCCL INFO|INFO) "
    r"(?!comm 0x|NCCL version|[\w/.\[\]()-]{1,200}+(?::\d{1,6} -> | comm 0x[0-9A-Fa-f]{1,16} rank \d))"
)
_CHATTER_RE: Final = re.compile(CHATTER_PATTERN, re.ASCII)

_SMI_FIELD_RE: Final = re.compile(
    r"^\s*(?P<name>Remapping Failure Occurred|Pending Page Blacklist|SRAM Threshold Exceeded)\s*: (?P<value>Yes|No|N/A)\s*$"
)
_BLOCK_WORDS: Final = ("Remapped Rows", "ECC Errors", "Retired", "Root Cause")


def is_noise(event: Classified) -> bool:
    """Plain chatter: nothing an operator or the agent acts on (still printed with ``--all``)."""
    return event.severity == "info" and event.kind in ("nccl_info", "other")


def line_events(line: str) -> list[Classified]:
    """Every event in one logical line (no block parsing).

    The format parsers read the fields; :func:`~sentinel.signals.rules.rule_events` applies the labelling
    rules to what they do not recognise. A line with OCR-damaged key words is read once more with them
    repaired (:func:`~sentinel.signals.ocr.repair`); that reading wins only when it finds something more
    severe or more specific, or names what the first reading only guessed from failure words.
    """
    text = bounded(line)
    chatter = _CHATTER_RE.match(text)
    if chatter is not None:
        return [chatter_event(text)]
    events = _parsed_events(_strip_table(text))
    best = most_severe(events)
    if best is None or best.reason != "nccl_info":
        repaired = repair(text)
        if repaired != text:
            again = _parsed_events(_strip_table(repaired))
            fixed = most_severe(again)
            if fixed is not None and (
                best is None
                or severity_key(fixed) > severity_key(best)
                or (best.reason == "failure_words" and fixed.reason != "failure_words")
            ):
                return again
    return events


def _strip_table(text: str) -> str:
    """A diagnostics-tool table row (``| GPU Memory | Fail - GPU 0 ... |``) read as its cells' text."""
    stripped = text.strip()
    if len(stripped) > 2 and stripped[0] == "|" and stripped[-1] == "|":
        return " | ".join(cell.strip() for cell in stripped[1:-1].split("|") if cell.strip())
    return text


def _parsed_events(text: str) -> list[Classified]:
    events: list[Classified] = _field_events(text) if " : " in text else []
    xid = parse_xid(text)
    if xid is not None:
        events.append(
            make_event(
                "xid",
                xid.severity,
                xid=xid.xid,
                pci_bus=xid.pci_bus,
                pid=xid.pid,
                process=xid.process,
                previous_xid=xid.previous_xid,
                gpu_instance=xid.gpu_instance,
                action=xid.action,
                reason=f"xid_{xid.xid}",
                message=xid.message,
            )
        )
    else:
        events.extend(kernel_events(text))
    events.extend(nccl_events(text))
    events.extend(torch_events(text))
    events.extend(rule_events(text, events))
    rank = global_rank(text)
    if rank is not None:
        for index, event in enumerate(events):
            if event.rank is None and event.kind != "xid":
                events[index] = _with_rank(event, rank)
    elif ("[Rank " in text or "[PG " in text) and any(
        event.rank is None and event.kind.startswith("torch_") for event in events
    ):
        # A PyTorch failure the rules read from its words: the rank its own tag names (``[Rank N]``, the
        # default group's ``[PG 0 Rank N]``), as for the lines its parser knows.
        tagged = torch_rank(text)
        if tagged is not None:
            for index, event in enumerate(events):
                if event.rank is None and event.kind.startswith("torch_"):
                    events[index] = _with_rank(event, tagged)
    return events


def _with_rank(event: Classified, rank: int) -> Classified:
    import msgspec

    return msgspec.structs.replace(event, rank=rank)


def text_events(text: str) -> list[Classified]:
    """Every event in one record: a line, a hard-wrapped message or an ``nvidia-smi -q`` excerpt."""
    text = bounded(text)
    lines = [segment for segment in re.split(r"\r\n|\r|\n", text) if segment.strip()]
    if len(lines) <= 1:
        line = lines[0] if lines else text
        return line_events(line)
    events = _block_events(text)
    if events:
        # An ``nvidia-smi -q`` section read field by field; joining its lines would only blur it.
        return events
    if "Root Cause" in text or "exitcode" in text:
        # torchrun's failure summary needs the line structure ("rank : 10" on its own line); its fields
        # say everything, so the joined reading is not tried.
        summary = [event for event in torch_events(text) if event.reason == "torchrun_root_cause"]
        if summary:
            return summary
    events.extend(_joined_events(lines))
    return events


def _reading_key(events: list[Classified]) -> tuple[int, int]:
    """How well a reading of a wrapped message parses: a recognised kind first, then how many fields."""
    best = most_severe(events)
    if best is None:
        return (-1, -1)
    fields = (best.xid, best.pci_bus, best.rank, best.seq, best.op, best.timeout_ms, best.ran_for_ms)
    return (KIND_RANK[best.kind], sum(value is not None for value in fields))


def _joined_events(lines: list[str]) -> list[Classified]:
    """Events of a hard-wrapped message, undoing the wrap the way that reads best.

    A terminal wraps at a fixed column, mid-word, losing nothing: the lines join back with no separator.
    An author (or a mail client) wraps at spaces or after a hyphen: the lines join back with one space, or
    none after the hyphen. Evidence of a terminal wrap (three or more lines of one width of at least 64
    columns, a first line of 100+ columns, a space kept at a line edge, a line ending in a hyphen) picks
    the joined reading when it finds anything; otherwise the reading that finds the more specific, more
    complete event wins, and a tie goes to the author's reading.
    """
    raw = line_events("".join(lines))
    widths = {len(segment) for segment in lines[:-1]}
    fixed_width = (
        len(lines) > 2 and len(widths) == 1 and len(lines[0]) >= 64 and len(lines[-1]) <= len(lines[0])
    )
    kept_edge = any(
        a.endswith(" ") or b.startswith(" ") or (a.endswith("-") and a[-2:-1].isalnum())
        for a, b in itertools.pairwise(lines)
    )
    if raw and (fixed_width or kept_edge or len(lines[0]) >= 100):
        return raw
    spaced = line_events(" ".join(segment.strip() for segment in lines))
    return raw if _reading_key(raw) > _reading_key(spaced) else spaced


def _field_events(line: str) -> list[Classified]:
    """One ``nvidia-smi -q`` field quoted on its own, without its section: the component's rule outcome
    for that field's value."""
    match = _SMI_FIELD_RE.search(line)
    if match is None:
        return []
    name, yes = " ".join(match.group("name").split()).lower(), match.group("value").lower() == "yes"
    if name == "remapping failure occurred":
        return [finding_event("row_remap", row_remap_rule.FAILURE if yes else row_remap_rule.OK)]
    if name == "pending page blacklist":
        return [finding_event("ecc", ecc_rule.RETIRED_PENDING if yes else ecc_rule.RETIRED_OK)]
    return [finding_event("ecc", ecc_rule.SRAM_THRESHOLD if yes else ecc_rule.OK)]


def _block_events(text: str) -> list[Classified]:
    events: list[Classified] = []
    if "ECC Mode" in text and not any(word in text for word in _BLOCK_WORDS):
        mode = [value.lower() for path, value in read_sections(text) if "ecc mode" in path]
        if mode:
            changing = len(set(mode)) > 1
            return [finding_event("ecc", ecc_rule.MODE_CHANGE_PENDING if changing else ecc_rule.MODE)]
    if not any(word in text for word in _BLOCK_WORDS) and "pages" not in text:
        return events
    rows = parse_row_remap(text) if "Remapped" in text else None
    ecc = parse_ecc(text) if "ECC Errors" in text else None
    pages = parse_retired_pages(text) if "etired" in text else None
    findings: tuple[tuple[Kind, Finding | None], ...] = (
        ("row_remap", evaluate_row_remap(rows) if rows is not None else None),
        ("ecc", evaluate_ecc(ecc) if ecc is not None else None),
        ("ecc", evaluate_retired_pages(pages) if pages is not None else None),
    )
    for kind, finding in findings:
        if finding is not None:
            events.append(finding_event(kind, finding, message="; ".join(finding.evidence)))
    return events


def classify_line(line: str) -> Classified | None:
    """Classify one physical log line; ``None`` when it carries no signal (plain noise).

    A line without any of the gate's literals (:mod:`sentinel.signals.gate`) carries no signal by
    definition. Lines glued together by carriage returns (tqdm progress bars) are split and the most
    severe part wins.
    """
    text = line.rstrip("\r\n")
    if not line_has_signal_words(bounded(text)):
        return None
    if "\r" in text:
        events: list[Classified] = []
        for segment in text.split("\r"):
            events.extend(line_events(segment))
    else:
        events = line_events(text)
    best = most_severe(events)
    if best is None or is_noise(best):
        return None
    return best


def classify_text(text: str) -> Classified:
    """Classify one record (line or block): the most severe event, or ``other``/``info`` when none."""
    best = most_severe(text_events(text))
    if best is None:
        return make_event("other", "info", rank=_fallback_rank(text))
    return best


def _fallback_rank(text: str) -> int | None:
    """The rank of a PyTorch line that carries no event (``[rank3]:``, a default-group PG tag, or the
    ``[Rank N]`` that PyTorch's default group and DeepSpeed's ``log_dist`` print)."""
    head = bounded(text)
    if "[rank" in head or "ProcessGroup" in head or "[PG " in head or "[Rank " in head:
        return torch_rank(head)
    return None
