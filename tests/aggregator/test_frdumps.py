"""Job-wide FR dumps in stuck incidents: agents' answers stored and analyzed with the safe loader.

The agents' answers are real dumps (the corpus ``hang_n4`` set: rank 3 never enters the world all_reduce
seq 93) carried the way an agent carries them (gzip bytes in the fr_dump payload), plus broken and hostile
answers.
"""

from __future__ import annotations

import asyncio
import gzip
import pickle
import re
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sentinel.aggregator.claims import CountedRefusals
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.frdumps import FrDumpSettings, per_host_budget, settings_for_frame, store_answer
from sentinel.aggregator.incidents import IncidentManager, IncidentStore
from sentinel.aggregator.state import JobView, RankView
from sentinel.aggregator.verdicts import Verdict
from sentinel.cli import main as cli_main
from sentinel.config.aggregator import AggregatorConfig, IncidentsConfig
from sentinel.wire import (
    Command,
    CommandResult,
    DumpFile,
    FrDumpAnswer,
    FrDumpRequest,
    Snapshot,
    decode_agent_frame,
)
from tests.support import corpus_path

HOSTS = {"host-a": (0, 1), "host-b": (2, 3)}


def _corpus_dumps() -> dict[int, bytes]:
    folder = corpus_path("flight_recorder", "hang_n4", "pickle")
    return {rank: (folder / f"comm_lib_trace_rank_{rank}").read_bytes() for rank in range(4)}


def _verdict(now: float) -> Verdict:
    return Verdict(
        id="v-1",
        key=("stuck", "job-1", "3"),
        detector="stuck",
        kind="stuck",
        reason="not_entered_collective",
        action="restart_app",
        host="host-b",
        gpu=1,
        job="job-1",
        rank=3,
        evidence=["rank 3 never entered (pg 0, seq 93)"],
        opened_at=now,
        evidence_t=now - 5.0,
        updated_at=now,
    )


def _manager(tmp_path: Path, answers: dict[str, Any], asked: list[Command]) -> IncidentManager:
    engine = Engine(AggregatorConfig())
    job = engine.fleet.jobs["job-1"] = JobView(id="job-1", world_size=4)
    for host, ranks in HOSTS.items():
        for rank in ranks:
            job.ranks[rank] = RankView(rank=rank, host=host, gpu=rank % 2)

    async def requester(host: str, command: Command, timeout: float) -> CommandResult | None:
        asked.append(command)
        if command.name == "snapshot":
            return CommandResult(id=command.id, answer=Snapshot(host=host, window=(0.0, 1.0)))
        answer = answers.get(host)
        if answer is None:
            return None
        # over the wire: the agent's frame goes through the one decoder, which refuses a malformed answer
        # as a whole (the aggregator closes that stream, so the request fails like a silent agent)
        tagged = {**answer, "command": "fr_dump"} if isinstance(answer, dict) else answer
        frame = msgspec.msgpack.encode({"type": "result", "id": command.id, "answer": tagged})
        try:
            result = decode_agent_frame(frame)
        except msgspec.ValidationError as exc:
            raise ConnectionError(str(exc)) from exc
        assert isinstance(result, CommandResult)
        return result

    return IncidentManager(
        engine,
        IncidentStore(tmp_path),
        requester,
        IncidentsConfig(snapshot_timeout_s=2.0),
        fr_dumps=FrDumpSettings(wait_s=0.5, answer_margin_s=1.0, workers=1),
    )


def _doc(manager: IncidentManager, incident_id: str) -> dict[str, Any]:
    """The incident as the API serves it."""
    incident = manager.get(incident_id)
    assert incident is not None
    doc: dict[str, Any] = msgspec.to_builtins(incident)
    return doc


