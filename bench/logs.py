"""Throughput of the log classifier's raw-mode fast path against ``grep -cE`` on the same file.

Builds a large synthetic training log (NCCL INFO chatter with rare NCCL WARN, Xid and watchdog lines, all
taken from ../shared/corpus/logs/real_lines.jsonl and varied), then in the same run:

* classifies it with :class:`sentinel.signals.LogScanner` (the code ``sentinel logs classify`` runs), once
  with each gate engine (Hyperscan, and the pure-Python fallback),
* runs the real CLI on it (output to /dev/null),
* runs ``grep -ciE '<pattern>'`` on it, where the pattern is every literal of the gate
  (:data:`sentinel.signals.gate.GATE_LITERALS`, regex-escaped, joined by ``|``; ``-i`` because the gate
  folds ASCII case): grep then does the same search the scanner's gate does — find every line that
  holds one of those words — and counts those lines. The scanner does more on top: it counts every
  line (event line numbers) and classifies each candidate line in Python.
* for reference only, runs ``grep -cE`` with the narrow 12-word case-sensitive pattern earlier rounds
  compared against (fewer words than the classifier needs: not the same work).

and prints lines/s and MB/s for each and the ratio to the same-work grep. Goal: the scanner at least as
fast as that grep. All contenders run interleaved, best of ``--repeat``, in the same run.

    .venv/bin/python bench/logs.py            # ~300 MB
    .venv/bin/python bench/logs.py --mb 50
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sentinel.signals.classify import classify_line  # noqa: E402
from sentinel.signals.gate import GATE_LITERALS, Gate, load_gate  # noqa: E402
from sentinel.signals.scan import CHUNK_SIZE, LogScanner  # noqa: E402

CORPUS = REPO / "tests" / "data" / "corpus" / "logs" / "real_lines.jsonl"
NARROW_KEYWORDS = (
    "NCCL WARN|NVRM|Xid|Watchdog caught|ProcessGroupNCCL|Init COMPLETE|Init START|Abort COMPLETE|"
    "NCCL version|DistBackendError|NCCL error|exitcode"
)
#: The gate's search as a grep pattern: the same literals, case folded by ``-i``.
GATE_PATTERN = "|".join(re.escape(literal.decode()) for literal in GATE_LITERALS)
EVENT_KINDS = ("xid", "nccl_warn_net", "nccl_warn_cuda", "nccl_warn_other", "torch_watchdog_timeout")


def _corpus() -> tuple[list[str], list[str]]:
    chatter, events = [], []
    for raw in CORPUS.read_text(encoding="utf-8").splitlines():
        record = json.loads(raw)
        text, expect = record["text"], record["expect"]
        if "\n" in text or "\r" in text:
            continue
        is_chatter = expect["kind"] == "nccl_info" and expect["severity"] == "info" and " INFO " in text
        if is_chatter and classify_line(text) is None:
            chatter.append(text)
        elif expect["kind"] in EVENT_KINDS and classify_line(text) is not None:
            events.append(text)
    return chatter, events


def _vary(line: str, rng: random.Random) -> str:
    """Change host/pid/tid/cudaDev of an NCCL prefix so the file is not one block repeated."""
    head, sep, rest = line.partition(" [")
    parts = head.split(":")
    if sep and len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        host = f"node{rng.randrange(512):03d}"
        return f"{host}:{rng.randrange(1, 99999)}:{rng.randrange(1, 99999)} [{rng.randrange(8)}{rest[1:] if rest[:1].isdigit() else '] ' + rest}"
    return line


def build(path: Path, megabytes: int, seed: int, event_every: int) -> tuple[int, int]:
    """Write the synthetic log; return (lines, injected events)."""
    rng = random.Random(seed)
    chatter, events = _corpus()
    block_lines: list[str] = []
    injected_in_block = 0
    size = 0
    while size < 8 << 20:  # an 8 MB block of varied lines, written repeatedly
        if rng.randrange(event_every) == 0:
            line = rng.choice(events)
            injected_in_block += 1
        else:
            line = _vary(rng.choice(chatter), rng)
        block_lines.append(line)
        size += len(line) + 1
    block = ("\n".join(block_lines) + "\n").encode()
    target = megabytes << 20
    lines = injected = written = 0
    with path.open("wb") as out:
        while written < target:
            out.write(block)
            written += len(block)
            lines += len(block_lines)
            injected += injected_in_block
    return lines, injected


def _scan(path: Path, gate: Gate) -> tuple[float, int, int]:
    scanner = LogScanner(gate=gate)
    found = 0
    start = time.perf_counter()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK_SIZE):
            found += len(scanner.feed(chunk))
    found += len(scanner.finish())
    return time.perf_counter() - start, scanner.lines, found


def _timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, check=False, text=True)
    elapsed = time.perf_counter() - start
    return elapsed, result.stdout.strip() or result.stderr.strip()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=300, help="size of the synthetic log in MiB (default 300)")
    parser.add_argument("--seed", type=int, default=1, help="random seed for the synthetic log")
    parser.add_argument("--repeat", type=int, default=3, help="runs per contender; the best is reported")
    parser.add_argument(
        "--event-every", type=int, default=2000, help="one rare event line per N lines on average"
    )
    parser.add_argument(
        "--keep", metavar="PATH", help="write the log here and keep it (default: a temp file)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "synthetic.log"
        lines, injected = build(path, args.mb, args.seed, args.event_every)
        size_mb = path.stat().st_size / 1e6
        data = path.read_bytes()  # warm the page cache so every contender reads from memory
        candidates = len(load_gate("auto").line_starts(data, 0, len(data)))
        del data
        print(f"synthetic log: {size_mb:.0f} MB, {lines:,} lines, {injected:,} injected event lines")

        engines: list[Gate] = [load_gate("python")]
        try:
            engines.insert(0, load_gate("hyperscan"))
        except Exception as exc:
            print(f"hyperscan not available ({exc}); only the pure-Python gate is measured")
        scans: dict[str, list[tuple[float, int, int]]] = {gate.name: [] for gate in engines}
        clis, greps, narrow, starts = [], [], [], []
        for _ in range(args.repeat):  # interleaved, best of N: the machine is shared
            for gate in engines:
                scans[gate.name].append(_scan(path, gate))
            clis.append(
                _timed(["sh", "-c", f'"{sys.executable}" -m sentinel logs classify "{path}" > /dev/null'])[0]
            )
            starts.append(_timed([sys.executable, "-m", "sentinel", "logs", "classify", "/dev/null"])[0])
            greps.append(_timed(["grep", "-ciE", GATE_PATTERN, str(path)]))
            narrow.append(_timed(["grep", "-cE", NARROW_KEYWORDS, str(path)]))
        best = {name: min(runs) for name, runs in scans.items()}
        cli_s, start_s = min(clis), min(starts)
        grep_s, grep_out = min(greps)
        narrow_s, narrow_out = min(narrow)

    rows = [(f"sentinel LogScanner ({name})", seconds) for name, (seconds, _, _) in best.items()]
    rows += [
        (f"sentinel logs classify (CLI, {engines[0].name})", cli_s),
        ("  same, minus CLI start-up", max(cli_s - start_s, 1e-9)),
        (f"grep -ciE (gate's {len(GATE_LITERALS)} words)", grep_s),
        ("grep -cE (narrow 12 words, reference)", narrow_s),
    ]
    print(f"{'path':<40} {'seconds':>8} {'Mlines/s':>9} {'MB/s':>7} {'x grep':>7}")
    for name, seconds in rows:
        print(
            f"{name:<40} {seconds:>8.3f} {lines / seconds / 1e6:>9.2f} {size_mb / seconds:>7.0f} {seconds / grep_s:>7.2f}"
        )
    counts = {name: (scanned, found) for name, (_, scanned, found) in best.items()}
    for name, (scanned_lines, found) in counts.items():
        print(f"{name}: events found {found:,} (injected {injected:,}); lines counted {scanned_lines:,}")
    print(f"grep -ciE matched {grep_out} lines (the gate's candidates); narrow grep matched {narrow_out}")
    print(
        f"same-work grep: LC_ALL={os.environ.get('LC_ALL', '')!r} grep -ciE '<{len(GATE_LITERALS)} gate words>'"
    )
    fastest = best[engines[0].name][0]
    print(
        f"goal: scanner ({engines[0].name}) at least as fast as the same-work grep: "
        f"{'met' if fastest <= grep_s else 'NOT met'} ({fastest / grep_s:.2f}x)"
    )
    if len({found for _, found in counts.values()}) != 1:
        print("ERROR: the gate engines found different events", file=sys.stderr)
        return 1
    if grep_out != str(candidates):
        print(
            f"ERROR: grep found {grep_out} lines, the gate {candidates}: not the same search", file=sys.stderr
        )
        return 1
    scanned_lines = counts[engines[0].name][0]
    if scanned_lines != lines:
        print("ERROR: line count differs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
