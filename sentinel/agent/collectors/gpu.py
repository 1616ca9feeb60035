"""The ``nvml`` collector: per-GPU NVML reads, each in its own worker thread with a deadline.

Fast readings every tick, slow counters on their own cadence; a GPU that stops answering is marked
unresponsive (or lost) without blocking the others, NVML as a whole going away is re-initialised with a
backoff, and a lost GPU that answers again after re-initialisation is reported as reset. The GPU count
learned from the first inventory is kept in the state dir.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from sentinel.agent.collectors.base import AgentSink
from sentinel.agent.source import GpuLostError, GpuSource
from sentinel.agent.worker import Unresponsive, call_each
from sentinel.components.collector import Collector, Worker
from sentinel.components.device.record import GpuSourceHealth
from sentinel.components.nvml_read import GpuSourceDown, GpuUnreachable
from sentinel.log import get_logger
from sentinel.wire import (
    MAX_TEXT_CHARS,
    GpuSample,
    GpuState,
    GpuStateChanged,
    GpuWasReset,
    Severity,
)

log = get_logger(module="agent.collectors")


class GpuCollector(Collector):
    """Per-GPU NVML reads, each in its own worker thread with a deadline; slow counters on their cadence."""

    name = "nvml"

    #: re-initialisation backoff: doubles from the slow tick up to this
    MAX_BACKOFF_S = 300.0

    def __init__(
        self,
        sink: AgentSink,
        source: GpuSource,
        *,
        tick_s: float,
        slow_tick_s: float,
        timeout_s: float,
        expected_gpus: int = 0,
        expected_path: Path | None = None,
    ) -> None:
        super().__init__(tick_s)
        self.sink = sink
        self.source = source
        self.slow_tick_s = slow_tick_s
        self.timeout_s = timeout_s
        self.opened = False
        self._opener: Worker | None = None
        self._workers: dict[int, Worker] = {}
        self._next_slow = 0.0
        self._next_open = 0.0
        self._backoff = slow_tick_s
        self.on_open: Callable[[], None] | None = None
        self.expected_path = expected_path
        self.expected = expected_gpus or _load_expected(expected_path)
        self.opens = 0
        self._lost_uuids: set[str] = set()  # GPUs lost before a re-initialisation (back = reset)

    @property
    def _open_worker(self) -> Worker:
        """The worker for open/close (made on first use: inline mode is set after construction)."""
        if self._opener is None:
            self._opener = self.new_worker(f"{self.sink.host}-nvml-open")
        return self._opener

    def _health(self, error: str = "") -> None:
        found = sum(1 for v in self.sink.gpus.values() if v.state != "unavailable") if not error else 0
        self.sink.set_gpu_source(
            GpuSourceHealth(ok=not error, error=error[:500], expected=self.expected, found=found)
        )

    async def _open(self, now: float) -> bool:
        if now < self._next_open:
            return False
        try:
            inventory = await self._open_worker.call(self.source.open, max(self.timeout_s * 4, 5.0))
        except Exception as exc:
            error = "NVML open timed out" if isinstance(exc, Unresponsive) else f"{type(exc).__name__}: {exc}"
            log.error("gpu_source_open_failed", host=self.sink.host, error=error, retry_in_s=self._backoff)
            self.sink.nvml_error(
                "open", "timeout" if isinstance(exc, Unresponsive) else type(exc).__name__.lower()
            )
            self._next_open = now + self._backoff
            self._backoff = min(self._backoff * 2, self.MAX_BACKOFF_S)
            self._health(error)
            return False
        self._backoff = self.slow_tick_s
        self.opens += 1
        self.sink.set_inventory(inventory)
        for info in inventory:
            if info.error:
                self._transition(info.index, "unavailable", now, f"GPU {info.index}: {info.error}")
            elif info.uuid and info.uuid in self._lost_uuids:
                self._reset_seen(info.index, now)
        self._lost_uuids.clear()
        self._workers = {
            g.index: self.new_worker(f"{self.sink.host}-gpu{g.index}") for g in inventory if not g.error
        }
        self.opened = True
        if not self.expected and inventory:
            self.expected = len(inventory)  # learned from the first inventory, kept across restarts
            _save_expected(self.expected_path, self.expected)
        self._health()
        if self.opens == 1 and self.on_open is not None:
            self.on_open()
        log.info("gpus_found", count=len(inventory), expected=self.expected, host=self.sink.host)
        return True

    async def _reinit(self, now: float, why: str) -> None:
        """NVML as a whole went away (driver reload, reset): close it and open again after a backoff."""
        log.warning("gpu_source_reinit", host=self.sink.host, reason=why, retry_in_s=self._backoff)
        self._lost_uuids = {v.info.uuid for v in self.sink.gpus.values() if v.state == "lost" and v.info.uuid}
        for worker in self._workers.values():
            worker.stop()
        self._workers = {}
        self.opened = False
        try:
            await self._open_worker.call(self.source.close, max(self.timeout_s * 4, 5.0))
        except Exception as exc:
            log.warning("gpu_source_close_failed", error=f"{type(exc).__name__}: {exc}")
        self._next_open = now + self._backoff
        self._health(why)

    def _reset_seen(self, index: int, now: float) -> None:
        self.sink.add_event(
            GpuWasReset(
                t=now,
                source="nvml",
                gpu=index,
                severity="info",
                text=f"GPU {index} answers again after NVML re-initialisation (it was lost): it was reset",
            )
        )

    async def collect(self, now: float) -> None:
        if not self.opened and not await self._open(now):
            raise RuntimeError("GPU source not open")
        slow = now >= self._next_slow
        if slow:
            self._next_slow = now + self.slow_tick_s - self.interval_s / 2
        for index, view in sorted(self.sink.gpus.items()):
            if view.state == "unavailable" and index not in self._workers:
                self.sink.add_sample(GpuSample(gpu=index, t=now, state="unavailable"))
        read = self.source.read_slow if slow else self.source.read_fast
        if self.inline:
            results = [await self._read(index, now, slow, read) for index in sorted(self._workers)]
        else:
            results = await self._read_round(now, slow, read)
        down = next((r for r in results if r), "")
        if not down and slow:
            views = [v for v in self.sink.gpus.values() if v.state != "unavailable"]
            if views and all(v.state == "lost" for v in views):
                down = "every GPU is lost"
        if down:
            await self._reinit(now, down)
            raise RuntimeError(f"GPU source down: {down}")

    async def _read(self, index: int, now: float, slow: bool, read: Callable[[int, float], GpuSample]) -> str:
        """Read one GPU; returns why NVML as a whole is down, if this read found it so."""
        if self.sink.gpus[index].state == "lost" and not slow:
            self.sink.add_sample(GpuSample(gpu=index, t=now, state="lost"))
            return ""
        try:
            sample = await self._workers[index].call(functools.partial(read, index, now), self.timeout_s)
        except Exception as exc:
            return self._answer(index, now, slow, None, exc)
        return self._answer(index, now, slow, sample, None)

    async def _read_round(self, now: float, slow: bool, read: Callable[[int, float], GpuSample]) -> list[str]:
        """Every GPU's read at once, each on its own worker with the same deadline (a hung GPU holds none of
        the others' answers, and the loop is woken once for the round); the answers applied in GPU order."""
        indices = sorted(self._workers)
        asked = [i for i in indices if not (self.sink.gpus[i].state == "lost" and not slow)]
        answers = dict(
            zip(
                asked,
                await call_each(
                    [(self._workers[i], functools.partial(read, i, now)) for i in asked], self.timeout_s
                ),
                strict=True,
            )
        )
        results: list[str] = []
        failed: Exception | None = None
        for index in indices:
            answer = answers.get(index)
            if answer is None:  # lost: asked again only on a slow tick
                self.sink.add_sample(GpuSample(gpu=index, t=now, state="lost"))
                continue
            try:
                results.append(self._answer(index, now, slow, *answer))
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        return results

    def _answer(
        self, index: int, now: float, slow: bool, sample: GpuSample | None, error: BaseException | None
    ) -> str:
        """One GPU's read answered; returns why NVML as a whole is down, if this read found it so."""
        view = self.sink.gpus[index]
        if isinstance(error, GpuSourceDown):
            return str(error)
        if isinstance(error, GpuLostError):
            self._transition(index, "lost", now, str(error))
            self.sink.add_sample(GpuSample(gpu=index, t=now, state="lost"))
            return ""
        if isinstance(error, GpuUnreachable):
            self._transition(index, "unavailable", now, str(error))
            self.sink.add_sample(GpuSample(gpu=index, t=now, state="unavailable"))
            return ""
        if isinstance(error, Unresponsive):
            self._transition(index, "unresponsive", now, str(error))
            self.sink.add_sample(GpuSample(gpu=index, t=now, state="unresponsive"))
            return ""
        if error is not None:
            self.sink.nvml_error("read_slow" if slow else "read_fast", type(error).__name__.lower())
            raise error
        if sample is None:
            raise RuntimeError(f"GPU {index}: the source read no sample")
        if view.state != "ok":
            self._transition(index, "ok", now, "")
        sample.state = "ok"
        view.fast = sample
        if slow:
            view.slow = sample
        self.sink.add_sample(sample)
        return ""

    def _transition(self, index: int, state: GpuState, now: float, detail: str) -> None:
        view = self.sink.gpus[index]
        if view.state == state:
            return
        previous, view.state = view.state, state
        severity: Severity = "info" if state == "ok" else "critical"
        log.warning("gpu_state", gpu=index, state=state, previous=previous, detail=detail)
        self.sink.add_event(
            GpuStateChanged(
                t=now,
                source="nvml",
                gpu=index,
                severity=severity,
                text=(detail or f"GPU {index} answers again (was {previous})")[:MAX_TEXT_CHARS],
                state=state,
                previous=previous,
            )
        )

    def close(self) -> None:
        super().close()
        for worker in self._workers.values():
            worker.stop()
        if self._opener is not None:
            self._opener.stop()


def _load_expected(path: Path | None) -> int:
    """The GPU count learned from this host's first inventory (0 when never learned)."""
    if path is None:
        return 0
    try:
        value = int(path.read_text().strip()[:8])
    except (OSError, ValueError):
        return 0
    return value if 0 < value <= 1024 else 0


def _save_expected(path: Path | None, count: int) -> None:
    if path is None:
        return
    try:
        path.write_text(f"{count}\n")
    except OSError as exc:
        log.warning("expected_gpus_save_failed", path=str(path), error=exc.strerror or str(exc))