def _answer(ranks: tuple[int, ...], dumps: dict[int, bytes]) -> dict[str, Any]:  # as builtins
    """What an agent sends back: its pipe report and the gzip-compressed dumps of its ranks."""
    return {
        "pipes": [],
        "triggered": list(ranks),
        "missing": [],
        "failed": {},
        "dumps": [
            {
                "rank": r,
                "name": f"nccl_trace_rank_{r}",
                "size": len(dumps[r]),
                "data": gzip.compress(dumps[r]),
            }
            for r in ranks
        ],
        "skipped": {},
        "waited_s": 0.2,
    }


async def test_stuck_incident_gets_the_job_wide_dump_analysis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dumps = _corpus_dumps()
    asked: list[Command] = []
    manager = _manager(tmp_path, {host: _answer(ranks, dumps) for host, ranks in HOSTS.items()}, asked)
    now = time.time()
    await manager.collect("inc-1", _verdict(now), now)

    fr_commands = [c for c in asked if c.name == "fr_dump"]
    assert sorted(c.id for c in fr_commands) == ["inc-1:fr:host-a", "inc-1:fr:host-b"]
    request = fr_commands[0].request
    assert isinstance(request, FrDumpRequest)
    assert request.job == "job-1" and request.collect is True
    assert request.since is not None and request.since <= now - 5.0
    assert 0 < request.max_bytes <= 6 * 1024 * 1024

    incident = _doc(manager, "inc-1")
    fr = incident["fr_dump"]
    assert fr["state"] == "done", fr
    assert fr["ranks"] == [0, 1, 2, 3] and fr["missing_hosts"] == []
    assert fr["hosts"]["host-a"]["dumps"] == [0, 1] and fr["hosts"]["host-b"]["triggered"] == [2, 3]
    analysis = fr["analysis"]
    assert analysis["verdict"] == "hang"
    assert analysis["culprit_ranks"] == [3]
    assert analysis["collective"]["seq"] == 93 and "all_reduce" in analysis["collective"]["op"]
    assert analysis["findings"]
    stored = sorted(p.relative_to(tmp_path / "incidents" / "inc-1.fr") for p in Path(fr["dir"]).rglob("*"))
    assert Path("host-b/nccl_trace_rank_3.gz") in stored

    assert cli_main(["incident", "--state-dir", str(tmp_path), "show", "inc-1"]) == 0
    out = capsys.readouterr().out
    assert "flight recorder: done, dumps of 4 rank(s)" in out
    assert "analysis: hang, culprit rank(s) 3" in out


async def test_missing_host_and_partial_answers_are_reported(tmp_path: Path) -> None:
    dumps = _corpus_dumps()
    asked: list[Command] = []
    manager = _manager(tmp_path, {"host-a": _answer((0, 1), dumps)}, asked)  # host-b never answers
    now = time.time()
    await manager.collect("inc-2", _verdict(now), now)
    fr = _doc(manager, "inc-2")["fr_dump"]
    assert fr["missing_hosts"] == ["host-b"] and fr["ranks"] == [0, 1]
    # every rank that dumped waits in seq 93 for ranks 2 and 3, which left no dump
    assert fr["state"] == "done" and set(fr["analysis"]["missing_dumps"]) == {2, 3}


async def test_no_dumps_leaves_no_folder(tmp_path: Path) -> None:
    asked: list[Command] = []
    empty = {"triggered": [], "missing": [0], "failed": {}, "dumps": [], "skipped": {}}
    manager = _manager(tmp_path, {"host-a": empty, "host-b": "garbage"}, asked)
    now = time.time()
    await manager.collect("inc-3", _verdict(now), now)
    incident = _doc(manager, "inc-3")
    fr = incident["fr_dump"]
    assert fr["state"] == "no_dumps" and fr["analysis"] is None
    assert fr["missing_hosts"] == ["host-b"]  # its malformed answer never got past the decoder
    # the incident says why, per cause and host, not one sentence for every cause
    assert fr["error"] == (
        "no agent returned a flight-recorder dump: no dump pipe for its 1 ranks (host-a); no answer (host-b)"
    )
    assert not (tmp_path / "incidents" / "inc-3.fr").exists()


