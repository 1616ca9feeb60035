"""One round of calls on the per-GPU workers: each answer in order, a hung call bounded by the deadline."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sentinel.agent.worker import GpuWorker, InlineWorker, Unresponsive, call_each


def _fails() -> int:
    raise ValueError("no such GPU")


async def test_each_answer_comes_back_in_order_and_a_hung_call_only_at_the_deadline() -> None:
    workers = [GpuWorker(f"gpu{i}") for i in range(3)]
    release = threading.Event()
    started = time.monotonic()
    answers = await call_each(
        [(workers[0], lambda: 7), (workers[1], lambda: release.wait(30)), (workers[2], _fails)], 0.5
    )
    assert time.monotonic() - started < 5.0
    assert answers[0] == (7, None)
    assert answers[1][0] is None and isinstance(answers[1][1], Unresponsive)
    assert answers[2][0] is None and isinstance(answers[2][1], ValueError)
    # the stuck worker is not given another call while its call has not returned; the others are
    started = time.monotonic()
    answers = await call_each([(workers[0], lambda: 8), (workers[1], lambda: 9)], 5.0)
    assert time.monotonic() - started < 1.0
    assert answers[0] == (8, None) and isinstance(answers[1][1], Unresponsive)
    release.set()  # its late answer is dropped; once returned, the worker takes calls again
    deadline = time.monotonic() + 5
    while workers[1].busy and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert (await call_each([(workers[1], lambda: 10)], 5.0)) == [(10, None)]
    for worker in workers:
        worker.stop()


async def test_inline_workers_answer_in_place() -> None:
    answers = await call_each([(InlineWorker("gpu0"), lambda: 1), (InlineWorker("gpu1"), _fails)], 1.0)
    assert answers[0] == (1, None)
    with pytest.raises(ValueError):
        raise answers[1][1] or AssertionError("no error")
