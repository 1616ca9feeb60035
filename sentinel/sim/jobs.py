"""A simulated data-parallel training job: ranks loop compute → tensor-parallel allreduce → world allreduce.

The model is closed-form per iteration, so a 1,024-rank job costs O(faulty ranks) per iteration instead of
O(ranks): healthy ranks finish compute within a known noise band, and only ranks touched by a fault get
their own timing. From that timeline any rank's flight-recorder heads can be read at any instant — what
``sentinel.probe`` would report from inside the process.

Semantics (contract section 4): a collective completes only when every member has entered it; a hung rank
stops entering; a dead rank (GPU lost, fatal Xid) never completes what it was part of; a straggler computes
``slowdown`` times longer; a throttled GPU computes max_clock/clock times longer; an NCCL network error stalls
the world collective in flight with every rank inside it.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from sentinel.fr.heads import FrHeads, InFlight, PgHead, StepTime

INF = math.inf
_NOISE_SIZE = 4096
HEALTHY_SPREAD = 0.02  # healthy ranks finish compute within +2% of the iteration's base time
STEPS_IN_HEADS = 4  # completed steps' compute times each heads carries (heads every 2 s, steps ~1 s)


@dataclass
class RankSim:
    """One rank's fault-relevant state; healthy ranks never leave the defaults."""

    rank: int
    host: int
    gpu: int
    factor: float = 1.0  # compute-time multiplier (straggler, thermal throttle)
    hang_at: float = INF  # stops entering collectives from then on
    dead_at: float = INF  # process gone from then on (no heads, no procs)
    net_error_at: float = INF  # its NCCL network transport fails from then on
    link_down_at: float = INF  # the port its GPU's traffic uses is down: its collectives stall, NCCL silent
    link_factor: float = 1.0  # the port its GPU's traffic uses carries it this many times slower

    @property
    def modified(self) -> bool:
        return (
            self.factor != 1.0
            or self.hang_at < INF
            or self.dead_at < INF
            or self.net_error_at < INF
            or self.link_down_at < INF
            or self.link_factor != 1.0
        )


@dataclass
class Iteration:
    k: int
    start: float
    base: float  # this iteration's healthy compute time (job-wide jitter applied)
    tp_done: dict[int, float] = field(default_factory=dict)  # group → completion (only modified groups)
    tp_base: dict[int, float] = field(default_factory=dict)  # groups delayed by healthy jitter or a pause
    tp_done_healthy: float = 0.0
    world_done: float = INF
    world_stalled_by_net: bool = False
    enter: list[float] | None = None  # healthy ranks' entry times, computed once per iteration
    #: what heads repeat, made once per iteration: healthy ranks' step times, groups' heads out of flight
    steps: dict[int, StepTime] = field(default_factory=dict)
    idle_heads: dict[tuple[int, bool, bool], PgHead] = field(default_factory=dict)