async def test_no_dumps_names_silent_agents_and_the_agents_own_errors(tmp_path: Path) -> None:
    asked: list[Command] = []
    unset = {"triggered": [], "missing": [], "failed": {}, "dumps": [], "error": "probe.fr_dump_dir not set"}
    manager = _manager(tmp_path, {"host-a": unset}, asked)  # host-b never answers
    now = time.time()
    await manager.collect("inc-4", _verdict(now), now)
    fr = _doc(manager, "inc-4")["fr_dump"]
    assert fr["state"] == "no_dumps" and fr["missing_hosts"] == ["host-b"]
    assert fr["error"] == (
        "no agent returned a flight-recorder dump: probe.fr_dump_dir not set (host-a); no answer (host-b)"
    )


class _Boom:
    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os

        return (os.system, ("touch PWNED",))


async def test_hostile_dump_is_refused_without_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    evil = pickle.dumps({"version": "2.10", "entries": [_Boom()]}, protocol=2)
    asked: list[Command] = []
    answer = {"dumps": [{"rank": 0, "name": "nccl_trace_rank_0", "size": len(evil), "data": evil}]}
    manager = _manager(tmp_path, {"host-a": answer, "host-b": {"dumps": []}}, asked)
    now = time.time()
    await manager.collect("inc-4", _verdict(now), now)
    fr = _doc(manager, "inc-4")["fr_dump"]
    assert fr["state"] == "failed" and fr["error"]
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"triggered": [1, "x"]}, "triggered[1]"),
        ({"dumps": [{"rank": -1, "name": "a", "size": 1, "data": b"x"}]}, "rank"),
        ({"dumps": [{"rank": True, "name": "a", "size": 1, "data": b"x"}]}, "rank"),
        ({"dumps": [{"rank": 1, "name": "a", "size": 1, "data": "text"}]}, "data"),
        ({"dumps": ["nonsense"]}, "dumps[0]"),
        ({"failed": {"2": 7}}, "failed"),
    ],
)
def test_a_malformed_fr_dump_answer_is_refused_by_the_decoder(bad: dict[str, Any], where: str) -> None:
    frame = msgspec.msgpack.encode({"type": "result", "id": "c", "answer": {**bad, "command": "fr_dump"}})
    with pytest.raises(msgspec.ValidationError, match=re.escape(where)):
        decode_agent_frame(frame)


def test_store_answer_keeps_first_dumps_within_the_budget_and_inside_its_folder(tmp_path: Path) -> None:
    seen = {5}
    answer = FrDumpAnswer(
        triggered=[1],
        failed={"2": "no reader"},
        dumps=[
            DumpFile(rank=4, name="a", size=0, data=b""),
            DumpFile(rank=5, name="b", size=3, data=b"dup"),
            DumpFile(rank=7, name="c", size=100, data=b"y" * 100),
            DumpFile(rank=2, name="d", size=4, data=b"\x1f\x8bzz"),
        ],
    )
    report, written = store_answer(tmp_path, "../evil host", answer, seen, budget=50)
    assert report["dumps"] == [2] and written == 4
    assert report["triggered"] == [1] and report["failed"] == {"2": "no reader"}
    assert len(report["problems"]) == 3  # empty, a rank another host sent, beyond the budget
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["nccl_trace_rank_2.gz"]
    assert all(tmp_path in p.parents for p in tmp_path.rglob("*"))
    other, _ = store_answer(tmp_path, "h", Snapshot(host="h", window=(0.0, 1.0)), set(), budget=50)
    assert other["problems"] == ["h: answered fr_dump with Snapshot, not dumps"]


def test_per_host_budget_shares_the_total() -> None:
    settings = FrDumpSettings(max_bytes_per_host=6 << 20, max_total_bytes=128 << 20)
    assert per_host_budget(settings, 2) == 6 << 20
    assert per_host_budget(settings, 1024) == 128 << 10
    assert per_host_budget(settings, 1 << 20) == 64 << 10
    small = settings_for_frame(64 * 1024)  # an aggregator with small frames asks for less
    assert small.max_bytes_per_host < 48 * 1024 and per_host_budget(small, 1) == small.max_bytes_per_host
    assert settings_for_frame(64 << 20).max_bytes_per_host == 6 << 20


