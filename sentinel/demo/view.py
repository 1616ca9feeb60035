"""The live terminal view of ``sentinel demo``: plain ANSI escape codes, redrawn in place once a second.

Layout, top to bottom: a title line (scenario, size, clock, status-page URL), the jobs and their state, GPU
counts by state, the hosts x GPUs grid coloured by state (one cell per GPU; one cell per host, its worst GPU,
when the full grid does not fit the terminal), the injected faults with the verdict that caught each and the
delay, then the verdicts newest first with their action and evidence. Every line is clipped to the terminal
width, and the whole frame to its height (verdicts give way first).

:func:`render_frame` is pure (a :class:`~sentinel.demo.model.ViewModel` and a terminal size in, lines out),
so tests check it without a terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sentinel.demo.model import CELL_STATES, ViewModel
from sentinel.demo.outcome import Verdict, detection_bound_s
from sentinel.demo.summary import format_delay

RESET = "\x1b[0m"
HOME = "\x1b[H"
CLEAR_LINE = "\x1b[K"
CLEAR_BELOW = "\x1b[J"
HIDE_CURSOR = "\x1b[?25l"
SHOW_CURSOR = "\x1b[?25h"

#: SGR parameters per cell state, and the letter used without colour.
STATE_STYLE: dict[str, str] = {
    "ok": "32",
    "straggler": "36;1",
    "degraded": "33;1",
    "stuck": "35;1",
    "faulty": "31;1",
    "silent": "37;41",
    "unknown": "90",
}
STATE_LETTER: dict[str, str] = {
    "ok": ".",
    "straggler": "s",
    "degraded": "D",
    "stuck": "S",
    "faulty": "F",
    "silent": "X",
    "unknown": "?",
}
JOB_STYLE: dict[str, str] = {"running": "32", "stalled": "35;1", "degraded": "33;1"}
VERDICT_STYLE: dict[str, str] = {
    "faulty": STATE_STYLE["faulty"],
    "stuck": STATE_STYLE["stuck"],
    "host_silent": "31",
    "degraded": STATE_STYLE["degraded"],
    "straggler": STATE_STYLE["straggler"],
}
CELL = "■"


@dataclass(frozen=True)
class Seg:
    text: str
    style: str = ""


Line = list[Seg]


def _visible_len(line: Line) -> int:
    return sum(len(seg.text) for seg in line)


def paint(line: Line, width: int, color: bool) -> str:
    """Join segments, clipped to ``width`` visible characters; SGR codes only when ``color``."""
    out: list[str] = []
    left = width
    runs: list[tuple[str, str]] = []  # (style, text), consecutive segments of one style merged
    for seg in line:
        if left <= 0:
            break
        text = seg.text[:left]
        left -= len(text)
        style = seg.style if color else ""
        if runs and runs[-1][0] == style:
            runs[-1] = (style, runs[-1][1] + text)
        else:
            runs.append((style, text))
    for style, text in runs:
        out.append(f"\x1b[{style}m{text}{RESET}" if style and text else text)
    return "".join(out)


def _title(vm: ViewModel) -> Line:
    info, snap = vm.info, vm.snap
    clock = f"t+{snap.t_s:5.1f}s / {info.duration_s:.0f}s"
    line = [
        Seg("sentinel demo", "1"),
        Seg(f"  {info.scenario} · {len(info.hosts)} hosts x {info.gpus_per_host} GPUs · {clock}"),
        Seg(f" · status page {info.url}"),
    ]
    if not snap.reachable:
        line.append(Seg("  aggregator not answering", "31;1"))
    return line


def _jobs(vm: ViewModel) -> list[Line]:
    if not vm.snap.jobs:
        return [[Seg("jobs     "), Seg("(none reported yet)", "90")]]
    lines: list[Line] = []
    for job in vm.snap.jobs:
        size = []
        if job.ranks is not None:
            size.append(f"{job.ranks} ranks")
        if job.hosts is not None:
            size.append(f"on {job.hosts} host{'s' if job.hosts != 1 else ''}")
        lines.append(
            [
                Seg("job      "),
                Seg(f"{job.id:<16} ", "1"),
                Seg(
                    f"{job.state.upper() if job.state != 'running' else job.state:<9}",
                    JOB_STYLE.get(job.state, ""),
                ),
                Seg(" " + " ".join(size)),
            ]
        )
    return lines


def _counts(vm: ViewModel) -> Line:
    counts = vm.counts()
    line: Line = [Seg("GPUs     ")]
    first = True
    for state in CELL_STATES:
        if counts[state] == 0:
            continue
        if not first:
            line.append(Seg(" · "))
        first = False
        line.append(Seg(f"{counts[state]} {state}", STATE_STYLE[state] if state != "ok" else ""))
    return line


def _cell(state: str, color: bool) -> Seg:
    if color:
        return Seg(CELL, STATE_STYLE[state])
    return Seg(STATE_LETTER[state])


def _host_worst(vm: ViewModel, host: str) -> str:
    order = {state: i for i, state in enumerate(CELL_STATES)}
    states = [vm.cells[(host, g)] for g in range(vm.info.gpus_per_host)]
    return min(states, key=lambda s: order[s]) if states else "unknown"


def grid(vm: ViewModel, width: int, max_rows: int, color: bool) -> list[Line]:
    """The hosts x GPUs grid in at most ``max_rows`` lines (per host when per GPU does not fit)."""
    hosts = list(vm.info.hosts)
    if not hosts or max_rows <= 0:
        return []
    label = max(len(h) for h in hosts)
    block = label + 1 + vm.info.gpus_per_host + 2
    per_row = max(1, width // block)
    rows = -(-len(hosts) // per_row)
    if rows <= max_rows:
        lines: list[Line] = []
        for r in range(rows):
            line: Line = []
            for host in hosts[r * per_row : (r + 1) * per_row]:
                line.append(Seg(f"{host:<{label}} ", "90"))
                line.extend(_cell(vm.cells[(host, g)], color) for g in range(vm.info.gpus_per_host))
                line.append(Seg("  "))
            lines.append(line)
        return lines
    # One cell per host (its worst GPU): the fleet-sized fallback.
    per_row = max(1, width - 2)
    header: Line = [Seg(f"one cell per host (worst GPU), {hosts[0]} … {hosts[-1]}", "90")]
    lines = [header]
    for r in range(-(-len(hosts) // per_row)):
        if len(lines) >= max_rows:
            lines[-1] = [Seg("… (terminal too small for every host)", "90")]
            break
        chunk = hosts[r * per_row : (r + 1) * per_row]
        lines.append([_cell(_host_worst(vm, h), color) for h in chunk])
    return lines


def _legend(color: bool) -> Line:
    line: Line = [Seg("legend   ")]
    for state in ("ok", "straggler", "degraded", "stuck", "faulty", "silent", "unknown"):
        line.append(_cell(state, color))
        line.append(Seg(f" {state if state != 'unknown' else 'not seen yet'}  "))
    return line


def _faults(vm: ViewModel) -> list[Line]:
    lines: list[Line] = [[Seg("injected faults", "1")]]
    catches = {c.fault.index: c for c in vm.outcome.catches}
    for fault in vm.info.faults:
        head = [Seg(f"  t+{fault.at_s:<5.0f} {fault.where():<16} {fault.describe():<26} ")]
        catch = catches.get(fault.index)
        if catch is None:
            head.append(Seg(f"in {fault.at_s - vm.snap.t_s:.0f}s", "90"))
        elif not fault.expects_verdict:
            if catch.flagged_by is None:
                head.append(Seg("no verdict, as expected (not the GPU's fault)", "32"))
            else:
                head.append(Seg(f"flagged {catch.flagged_by.kind} though harmless", "31;1"))
        elif catch.pending:
            head.append(Seg(f"waiting for a verdict… {vm.snap.t_s - fault.at_s:.0f}s", "33"))
        elif catch.verdict is None:
            head.append(Seg(f"MISSED: no verdict within {detection_bound_s(fault.kind):g}s", "31;1"))
        else:
            v = catch.verdict
            head.append(Seg(f"caught after {format_delay(catch.delay_s or 0.0)}: ", "32;1"))
            head.append(Seg(f"{v.kind} {v.reason} → {v.action}", VERDICT_STYLE.get(v.kind, "")))
        lines.append(head)
    for verdict in vm.outcome.wrong:
        lines.append(
            [Seg("  flagged wrongly: ", "31;1"), Seg(f"{verdict.kind} {verdict.reason} on {verdict.where()}")]
        )
    return lines


def verdict_lines(verdict: Verdict, width: int) -> list[Line]:
    """Two lines per verdict: what/where/action, then the evidence."""
    closed = verdict.state != "open"
    lines: list[Line] = [
        [
            Seg(f"  t+{verdict.opened_s:<6.1f} "),
            Seg(f"{verdict.kind.upper():<11}", "90" if closed else VERDICT_STYLE.get(verdict.kind, "")),
            Seg(f" {verdict.where()}  {verdict.reason}  → action: "),
            Seg(verdict.action, "1"),
            Seg("  (closed)" if closed else "", "90"),
        ]
    ]
    if verdict.evidence:
        lines.append([Seg("             evidence: " + "; ".join(verdict.evidence), "90")])
    return lines


def render_frame(vm: ViewModel, width: int, height: int, color: bool) -> list[str]:
    """The whole screen as lines (no trailing newlines), at most ``height`` of them, each ``width`` wide."""
    width = max(20, width)
    height = max(5, height)
    top: list[Line] = [_title(vm), *_jobs(vm), _counts(vm)]
    bottom_faults = _faults(vm)
    legend = _legend(color)
    # The grid gets what the faults and a few verdict lines leave over; verdicts take the rest.
    reserve = len(top) + 2 + len(bottom_faults) + 1 + 4
    grid_lines = grid(vm, width, max(1, height - reserve), color)
    lines: list[Line] = [
        *top,
        [],
        *grid_lines,
        legend,
        [],
        *bottom_faults,
        [Seg("verdicts (newest first)", "1")],
    ]
    verdicts = sorted(vm.snap.verdicts, key=lambda v: v.opened_s, reverse=True)
    if not verdicts:
        lines.append([Seg("  none yet", "90")])
    for verdict in verdicts:
        block = verdict_lines(verdict, width)
        if len(lines) + len(block) > height:
            break
        lines.extend(block)
    return [paint(line, width, color) for line in lines[:height]]


def frame_text(lines: Sequence[str]) -> str:
    """Escape sequence that redraws the screen in place with ``lines`` (no scrolling, no flicker)."""
    return HOME + "".join(f"{line}{CLEAR_LINE}\n" for line in lines) + CLEAR_BELOW
