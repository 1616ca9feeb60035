"""NCCL RAS: the parser on real RAS output, the client against a RAS-protocol server on 127.0.0.1."""

from __future__ import annotations

import socket

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.components.nccl_ras.client import RasError, RasNotListening, query_status
from sentinel.components.nccl_ras.parse import parse_status
from sentinel.components.nccl_ras.record import RasStatus
from tests.components.nccl_ras.rasserver import FakeRas
from tests.support import REPO

DATA = REPO / "tests" / "data" / "nccl_ras"


def load(name: str) -> str:
    return (DATA / name).read_text()


def test_running_job_is_healthy() -> None:
    s = parse_status(load("docs_running.txt"))
    assert (s.nodes, s.processes, s.gpus) == (4, 32, 32)
    assert [(g.comms, g.ranks_in_group, g.status, g.errors) for g in s.groups] == [(8, 32, "RUNNING", "OK")]
    assert s.healthy and s.unparsed == 0


def test_missing_process_and_rank_and_timeouts() -> None:
    s = parse_status(load("docs_incomplete.txt"))
    assert not s.healthy and s.unparsed == 0
    assert s.collection_s == 2.05
    assert s.missing_process_count == 1
    assert [(p.pid, p.node, p.gpus) for p in s.missing_processes] == [(3487984, "172.16.64.213", [5])]
    (comm,) = s.comms
    assert (comm.comm, comm.hash, comm.kind, comm.missing) == ("#0-0", "cf264af53edbe986", "INCOMPLETE", 1)
    assert [r.rank for r in comm.missing_ranks] == [21]
    assert s.timeouts == 2
    assert s.groups[0].ranks_per_node == "7-8"


def test_dead_process() -> None:
    s = parse_status(load("docs_dead.txt"))
    assert s.dead_process_count == 1
    assert s.dead_processes[0].pid == 3487984 and s.dead_processes[0].gpus == [5]
    assert [r.rank for r in s.comms[0].missing_ranks] == [21]


def test_ranks_behind_in_collective_counts() -> None:
    s = parse_status(load("docs_mismatch.txt"))
    (comm,) = s.comms
    assert comm.kind == "MISMATCH" and comm.about == "collective operation counts"
    assert [(g.count, g.ops) for g in comm.groups] == [(26, 6650), (6, 6649)]
    behind = comm.groups[1]
    assert [r.rank for r in behind.ranks] == [0, 2, 3, 4, 5, 7]
    assert {(r.node, r.ops) for r in behind.ranks} == {("172.16.64.210", 6649)}
    assert behind.ranks[0].pid == 483072 and behind.ranks[0].gpu == 0


def test_status_groups_while_finalizing() -> None:
    s = parse_status(load("docs_finalize.txt"))
    assert [g.status for g in s.groups] == ["FINALIZE", "RUNNING", "INIT"]
    groups = s.comms[0].groups
    assert [(g.count, g.status, [r.rank for r in g.ranks]) for g in groups] == [
        (26, "UNKNOWN", []),
        (4, "RUNNING", [0, 8, 16, 24]),
        (2, "FINALIZE", [4, 20]),
    ]
    assert s.unparsed == 0


def test_real_outputs_from_public_issues() -> None:
    s = parse_status(load("issue1762_incomplete.txt"))
    assert s.nccl_version == "2.27.3"
    assert [g.errors for g in s.groups] == ["INCOMPLETE", "MISMATCH", "INCOMPLETE,MISMATCH"]
    assert s.missing_processes[0].pid == 60004
    assert [(r.rank, r.gpu, r.pid) for r in s.comms[0].missing_ranks] == [(1, 0, 60004)]
    s = parse_status(load("issue1911_mismatch.txt"))
    comm = s.comms[0]
    assert comm.about == "AllGather operation counts"
    assert [(g.count, g.ops, [r.rank for r in g.ranks]) for g in comm.groups] == [
        (30, 640, []),
        (2, 641, [12, 13]),
    ]
    assert s.unparsed == 0


_LINES = st.sampled_from(
    [
        "Errors", "Warnings", "======", "", "INCOMPLETE", "DEAD", "TIMEOUT", "#0-0 (cf264af53edbe986) INCOMPLETE",
        "  Missing communicator data from 99999999999 ranks", "  The missing rank: 1, 2, x",
        "  Rank 5 -- GPU 9999 managed by process 1 on node n", "  Process 1 on node n managing GPUs 0-99999",
        "    0         1         4         8        32        32   RUNNING  MISMATCH", "  7 ranks have status X",
    ]
)  # fmt: skip


#: lines no part of a RAS answer looks like (no section title, table row, block head or known prefix)
_NOISE = st.text(alphabet="qjxz ", min_size=1, max_size=40).filter(str.strip)
_ANSWERS = [
    "docs_running.txt",
    "docs_incomplete.txt",
    "docs_dead.txt",
    "docs_mismatch.txt",
    "docs_finalize.txt",
    "issue1762_incomplete.txt",
    "issue1911_mismatch.txt",
]


@given(st.lists(st.one_of(_LINES, st.text(max_size=80)), max_size=60))
def test_parser_never_raises_on_any_text(lines: list[str]) -> None:
    """Any text: a bounded record, each line counted as unparsed at most once."""
    text = "\n".join(lines)
    status = parse_status(text)
    assert 0 <= status.unparsed <= sum(1 for line in text.splitlines() if line.strip())
    for comm in status.comms:
        assert len(comm.lines) <= 32


@given(st.lists(_NOISE, max_size=20), st.sampled_from(_ANSWERS))
def test_unparsed_lines_are_counted_exactly_and_the_answer_parses_as_without_them(
    noise: list[str], name: str
) -> None:
    answer = load(name)
    clean = parse_status(answer)
    alone = parse_status("\n".join(noise))
    assert alone.unparsed == len(noise) and msgspec.structs.replace(alone, unparsed=0) == RasStatus()
    noisy = parse_status("\n".join(noise) + "\n\n" + answer)
    assert noisy.unparsed == clean.unparsed + len(noise)
    assert msgspec.structs.replace(noisy, unparsed=0) == msgspec.structs.replace(clean, unparsed=0)


async def test_client_speaks_the_protocol() -> None:
    server = FakeRas(answer=load("docs_incomplete.txt"))
    port = await server.start()
    try:
        text = await query_status("127.0.0.1", port, timeout_s=5.0, collective_timeout_s=3)
    finally:
        await server.close()
    assert server.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 3", "VERBOSE STATUS"]
    assert parse_status(text).missing_process_count == 1


async def test_client_off_when_nothing_listens() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(RasNotListening):
            await query_status("127.0.0.1", port, timeout_s=2.0)


async def test_client_times_out_on_a_wedged_service() -> None:
    server = FakeRas(stall_status=True)
    port = await server.start()
    try:
        with pytest.raises(RasError, match="not complete within"):
            await query_status("127.0.0.1", port, timeout_s=0.3)
    finally:
        await server.close()


async def test_client_refuses_a_wrong_peer() -> None:
    server = FakeRas(protocol_reply=b"HTTP/1.1 400 Bad Request\n")
    port = await server.start()
    try:
        with pytest.raises(RasError, match="unexpected reply"):
            await query_status("127.0.0.1", port, timeout_s=2.0)
    finally:
        await server.close()