async def test_analysis_failure_marks_the_fr_part_failed_with_the_file(tmp_path: Path) -> None:
    # a plausible dump whose input_sizes nest 6,000 deep (raised RecursionError and stayed "collecting")
    from tests.fr.test_hostile import _deep_list_pickle

    asked: list[Command] = []
    deep = _deep_list_pickle(6000)
    answer = {"dumps": [{"rank": 0, "name": "nccl_trace_rank_0", "size": len(deep), "data": deep}]}
    manager = _manager(tmp_path, {"host-a": answer, "host-b": {"dumps": []}}, asked)
    now = time.time()
    await manager.collect("inc-5", _verdict(now), now)
    fr = _doc(manager, "inc-5")["fr_dump"]
    assert fr["state"] == "failed"
    assert "nccl_trace_rank_0" in fr["error"] and "input_sizes" in fr["error"]


async def test_a_host_sending_dumps_for_another_hosts_ranks_is_refused_and_the_blame_stays(
    tmp_path: Path,
) -> None:
    """host-a answers first, with its own dumps and forged ones for host-b's ranks 2 and 3 (copies of its
    own, which would say rank 3 entered the collective): the job mapping says host-b runs them, so the
    forged dumps are refused and counted, host-b's real dumps are kept, and the culprit stays rank 3."""
    dumps = _corpus_dumps()
    forged = _answer((0, 1), dumps)
    for rank, copy_of in ((2, 0), (3, 1)):
        forged["dumps"].append(
            {
                "rank": rank,
                "name": f"nccl_trace_rank_{rank}",
                "size": len(dumps[copy_of]),
                "data": gzip.compress(dumps[copy_of]),
            }
        )
    asked: list[Command] = []
    manager = _manager(tmp_path, {"host-a": forged, "host-b": _answer((2, 3), dumps)}, asked)
    answered_a = asyncio.Event()
    real = manager.requester

    async def host_a_first(host: str, command: Command, timeout: float) -> CommandResult | None:
        if command.name == "fr_dump" and host == "host-b":
            await answered_a.wait()  # the forged answer is there first: first dump of a rank would win
        result = await real(host, command, timeout)
        if command.name == "fr_dump" and host == "host-a":
            answered_a.set()
        return result

    manager.requester = host_a_first
    now = time.time()
    await manager.collect("inc-forged", _verdict(now), now)
    fr = _doc(manager, "inc-forged")["fr_dump"]
    assert fr["hosts"]["host-a"]["dumps"] == [0, 1] and fr["hosts"]["host-a"]["refused"] == [2, 3]
    assert "host-a: rank 3 runs on host-b, not here; its dump is refused" in fr["hosts"]["host-a"]["problems"]
    assert fr["hosts"]["host-b"]["dumps"] == [2, 3]
    assert fr["state"] == "done" and fr["analysis"]["culprit_ranks"] == [3]
    refusals = manager.engine.fleet.refusals
    assert isinstance(refusals, CountedRefusals) and refusals.counts == {"rank_not_owned": 2}


def test_store_answer_refuses_ranks_another_host_runs(tmp_path: Path) -> None:
    answer = FrDumpAnswer(
        dumps=[DumpFile(rank=r, name=f"nccl_trace_rank_{r}", size=1, data=b"x") for r in (0, 1, 9)]
    )
    owners = {0: "a", 1: "b"}  # rank 9: no host known to run it, so nobody's dump for it is refused
    report, _ = store_answer(tmp_path, "a", answer, set(), budget=100, owners=owners)
    assert report["dumps"] == [0, 9] and report["refused"] == [1]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["nccl_trace_rank_0", "nccl_trace_rank_9"]
