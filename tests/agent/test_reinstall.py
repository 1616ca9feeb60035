"""A reinstalled agent (its state directory wiped, the same boot) numbers its batches from 0 again under a
new instance id, and the aggregator applies them: an Xid 79 right after the reinstall reaches a verdict."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import structlog

from sentinel.agent import Agent
from sentinel.agent.spool import stream_instance
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource
from tests.aggregator.helpers import TOKEN, running_aggregator, wait_until


def test_the_instance_id_lives_and_dies_with_the_state_directory(tmp_path: Path) -> None:
    path = tmp_path / "instance"
    first = stream_instance(path)
    assert stream_instance(path) == first  # a restart keeps it
    path.unlink()  # the state directory wiped
    assert stream_instance(path) not in ("", first)
    assert stream_instance(None) != stream_instance(None)  # no state directory: one per process
    path.write_text("../../etc\n")  # not an id: replaced, not trusted
    assert stream_instance(path).isalnum()


async def test_a_wiped_state_directory_on_the_same_boot_is_a_new_stream_not_duplicates(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    async with running_aggregator(tmp_path / "aggregator") as running:
        config = make_config(
            tmp_path,
            stream={"enabled": True, "aggregator_url": running.stream_url, "token_file": str(token)},
            collect={"tick_s": 0.05, "xid_merge_wait_s": 0.0},
        )
        first = Agent(config, FakeSource(gpus=4))
        task = asyncio.create_task(first.run())
        try:
            await wait_until(lambda: first.counters.batches_acked >= 60, timeout=30)
        finally:
            first.request_stop()
            await asyncio.wait_for(task, 15)
        host = running.aggregator.engine.fleet.hosts["host-test"]
        old_mark = host.seq_hw
        assert old_mark >= 59

        shutil.rmtree(tmp_path / "state")  # reinstalled: spool, seq file and instance id gone
        source = FakeSource(gpus=4)
        second = Agent(config, source)
        assert second.boot_id == first.boot_id and second.seq.next == 0
        assert second.hello().instance_id != first.hello().instance_id
        with structlog.testing.capture_logs() as logs:
            task = asyncio.create_task(second.run())
            try:
                await wait_until(lambda: second.counters.batches_acked >= 1)
                source.push_xid(2, 79, time.time())
                await wait_until(
                    lambda: any(
                        v.host == "host-test" and v.gpu == 2 and v.reason == "xid_79"
                        for v in running.aggregator.engine.book.open.values()
                    ),
                    timeout=15,
                )
                assert host.seq_hw < old_mark  # the Xid came in a batch numbered below the old mark
            finally:
                second.request_stop()
                await asyncio.wait_for(task, 15)
        (changed,) = [entry for entry in logs if entry["event"] == "agent_instance_changed"]
        assert changed["host"] == "host-test" and changed["next_seq"] == 0
