"""The chunked fast path gives exactly what line-by-line classification gives, across chunk boundaries."""

from __future__ import annotations

import json
import random

import pytest

from sentinel.signals import LogScanner, classify_line, scan_bytes
from sentinel.signals.scan import continuation_rule
from tests.support import corpus_path

CHATTER = [
    "dgxh100-3:2152176:2152299 [0] NCCL INFO Channel 01/1 : 0[0] -> 8[0] [send] via NET/IB/9/GDRDMA/Shared",
    "A03-R28-I49-2-6000166:58077:58136 [1] NCCL INFO Connected all trees",
    "node08:6561:6561 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ibs3:10.252.0.211<0>",
    "dgxh100-3:2152176:2152299 [0] NCCL INFO Trees [0] -1/-1/-1->1->0 [1] -1/-1/-1->1->0",
    "epoch 3 step 1200 loss 2.345",
    "",
]


def _single_line_corpus() -> list[str]:
    path = corpus_path("logs", "real_lines.jsonl")
    texts = [
        json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    # Single-line records only (a line that starts a hard-wrapped block is joined with the next line
    # on purpose; that is tested separately).
    return [t for t in texts if "\n" not in t and "\r" not in t and continuation_rule(t) is None]


def _mixed_log(seed: int) -> list[str]:
    rng = random.Random(seed)
    events = _single_line_corpus()
    lines = []
    for _ in range(3000):
        lines.append(rng.choice(events) if rng.random() < 0.1 else rng.choice(CHATTER))
    return lines


def _expected(lines: list[str]) -> list[tuple[int, str, str, int | None]]:
    out: list[tuple[int, str, str, int | None]] = []
    for number, line in enumerate(lines, start=1):
        event = classify_line(line)
        if event is not None:
            out.append((number, event.kind, event.severity, event.xid))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_fast_path_equals_line_by_line(seed: int) -> None:
    lines = _mixed_log(seed)
    data = ("\n".join(lines) + "\n").encode()
    got = [(e.line, e.kind, e.severity, e.xid) for e in scan_bytes(data)]
    assert got == _expected(lines)
    assert got, "the mixed log contains events"


@pytest.mark.parametrize("size", [1, 7, 64, 4096])
def test_chunk_boundaries_do_not_matter(size: int) -> None:
    lines = _mixed_log(3)[:600]
    data = "\n".join(lines).encode()  # no final newline: finish() must take the last line
    scanner = LogScanner()
    events = []
    for offset in range(0, len(data), size):
        events.extend(scanner.feed(data[offset : offset + size]))
    events.extend(scanner.finish())
    assert [(e.line, e.kind, e.xid) for e in events] == [(e.line, e.kind, e.xid) for e in scan_bytes(data)]
    assert scanner.lines == len(lines)


def test_hard_wrapped_watchdog_is_one_event() -> None:
    text = (
        "h:1:2 [0] NCCL INFO Connected all trees\n"
        "[E329 19:15:11.775879730 ProcessGroupNCCL.cpp:565] [Rank 0] Watchdog\n"
        "caught collective operation timeout: WorkNCCL(SeqNum=2,\n"
        "OpType=ALLREDUCE, NumelIn=10, NumelOut=10, Timeout(ms)=10000) ran for\n"
        "10028 milliseconds before timing out.\n"
        "h:1:2 [0] NCCL INFO Connected all trees\n"
    )
    for size in (5, 1 << 20):
        scanner = LogScanner()
        events = []
        data = text.encode()
        for offset in range(0, len(data), size):
            events.extend(scanner.feed(data[offset : offset + size]))
        events.extend(scanner.finish())
        assert [(e.kind, e.line, e.seq, e.op, e.timeout_ms) for e in events] == [
            ("torch_watchdog_timeout", 2, 2, "ALLREDUCE", 10000)
        ]


def test_nvidia_smi_block_is_one_event() -> None:
    text = (
        "GPU 00000000:3B:00.0\n    Remapped Rows\n        Correctable Error                 : 0\n"
        "        Uncorrectable Error               : 4\n        Pending                           : Yes\n"
        "        Remapping Failure Occurred        : No\n    Temperature\n        GPU Current Temp : 40 C\n"
    )
    events = scan_bytes(text.encode())
    assert [(e.kind, e.severity, e.line) for e in events] == [("row_remap", "critical", 2)]


def test_include_all_gives_one_object_per_line() -> None:
    lines = [*CHATTER[:4], "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."]
    events = scan_bytes(("\n".join(lines) + "\n").encode(), include_all=True)
    assert [e.line for e in events] == [1, 2, 3, 4, 5]
    assert events[-1].kind == "xid"
    assert {e.kind for e in events[:4]} == {"nccl_info"}


def test_invalid_utf8_and_crlf() -> None:
    data = b"\xff\xfe\xfd NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=\xc3\x28, DBE\r\nplain \x80 text\r\n"
    events = scan_bytes(data)
    assert [(e.kind, e.xid, e.line) for e in events] == [("xid", 48, 1)]


def test_huge_line_without_newline_is_bounded() -> None:
    scanner = LogScanner()
    blob = b"x" * (3 << 20) + b" NCCL WARN Cuda failure 'oops'"
    events = []
    for offset in range(0, len(blob), 1 << 20):
        events.extend(scanner.feed(blob[offset : offset + (1 << 20)]))
    events.extend(scanner.finish())
    assert len(scanner._buffer) == 0


def test_every_split_point_of_a_wrapped_block_gives_the_same_event() -> None:
    data = (
        b"h:1:2 [0] NCCL INFO Connected all trees\n"
        b"[E1 1:1:1.1 ProcessGroupNCCL.cpp:1] [Rank 0] Watchdog\n"
        b"caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, Timeout(ms)=10000) ran for\n"
        b"10028 milliseconds before timing out.\n"
        b"NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
    )
    expected = [("torch_watchdog_timeout", 2, 2), ("xid", 5, None)]
    for split in range(1, len(data)):
        scanner = LogScanner()
        events = scanner.feed(data[:split]) + scanner.feed(data[split:]) + scanner.finish()
        assert [(e.kind, e.line, e.seq) for e in events] == expected, split
        assert scanner.lines == 5
