"""NCCL RAS answers at the edges: integers at and past the wire's range, thousands of rank lines (the parse
work grows linearly, counted in executed lines, not timed), and any parse result encodes in a batch."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel import wire
from sentinel.components.nccl_ras import parse
from sentinel.components.nccl_ras.parse import parse_status
from sentinel.components.nccl_ras.record import MAX_ITEMS, WIRE_INT_MAX


def mismatch_block(ranks: int, *, ops_base: int = 1000, distinct: bool = True) -> str:
    """A MISMATCH block with one rank line per rank, each at its own count (``distinct``) or one count."""
    lines = [
        "Warnings",
        "========",
        "",
        "#0-0 (cf264af53edbe986) MISMATCH",
        "Communicator ranks have different collective operation counts",
        f"{ranks} ranks have launched up to operation {ops_base}",
    ]
    for r in range(ranks):
        ops = ops_base + r if distinct else ops_base
        lines.append(
            f"Rank {r} has launched up to operation {ops} -- GPU {r % 8} managed by process {1000 + r} "
            f"on node n{r // 8}"
        )
    return "\n".join(lines) + "\n"


def encodes(status: Any) -> bool:
    frame = wire.encode(wire.Batch(seq=1, t=1.0, ras=[status]))
    back = msgspec.msgpack.decode(frame, type=wire.Batch)
    return back.ras == [status]


def test_the_largest_counts_the_wire_carries_parse_and_encode() -> None:
    text = (
        "#0-0 (cf264af53edbe986) MISMATCH\n"
        f"{WIRE_INT_MAX} ranks have launched up to operation {WIRE_INT_MAX}\n"
        f"Rank 9999999999 has launched up to operation {WIRE_INT_MAX} -- GPU 9999 managed by process "
        "9999999999 on node n\n"
        "  Missing communicator data from 9999999999 ranks\n"
    )
    status = parse_status(text)
    (comm,) = status.comms
    assert comm.groups[0].ops == WIRE_INT_MAX and comm.groups[0].ranks[0].pid == 9999999999
    assert status.unparsed == 1  # the group count of 19 digits is beyond the group line's pattern
    assert encodes(status)


def test_a_count_past_the_wire_is_an_unparsed_line_not_a_lost_batch() -> None:
    """An operation count of 20 digits used to pass the parser and fail the batch's encoding: the tick's
    samples and Xids were lost on every query."""
    too_big = WIRE_INT_MAX + 1
    text = (
        "#0-0 (cf264af53edbe986) MISMATCH\n"
        f"3 ranks have launched up to operation {too_big}\n"
        "2 ranks have launched up to operation 5\n"
        f"Rank 1 has launched up to operation 99999999999999999999 -- GPU 0 managed by process 7 on node n\n"
        "Rank 2 has launched up to operation 5 -- GPU 1 managed by process 8 on node n\n"
        "The missing ranks: 1, 99999999999999999999999, 3\n"
        "Process 1 on node n managing GPUs 99999999999999999998-99999999999999999999\n"
    )
    status = parse_status(text)
    (comm,) = status.comms
    assert [(g.count, g.ops, [r.rank for r in g.ranks]) for g in comm.groups] == [(2, 5, [2])]
    assert [r.rank for r in comm.missing_ranks] == [1, 3]
    assert status.unparsed == 3  # the group line, the rank line, the process line outside its block
    assert encodes(status)


_NUMBERS = st.one_of(
    st.integers(min_value=0, max_value=99),
    st.integers(min_value=WIRE_INT_MAX - 2, max_value=WIRE_INT_MAX + 2),
    st.integers(min_value=10**19, max_value=10**21),
)


@st.composite
def ras_lines(draw: st.DrawFn) -> str:
    """RAS-shaped lines with numbers from tiny to past 64 bits."""
    n = draw(_NUMBERS)
    m = draw(_NUMBERS)
    shape = draw(
        st.sampled_from(
            [
                f"{n} ranks have launched up to operation {m}",
                f"Rank {n} has launched up to operation {m} -- GPU 1 managed by process {m} on node x",
                f"Rank {n} has status RUNNING -- GPU {m} managed by process 2 on node x",
                f"Rank {n} -- GPU {n % 10000} managed by process {m} on node x",
                f"  Missing communicator data from {n} ranks",
                f"The missing ranks: {n}, {m}",
                f"Process {n} on node x managing GPUs {m}-{m}",
                f"{n} job process is considered dead",
                f"Encountered {n} communication timeouts",
                f"    {n}    {m}    1    2    3    4    RUNNING    OK",
                f"  {n}  {m}  1  2  3",
                f"#{n}-{m} (abc) MISMATCH",
                "#0-0 (abc) MISMATCH",
                "INCOMPLETE",
                "DEAD",
                "Errors",
                "Job summary",
                "Communicators... (0.00s)",
                "",
            ]
        )
    )
    return shape


@settings(max_examples=300, deadline=None)
@given(st.lists(ras_lines(), max_size=40))
def test_any_parse_of_ras_shaped_text_encodes_in_a_batch(lines: list[str]) -> None:
    status = parse_status("\n".join(lines))
    assert encodes(status)


def _executed_lines(text: str) -> int:
    """Lines of parse.py executed while parsing ``text`` (the parser's work, independent of the machine)."""
    count = 0
    target = parse.__file__

    def tracer(frame: FrameType, event: str, _arg: object) -> Any:
        nonlocal count
        if frame.f_code.co_filename != target:
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        parse_status(text)
    finally:
        sys.settrace(None)
    return count


def test_placing_rank_lines_is_linear() -> None:
    """Each rank line at its own operation count used to be compared with every group before it: twice the
    lines was four times the work. Now twice the lines is twice the work."""
    small = _executed_lines(mismatch_block(2000))
    large = _executed_lines(mismatch_block(4000))
    assert 1.8 < large / small < 2.2


def test_twelve_thousand_rank_lines_keep_their_bounds() -> None:
    status = parse_status(mismatch_block(12000, distinct=True))
    (comm,) = status.comms
    assert len(comm.groups) == MAX_ITEMS and all(len(g.ranks) <= MAX_ITEMS for g in comm.groups)
    assert comm.groups[0].ops == 1000 and [r.rank for r in comm.groups[0].ranks] == [0]
    same = parse_status(mismatch_block(12000, distinct=False)).comms[0]
    assert len(same.groups) == 1 and len(same.groups[0].ranks) == MAX_ITEMS
