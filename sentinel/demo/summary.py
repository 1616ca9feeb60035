"""The end-of-demo summary: each injected fault, the verdict that caught it and the delay, then anything
missed or flagged wrongly. Pure: an :class:`~sentinel.demo.outcome.Outcome` in, text out.
"""

from __future__ import annotations

from collections.abc import Sequence

from sentinel.demo.outcome import Fault, Outcome, detection_bound_s


def format_delay(seconds: float) -> str:
    """Sub-second delays keep two decimals (hardware verdicts open within one tick)."""
    return f"{seconds:.2f}s" if seconds < 1 else f"{seconds:.1f}s"


def render_summary(
    outcome: Outcome, faults: Sequence[Fault], *, scenario: str, ran_s: float, interrupted: bool
) -> str:
    """Text for the terminal or a log; ``faults`` is the whole scenario (some may not have been injected)."""
    how = "interrupted" if interrupted else "finished"
    lines = [f"sentinel demo {how} after {ran_s:.0f}s (scenario {scenario})", ""]
    if not outcome.catches:
        lines.append("no fault was injected before the demo ended")
    else:
        rows = [("fault", "where", "caught by", "delay")]
        for catch in outcome.catches:
            fault = catch.fault
            what = f"t+{fault.at_s:.0f}s {fault.describe()}"
            if not fault.expects_verdict:
                flag = catch.flagged_by
                by = (
                    "no verdict, as expected"
                    if flag is None
                    else f"FLAGGED {flag.kind} {flag.reason}, expected none"
                )
                rows.append((what, fault.where(), by, "-"))
                continue
            if catch.verdict is None:
                bound = detection_bound_s(fault.kind)
                by = f"no verdict yet (within its {bound:g}s bound)" if catch.pending else "MISSED"
                rows.append((what, fault.where(), by, "-"))
                continue
            v = catch.verdict
            rows.append(
                (
                    what,
                    fault.where(),
                    f"{v.kind} {v.reason} -> {v.action}",
                    format_delay(catch.delay_s or 0.0),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for row in rows:
            lines.append(
                "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
                + "  "
                + row[3]
            )
    injected = {c.fault.index for c in outcome.catches}
    later = [f for f in faults if f.index not in injected]
    if later:
        lines.append("")
        lines.append("not injected (the demo ended first):")
        lines.extend(f"  t+{f.at_s:.0f}s {f.describe()} on {f.where()}" for f in later)
    if outcome.consequences:
        lines.append("")
        lines.append("follow-on verdicts (same GPU or host as a fault, not wrong):")
        for verdict, cause in outcome.consequences:
            lines.append(
                f"  {verdict.kind} {verdict.reason} on {verdict.where()} (after {cause.describe()} on {cause.where()})"
            )
    lines.append("")
    if outcome.wrong:
        lines.append(f"flagged wrongly ({len(outcome.wrong)}):")
        for verdict in outcome.wrong:
            lines.append(f"  t+{verdict.opened_s:.1f}s {verdict.kind} {verdict.reason} on {verdict.where()}")
    else:
        lines.append("flagged wrongly: none")
    missed = outcome.missed
    handled = sum(1 for c in outcome.catches if c.ok and not c.pending)
    line = f"caught {handled} of {len(outcome.catches)} injected faults"
    if missed:
        line += f"; missed: {', '.join(f'{f.describe()} on {f.where()}' for f in missed)}"
    if outcome.pending:
        line += f"; {len(outcome.pending)} still within the detection bound when the demo ended"
    flagged = [c.fault for c in outcome.catches if not c.ok and not c.fault.expects_verdict]
    if flagged:
        line += f"; flagged though harmless: {', '.join(f'{f.describe()} on {f.where()}' for f in flagged)}"
    lines.append(line)
    return "\n".join(lines) + "\n"
