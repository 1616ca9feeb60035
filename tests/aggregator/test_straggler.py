"""The straggler detector on ranks' own compute times per step (heads ``steps``), through the engine.

Every rank sends heads each 2 s with its latest steps' compute times; the tests drive a 32-rank job (4 hosts
x 8 GPUs, tensor-parallel groups = hosts) on a virtual clock with ±20% jitter per step.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sentinel.aggregator.clock import RATE_KNOWN_AFTER_S
from sentinel.aggregator.engine import Engine
from sentinel.aggregator.state import HostView
from sentinel.aggregator.store import BuiltinsHolder, StateStore
from sentinel.fr.heads import FrHeads, PgHead, StepTime
from sentinel.wire import Batch, ProcInfo
from tests.aggregator.helpers import hello, sample, straggler_of

HOSTS, GPUS, STEP_S = 4, 8, 0.8


class Job:
    """A 32-rank job whose ranks report step compute times; ``slow`` maps rank → compute multiplier."""

    def __init__(
        self,
        *,
        known_gpus: bool = True,
        seed: int = 1,
        clock_rate: dict[str, float] | None = None,
        clock_offset: dict[str, float] | None = None,
        hosts: int = HOSTS,
    ) -> None:
        self.engine = Engine()
        self.hosts = hosts
        # odd host clocks: a rate scales the compute times a host measures, an offset shifts its timestamps
        self.clock_rate = clock_rate or {}
        self.clock_offset = clock_offset or {}
        self.rng = random.Random(seed)
        self.views: dict[str, HostView] = {}
        self.seq = 0
        self.step = 0
        self.known_gpus = known_gpus
        self.paused: dict[int, float] = {}
        self.procs_sent: set[str] = set()  # hosts whose process map this engine has (agents send it once)
        for h in range(hosts):
            name = f"h{h}"
            self.views[name] = self.engine.hello(hello(name, GPUS), 0.0)

    def run(self, t0: float, t1: float, slow: dict[int, float]) -> list[tuple[float, str | None, int | None]]:
        """Advance from ``t0`` to ``t1`` (2 s heads, 1 s ticks); returns straggler verdicts as they open."""
        opened: list[tuple[float, str | None, int | None]] = []
        self.engine.listeners.append(
            lambda c: (
                opened.append((c.verdict.opened_at, c.verdict.host, c.verdict.rank))
                if c.what == "opened" and c.verdict.kind == "straggler"
                else None
            )
        )
        t = t0
        while t < t1:
            t += 1.0
            if int(t) % 2 == 0:
                self._heads(t, slow)
            self.engine.tick(t)
        self.engine.listeners.pop()
        return opened

    def _heads(self, t: float, slow: dict[int, float]) -> None:
        first = self.step
        self.step += 2  # ~2 steps per 2 s
        for h, (name, view) in enumerate(self.views.items()):
            rate = self.clock_rate.get(name, 1.0)
            local_t = t * rate + self.clock_offset.get(name, 0.0)  # the host's own clock
            heads = []
            procs = []
            for g in range(GPUS):
                rank = h * GPUS + g
                steps = []
                for k in range(first, self.step):
                    compute = STEP_S * (1.0 + 0.2 * (2 * self.rng.random() - 1)) * slow.get(rank, 1.0)
                    if self.rng.random() < 0.03:  # an occasional 2-3 s pause (GC, data loader)
                        compute += 2.0 + self.rng.random()
                    steps.append(StepTime(seq=k, compute_s=compute * rate))
                gpu = g if self.known_gpus else None
                heads.append(
                    FrHeads(
                        rank=rank,
                        t=local_t,
                        job_id="j",
                        world_size=self.hosts * GPUS,
                        gpu=gpu,
                        pgs=[PgHead(pg_name="0", pg_desc="default_pg", last_completed_seq=self.step)],
                        steps=steps,
                    )
                )
                procs.append(
                    ProcInfo(gpu=g, pid=100 + g, job_id="j", rank=rank, world_size=self.hosts * GPUS)
                )
            batch = Batch(
                seq=self.seq,
                t=local_t,
                samples=[sample(i, local_t) for i in range(GPUS)],
                heads=heads,
                procs=procs if self.known_gpus and name not in self.procs_sent else None,
            )
            self.seq += 1
            self.procs_sent.add(name)
            self.engine.ingest(view, batch, t)


def test_a_1_2x_straggler_is_named_within_60_s_and_its_tensor_parallel_peers_never() -> None:
    job = Job()
    assert job.run(0.0, 120.0, {}) == []  # ±20% jitter and 2-3 s pauses: nothing
    opened = job.run(120.0, 240.0, {13: 1.2})
    assert [(host, rank) for _, host, rank in opened] == [("h1", 13)]
    assert opened[0][0] - 120.0 <= 60.0
    (verdict,) = job.engine.book.open.values()
    assert verdict.gpu == 5 and verdict.reason == "unknown"
    # the measured lateness is the truth: 1.2 x 0.8 s = 160 ms late per step (median of jittered steps)
    judged = job.engine.rank_judgement("j", 13)
    assert judged is not None and 0.12 <= judged.median_s - judged.job_median_s <= 0.2
    assert "ms late per step" in verdict.evidence[0]


def test_a_1_2x_straggler_in_a_128_gpu_job_is_named_within_60_s_alone() -> None:
    job = Job(hosts=16, seed=7)
    assert job.run(0.0, 120.0, {}) == []  # 128 ranks, ±20% jitter and 2-3 s pauses: nothing
    opened = job.run(120.0, 240.0, {77: 1.2})
    assert [(host, rank) for _, host, rank in opened] == [("h9", 77)]
    assert opened[0][0] - 120.0 <= 60.0


def test_a_whole_slow_host_is_one_host_verdict_not_eight() -> None:
    job = Job()
    job.run(0.0, 60.0, {})
    opened = job.run(60.0, 180.0, dict.fromkeys(range(16, 24), 1.3))
    assert [(host, rank) for _, host, rank in opened] == [("h2", None)]
    (verdict,) = job.engine.book.open.values()
    assert verdict.reason == "slow_host" and verdict.gpu is None and verdict.job == "j"
    assert "of 8 GPUs of h2 are slow together" in verdict.evidence[0]


def test_a_rank_whose_gpu_is_unknown_is_still_judged() -> None:
    job = Job(known_gpus=False)
    job.run(0.0, 60.0, {})
    opened = job.run(60.0, 180.0, {6: 1.5})
    assert [rank for _, _, rank in opened] == [6]
    (verdict,) = job.engine.book.open.values()
    assert verdict.gpu is None and verdict.key == ("straggler", "rank", "j", "6")
    assert any("GPU is unknown" in e for e in verdict.evidence)


def test_the_verdict_closes_when_the_rank_recovers() -> None:
    job = Job()
    job.run(0.0, 150.0, {3: 1.5})
    assert len(job.engine.book.open) == 1
    job.run(150.0, 300.0, {})
    assert job.engine.book.open == {}


@pytest.mark.parametrize(
    ("rate", "offset_s"),
    [(0.5, 0.0), (0.5, 3600.0), (2.0, -3600.0), (0.25, 900.0)],
    ids=["slow-clock", "slow-clock-ahead", "fast-clock-behind", "very-slow-clock-ahead"],
)
def test_a_minority_of_hosts_with_odd_clocks_cannot_make_honest_gpus_stragglers(
    rate: float, offset_s: float
) -> None:
    """One host of four whose clock runs at ``rate`` and is ``offset_s`` off: its ranks report compute
    times scaled by the rate (a slow clock makes them look fast, which drags a mean down and would make
    every honest rank look late), timestamps from the wrong hour. The median/MAD yardstick must not move
    enough to name any rank of the three honest hosts, with or without a real straggler among them."""
    odd = "h3"
    job = Job(clock_rate={odd: rate}, clock_offset={odd: offset_s})
    opened = job.run(0.0, 240.0, {})
    assert [(host, rank) for _, host, rank in opened if host != odd] == []
    # and a real 1.3x straggler on an honest host is still the one named
    opened = job.run(240.0, 420.0, {13: 1.3})
    assert [(host, rank) for _, host, rank in opened if host != odd] == [("h1", 13)]
    honest_verdicts = [v for v in job.engine.book.open.values() if v.host != odd]
    assert [(v.host, v.rank) for v in honest_verdicts] == [("h1", 13)]


@pytest.mark.parametrize(
    ("rate", "offset_s"),
    [(2.0, 0.0), (2.0, -3600.0), (1.5, 120.0), (1.0, -86400.0), (1.0, 250.0)],
    ids=["2x-fast", "2x-fast-behind", "1.5x-fast-ahead", "a-day-behind", "minutes-ahead"],
)
def test_a_host_with_a_fast_or_far_off_clock_is_reported_as_clock_skew_not_as_slow(
    rate: float, offset_s: float
) -> None:
    """Its ranks measure their steps on its clock: at 2x every step looks twice as long. Its skew is measured
    from its batches' stamps and reported (rate, offset), and its ranks are not judged by compute time, so no
    straggler or slow-host verdict names it; a real slow host next to it is still named."""
    odd = "h3"
    job = Job(clock_rate={odd: rate}, clock_offset={odd: offset_s})
    opened = job.run(0.0, 240.0, {})
    assert opened == []
    clock = job.engine.fleet.hosts[odd].clock
    assert clock.rate is not None and abs(clock.rate - rate) < 0.01
    assert clock.offset_s is not None
    # the offset at the last window: the host's clock minus the aggregator's there (rate included)
    expected = 236.0 * (rate - 1.0) + offset_s
    assert abs(clock.offset_s - expected) <= 10.0 * abs(rate - 1.0) + 0.01
    honest = job.engine.fleet.hosts["h0"].clock
    assert honest.rate == pytest.approx(1.0) and honest.offset_s == pytest.approx(0.0)
    # a real slow host among the honest ones is still one host verdict
    opened = job.run(240.0, 420.0, dict.fromkeys(range(8, 16), 1.3))
    assert [(host, rank) for _, host, rank in opened] == [("h1", None)]
    assert not any(v.host == odd for v in job.engine.book.open.values())


def test_the_clock_skew_is_exported_per_host() -> None:
    from prometheus_client import CollectorRegistry

    from sentinel.aggregator.metrics import AggregatorMetrics

    job = Job(clock_rate={"h3": 2.0})
    registry = CollectorRegistry()
    metrics = AggregatorMetrics("default", registry)
    metrics.attach(job.engine, lambda: 0)
    job.run(0.0, 60.0, {})
    rate = registry.get_sample_value("sentinel_host_clock_rate", {"cluster": "default", "host": "h3"})
    assert rate == pytest.approx(2.0, abs=0.01)
    assert registry.get_sample_value("sentinel_host_clock_rate", {"cluster": "default", "host": "h0"}) == 1.0
    offset = registry.get_sample_value(
        "sentinel_host_clock_offset_seconds", {"cluster": "default", "host": "h3"}
    )
    assert offset is not None and offset > 0


def _restart(job: Job, state_dir: Path | None, now: float) -> None:
    """Persist the detectors' memory through the real state store, then a new engine restores it (a restart:
    the fleet's live view — heads, steps, jobs, host clocks — is gone and comes back only with the agents'
    next batches). ``state_dir`` None: a restart without a state store (nothing remembered)."""
    if state_dir is not None:
        old = StateStore(state_dir)
        old.register(BuiltinsHolder("detectors", dict(job.engine.detectors)), now)
        old.flush(full=True)
        old.close()
    job.engine = Engine()
    if state_dir is not None:
        new = StateStore(state_dir)
        restored = new.register(BuiltinsHolder("detectors", dict(job.engine.detectors)), now)
        assert restored == len(job.engine.detectors)
        new.close()
    for name in list(job.views):
        job.views[name] = job.engine.hello(hello(name, GPUS), now)
    job.procs_sent.clear()  # a new connection: the agents send their process maps again


def test_a_straggler_in_progress_survives_an_aggregator_restart(tmp_path: Path) -> None:
    straight = Job()
    straight.run(0.0, 120.0, {})
    ((opened_at, _, _),) = straight.run(120.0, 240.0, {13: 1.2})
    restart_at = opened_at - 3.0
    forgetful = Job()  # the same run, restarted without a state store
    forgetful.run(0.0, 120.0, {})
    forgetful.run(120.0, restart_at, {13: 1.2})
    _restart(forgetful, None, restart_at)
    ((forgot_at, _, _),) = forgetful.run(restart_at, restart_at + 120.0, {13: 1.2})
    job = Job()
    job.run(0.0, 120.0, {})
    assert job.run(120.0, restart_at, {13: 1.2}) == []
    (key,) = straggler_of(job.engine).streaks  # the straggling rank's GPU, h1/5, and nothing else
    assert key == ("straggler", "h1", "5")
    streak = straggler_of(job.engine).streaks[key]
    assert streak.hits >= 1  # the straggler is on its way to a verdict
    steps_before = list(straggler_of(job.engine).steps["j"][13].compute)
    _restart(job, tmp_path, restart_at)
    restored = straggler_of(job.engine)
    assert restored.streaks[key].hits == streak.hits  # its streak, not started over
    assert list(restored.steps["j"][13].compute) == steps_before  # its step history
    opened = job.run(restart_at, restart_at + 120.0, {13: 1.2})
    # named again as soon as the hosts' clock rates are measured again (ranks are judged by compute time
    # only on a host whose clock is known), its streak's remaining evaluation later, and before a restart
    # that forgot everything would name it
    assert [(host, rank) for _, host, rank in opened] == [("h1", 13)]
    cfg = job.engine.config.detect.straggler
    assert opened[0][0] <= restart_at + RATE_KNOWN_AFTER_S + 2 * cfg.eval_interval_s
    assert opened[0][0] < forgot_at
    # the heads after the restart still carry steps folded in before it: none of them is counted twice
    history = restored.steps["j"][13]
    assert history.last_seq == job.step - 1 and len(history.compute) <= history.compute.maxlen  # type: ignore[operator]


def test_restored_memory_of_a_job_that_never_comes_back_is_forgotten(tmp_path: Path) -> None:
    job = Job()
    job.run(0.0, 60.0, {})
    _restart(job, tmp_path, 60.0)
    assert "j" in straggler_of(job.engine).steps
    engine = job.engine
    for t in range(61, 400):  # the job's agents never send again
        engine.tick(float(t))
    assert "j" not in straggler_of(engine).steps


def test_memory_of_another_shape_is_dropped_not_fatal() -> None:
    engine = Engine()
    straggler_of(engine).restore({"steps": {"j": {"0": [1.0, 2.0]}}, "streaks": [[["a"], "x", 0]]})
    assert straggler_of(engine).steps == {} and straggler_of(engine).streaks == {}


def test_a_host_claiming_64_fast_gpus_makes_no_honest_host_slow() -> None:
    """The SM-clock median behind slow_host: five honest 8-GPU hosts at 1980 MHz, one claiming 64 GPUs at
    2600 MHz. Each host is one vote, so the median is the honest hosts' clock and none of them is slow."""
    engine = Engine()
    views = {f"h{i}": engine.hello(hello(f"h{i}", 8), 0.0) for i in range(5)}
    views["liar"] = engine.hello(hello("liar", 64), 0.0)
    for second in range(60):
        t = float(second)
        for name, view in views.items():
            gpus, clock = (64, 2600.0) if name == "liar" else (8, 1980.0)
            samples = [sample(i, t, sm_clock_mhz=clock, sm_clock_max_mhz=clock) for i in range(gpus)]
            engine.ingest(view, Batch(seq=second, t=t, samples=samples), t)
        engine.tick(t)
    assert [(v.host, v.reason) for v in engine.book.open.values() if v.kind == "straggler"] == []