class JobSim:
    """Timeline of one job; ``advance(t)`` moves it forward, ``heads(rank, t)`` reads a rank's progress."""

    def __init__(
        self,
        job_id: str,
        ranks: list[RankSim],
        *,
        compute_s: float,
        tp: int,
        start_s: float,
        seed: int,
        jitter: float = 0.0,
        pause_every_s: float = 0.0,
        pause_s: float = 2.5,
        comm_s: float | None = None,
    ) -> None:
        self.job_id = job_id
        self.start_s = start_s
        self.jitter = jitter
        self.pause_s = pause_s
        # chance that a rank pauses (GC, data loader, checkpoint shard) in any one iteration
        self.pause_p = min(1.0, compute_s / pause_every_s) if pause_every_s > 0 else 0.0
        self.ranks = ranks
        self.world_size = len(ranks)
        self.compute_s = compute_s
        self.tp = tp
        self.groups = (self.world_size + tp - 1) // tp
        self.comm_tp = 0.004 + 0.001 * tp
        self.comm_world = comm_s if comm_s is not None else 0.02 + 0.004 * math.log2(max(2, self.world_size))
        rng = random.Random(f"{seed}:{job_id}")
        self._noise = [rng.random() for _ in range(_NOISE_SIZE)]
        self._pause_noise = [rng.random() for _ in range(_NOISE_SIZE)]
        self._jitter = [1.0 + 0.03 * (2 * rng.random() - 1) for _ in range(_NOISE_SIZE)]
        self.modified: dict[int, RankSim] = {}
        self.tp_members = [
            list(range(g * tp, min((g + 1) * tp, self.world_size))) for g in range(self.groups)
        ]
        self.history: deque[Iteration] = deque(maxlen=STEPS_IN_HEADS)  # the latest completed iterations
        self.it = self._plan(1, start_s)
        self.tp_pg = [f"{job_id}:tp{g}" for g in range(self.groups)]
        self.world_members = list(range(self.world_size))

    # -- timeline -------------------------------------------------------------------------------------

    def _eps(self, rank: int, k: int) -> float:
        u = self._noise[(rank * 2654435761 + k * 40503) % _NOISE_SIZE]
        return u * HEALTHY_SPREAD + self.jitter * (2.0 * u - 1.0)

    def _pause(self, rank: int, k: int) -> float:
        """Seconds ``rank`` stops in iteration ``k`` on top of its compute (0 for most iterations)."""
        if not self.pause_p:
            return 0.0
        v = self._pause_noise[(rank * 40503 + k * 2654435761 + 7) % _NOISE_SIZE]
        if v >= self.pause_p:
            return 0.0
        return self.pause_s * (0.8 + 0.4 * v / self.pause_p)

    def enter_tp(self, rank: int, it: Iteration | None = None) -> float:
        """When ``rank`` enters its tensor-parallel collective in the current iteration (INF: never)."""
        it = it or self.it
        if it.enter is not None and rank not in self.modified:
            return it.enter[rank]
        r = self.ranks[rank]
        t = it.start + it.base * (1.0 + self._eps(rank, it.k)) * r.factor + self._pause(rank, it.k)
        if t >= r.hang_at or t >= r.dead_at:
            return INF
        return t

    def _plan(self, k: int, start: float) -> Iteration:
        base = self.compute_s * self._jitter[k % _NOISE_SIZE]
        it = Iteration(k=k, start=start, base=base)
        it.tp_done_healthy = start + base * (1.0 + HEALTHY_SPREAD) + self.comm_tp
        noise, size, spread, jitter = self._noise, _NOISE_SIZE, HEALTHY_SPREAD, self.jitter
        if jitter:
            it.enter = [
                start
                + base
                * (
                    1.0
                    + (u := noise[(rank * 2654435761 + k * 40503) % size]) * spread
                    + jitter * (2.0 * u - 1.0)
                )
                for rank in range(self.world_size)
            ]
            it.tp_done_healthy = start + base * (1.0 + spread + jitter) + self.comm_tp
        else:
            it.enter = [
                start + base * (1.0 + noise[(rank * 2654435761 + k * 40503) % size] * spread)
                for rank in range(self.world_size)
            ]
        if self.pause_p:
            enter = it.enter
            for rank in range(self.world_size):
                pause = self._pause(rank, k)
                if pause:
                    enter[rank] += pause
                    g = rank // self.tp
                    done = enter[rank] + self.comm_tp
                    it.tp_base[g] = max(it.tp_base.get(g, it.tp_done_healthy), done)
        self._complete(it)
        return it

    def _complete(self, it: Iteration) -> None:
        it.tp_done = dict(it.tp_base)
        for rank, r in self.modified.items():
            g = rank // self.tp
            done = it.tp_done.get(g, it.tp_done_healthy)
            entered = self.enter_tp(rank, it)
            done = max(done, entered + self.comm_tp)
            if r.dead_at < done:
                done = INF
            it.tp_done[g] = done
        latest = max([it.tp_done_healthy, *it.tp_done.values()])
        # the data-parallel collective crosses every rank's link: it runs at the pace of the slowest
        world = latest + self.comm_world * max([1.0, *(r.link_factor for r in self.modified.values())])
        it.world_stalled_by_net = False
        for r in self.modified.values():
            entry = it.tp_done.get(r.rank // self.tp, it.tp_done_healthy)
            if entry >= r.hang_at or r.dead_at < world:
                world = INF
            if r.net_error_at < world or r.link_down_at < world:
                world = INF
                it.world_stalled_by_net = True
        it.world_done = world

    def touch(self, rank: int) -> None:
        """A fault changed ``rank``: re-plan the iteration in flight (its past is unchanged by construction)."""
        r = self.ranks[rank]
        if r.modified:
            self.modified[rank] = r
        else:
            self.modified.pop(rank, None)
        self._complete(self.it)

    def advance(self, t: float) -> None:
        while self.it.world_done <= t:
            self.history.append(self.it)
            self.it = self._plan(self.it.k + 1, self.it.world_done)

    @property
    def stalled(self) -> bool:
        return self.it.world_done == INF

    # -- what a rank looks like at time t -------------------------------------------------------------

    def tp_done(self, rank: int) -> float:
        return self.it.tp_done.get(rank // self.tp, self.it.tp_done_healthy)

    def activity(self, rank: int, t: float) -> str:
        """compute | wait | hung | dead | done (between iterations): drives the GPU's utilisation."""
        r = self.ranks[rank]
        if t >= r.dead_at:
            return "dead"
        e = self.enter_tp(rank)
        if e == INF:
            return "hung" if t >= r.hang_at else "compute"
        return "compute" if t < e else "wait"

    def load(self, rank: int, t: float) -> str:
        """busy | hung | dead: the GPU's operating point (:meth:`activity` with compute and wait as one)."""
        if rank not in self.modified:  # a healthy rank computes or waits, always
            return "busy"
        activity = self.activity(rank, t)
        return "busy" if activity in ("compute", "wait") else activity

    def heads(self, rank: int, t: float, pid: int | None = None) -> FrHeads | None:
        """The rank's flight-recorder heads at ``t`` as its probe sends them (no host or GPU: the agent fills
        those in); None once its process is gone."""
        r = self.ranks[rank]
        if t >= r.dead_at:
            return None
        it = self.it
        k = it.k
        pgs: list[PgHead] = []
        e = self.enter_tp(rank)
        tp_done = self.tp_done(rank)
        if self.tp > 1:
            g = rank // self.tp
            entered = t >= e
            done = t >= tp_done
            if entered and not done:
                pgs.append(
                    self._pg_head(
                        g, k, entered, done, [InFlight(seq=k, op="allreduce", age_s=t - e, state="started")]
                    )
                )
            else:
                pgs.append(self._idle_head(g, k, entered, done))
            world_entry = tp_done
        else:
            world_entry = e + self.comm_tp if e < INF else INF
        if world_entry >= r.hang_at:
            world_entry = INF
        entered_w = t >= world_entry
        done_w = t >= it.world_done
        if entered_w and not done_w:
            flight_w = [InFlight(seq=k, op="allreduce", age_s=t - world_entry, state="started")]
            pgs.append(self._pg_head(-1, k, entered_w, done_w, flight_w))
        else:
            pgs.append(self._idle_head(-1, k, entered_w, done_w))
        steps = []
        for past in self.history:
            step = self._step(rank, past)
            if step is not None:
                steps.append(step)
        if e <= t:
            step = self._step(rank, it)
            if step is not None:
                steps.append(step)
        return FrHeads(
            rank=rank,
            t=t,
            job_id=self.job_id,
            world_size=self.world_size,
            local_rank=r.gpu,
            pid=pid,
            pgs=pgs,
            steps=steps[-STEPS_IN_HEADS:],
        )

    def _step(self, rank: int, it: Iteration) -> StepTime | None:
        """How long ``rank`` computed before entering iteration ``it``'s collective (None: it never did);
        a healthy rank's is made once per iteration."""
        if it.enter is not None and rank not in self.modified:
            step = it.steps.get(rank)
            if step is None:
                step = it.steps[rank] = StepTime(seq=it.k, compute_s=it.enter[rank] - it.start)
            return step
        entered = self.enter_tp(rank, it)
        return StepTime(seq=it.k, compute_s=entered - it.start) if entered < INF else None

    def _pg_head(self, g: int, k: int, entered: bool, done: bool, in_flight: list[InFlight]) -> PgHead:
        """Tensor-parallel group ``g``'s head (-1: the world group) in iteration ``k``."""
        world = g < 0
        return PgHead(
            pg_name="0" if world else self.tp_pg[g],
            pg_desc="default_pg" if world else "tensor_parallel",
            ranks=None if world else self.tp_members[g],
            last_enqueued_seq=k if entered else k - 1,
            last_started_seq=k if entered else k - 1,
            last_completed_seq=k if done else k - 1,
            in_flight=in_flight,
        )

    def _idle_head(self, g: int, k: int, entered: bool, done: bool) -> PgHead:
        """:meth:`_pg_head` with nothing in flight: the same for every member, made once per iteration."""
        idle = self.it.idle_heads
        key = (g, entered, done)
        head = idle.get(key)
        if head is None:
            head = idle[key] = self._pg_head(g, k, entered, done, [])
        return head
