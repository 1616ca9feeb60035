"""Time to verdict and false verdicts per fault and severity (the scenarios of tests/sim/scenarios).

    .venv/bin/python bench/fault_table.py [SCENARIO.toml ...]

Prints a Markdown table: scenario, fault, severity, time from the fault to the first verdict naming it (with
its bound), and the verdicts of that run that no injected fault explains. Simulated time: the figures do not
depend on the machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sentinel.log import setup_logging
from tests.sim.faulttable import judge

DEFAULT = sorted((Path(__file__).resolve().parent.parent / "tests" / "sim" / "scenarios").glob("*.toml"))


def main(argv: list[str]) -> int:
    setup_logging("sim", "warning", stream=sys.stderr)  # each simulated host runs a real agent: keep it quiet
    paths = [Path(a) for a in argv] or DEFAULT
    print("| scenario | fault | severity | time to verdict | false verdicts |")
    print("|---|---|---|---|---|")
    for path in paths:
        for row in judge(path):
            if row.fault.startswith("none"):
                found = "-"
            elif row.delay_s is None:
                found = "never"
            else:
                found = f"{row.delay_s:.0f} s (bound {row.bound_s:.0f} s)"
            print(f"| {row.scenario} | {row.fault} | {row.severity} | {found} | {row.false_verdicts} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
