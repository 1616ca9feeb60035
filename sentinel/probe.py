"""In-process probe: send this rank's live collective progress to the local sentinel agent.

``sentinel.probe.start()`` in a training script starts a daemon thread that reduces the live Flight
Recorder's active entries to :class:`sentinel.fr.heads.FrHeads`, with the rank's step compute times
(:mod:`sentinel.fr.steps`), and sends it every 2 s as one unix datagram. It never blocks or breaks
training: a missing socket or full queue drops the snapshot and counts it. Importing it imports nothing
heavy; torch is touched only if the process already uses it. See docs/flight-recorder.md.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SOCKET = "/run/sentinel/probe.sock"
MAX_DATAGRAM = 60 * 1024
#: Full dumps (with entries) are costly under gloo, whose onlyActive filter keeps every entry; they are taken only to learn group names or detail a wait, at most this often.
FULL_DUMP_MIN_INTERVAL_S = 30.0

#: lone send/recv remembered as confirmed by a dump of every entry to be ops of their own (Probe._settle)
MAX_LONE_CHECKED = 4096

# The dump policy for the send/recv the probe cannot settle from active entries alone (Probe._settle_due).
# The probe says what it knows: such an op is reported at its true age with ``unconfirmed=True`` until a
# dump of every entry confirms it, and the aggregator's stuck detector (which owns its thresholds) counts no
# wait from it before then. When to take that dump is the probe's own latency choice:
#: a dump of every entry settles all unconfirmed lone ops at once when the oldest is this old (s): lone ops
#: of their own that complete sooner never cost one, and a really stuck op is confirmed by the first tick
#: where it is this old or the next one (Probe._settle_due says what that costs it)
SETTLE_AFTER_S = 2.0
#: and at most once per SETTLE_MIN_GAP_S (1.5 ticks of 2 s: every other tick in a pipeline that posts
#: one-op batches all the time, <= 20 a minute however late the ticks)
SETTLE_MIN_GAP_S = 3.0
#: an op that dump shows without a closing entry is confirmed as one of its own only when it is this old
#: (a dump taken between a batch's member and its endCoalescing, microseconds apart, confirms nothing)
CONFIRM_LONE_AFTER_S = 0.25
#: a group whose pg_status mixes counters, idle at its last dump with entries and whose status stands still
#: since, keeps those heads and is re-read this often: the status of such a group can stand still across a
#: new op (collective #k, then send #k: the same three values), and this bounds how long that op is unseen
MIXED_STILL_REFRESH_S = 10.0

#: how often the per-group counters are sampled between snapshots, to time each step's compute (the
#: status dump without entries is cheap; this keeps the step timing within a twentieth of a second)
SAMPLE_S = 0.05
#: the sample instants are random: each wait is uniform within SAMPLE_S x (1 +- SAMPLE_JITTER), SAMPLE_S on
#: average. A sampler of fixed period reads every step as a whole number of periods (the completion and the
#: next entry are each placed at the middle of the period they fell in), so a median over steps is a whole
#: number of periods too: a slightly slow rank reads like its peers, and identical ranks read a period
#: apart, by which way they happened to round. At random instants each step's error is continuous and symmetric
#: about zero, so a median over steps converges to the compute time itself (tests/fr/test_steps.py).
SAMPLE_JITTER = 0.5
#: while the step group's counters mix send/recv and collective work (NCCL, a pipeline that sends over the
#: default group), its step times come from a dump of every entry (sentinel.fr.steps.steps_from_entries),
#: taken at most this often: one dump gives every step its ring buffer holds (the latest MAX_STEPS travel),
#: and is costly enough to be taken only this often
STEP_ENTRIES_EVERY_S = 10.0

DumpFn = Callable[[], bytes]


@dataclass(slots=True)
class ProbeStats:
    """Counters the probe keeps (read them from the handle; nothing is logged from the training process)."""

    sent: int = 0
    dropped: int = 0  # socket missing/full or snapshot unusable
    errors: dict[str, int] = field(default_factory=dict)
    last_cpu_s: float = 0.0  # thread CPU time of the last snapshot (dump + reduce + encode + send)
    last_bytes: int = 0
    active_dumps: int = 0  # dumps of the active entries taken
    every_dumps: int = 0  # dumps of every entry taken (to settle lone send/recv)


class Probe:
    """A running probe; :func:`start` returns it. ``stop()`` ends the thread."""

    def __init__(
        self,
        interval_s: float,
        socket_path: str,
        dump_fn: DumpFn | None = None,
        *,
        status_fn: DumpFn | None = None,
        all_fn: DumpFn | None = None,
        sample_s: float = SAMPLE_S,
        sample_rng: random.Random | None = None,
    ) -> None:
        from sentinel.fr.reduce import BatchMemory
        from sentinel.fr.steps import StepClock

        self.interval_s = interval_s
        self.sample_s = min(sample_s, interval_s)
        self._sample_rng = sample_rng or random.Random()
        self.steps = StepClock()
        self.socket_path = socket_path
        self.stats = ProbeStats()
        self._dump_fn = dump_fn
        self._stop = threading.Event()
        self._known_groups: dict[int, tuple[str, str]] = {}
        # gloo: pg_id -> (op id, seq) of the newest collective seen (its pg_status counts ops; see reduce)
        self._op_map: dict[int, tuple[int, int]] = {}
        # NCCL: pg_id -> newest collective seq of groups seen to post send/recv (their pg_status mixes the
        # send/recv and collective counters; see sentinel.fr.reduce)
        self._p2p_groups: dict[int, int] = {}
        self._sock: socket.socket | None = None
        self._status_fn: DumpFn | None = status_fn
        # every entry, completed ones too (settles one-op batches); torch's only where the probe dumps torch's
        self._all_fn: DumpFn | None = all_fn
        self._torch_all = dump_fn is None and all_fn is None
        self._batches = BatchMemory()
        # lone scheduled send/recv a dump of every entry showed without a closing entry: ops of their own
        self._confirmed_lone: dict[tuple[str, int], None] = {}
        # the others the latest reduction left unsettled -> when they were created (unix s)
        self._unconfirmed: dict[tuple[str, int], float] = {}
        self._last_settle = -math.inf
        # the step group's status at the last dump of every entry that gave its steps (its counters mix)
        self._step_progress: tuple[int, int, int] | None = None
        self._step_seen: tuple[int, int, int] | None = None  # and as last read
        # mixed-counter groups: pg_id -> (enqueued, started, completed) of the last dump with entries, when
        self._mixed_seen: dict[int, tuple[tuple[int, int, int], float]] = {}
        self._mixed_heads: dict[str, Any] = {}  # their heads from it (name -> PgHead)
        self._last_full = 0.0
        self._waiting_since: dict[int, tuple[tuple[int, int], float]] = {}
        self._detailed: set[tuple[int, tuple[int, int]]] = set()  # waits already seen in a full dump
        self._unmapped_since: dict[int, tuple[tuple[int, int], float]] = {}
        self._thread = threading.Thread(target=self._run, name="sentinel-probe", daemon=True)
        self._identity = _identity()

    def start(self) -> Probe:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        if self._sock is not None:
            self._sock.close()

    def next_sample_wait(self) -> float:
        """Seconds until the next step-clock sample: random around ``sample_s`` (see SAMPLE_JITTER)."""
        return self.sample_s * self._sample_rng.uniform(1.0 - SAMPLE_JITTER, 1.0 + SAMPLE_JITTER)

    def _run(self) -> None:
        next_send = time.monotonic() + self.interval_s
        while not self._stop.wait(self.next_sample_wait()):
            self.sample()
            if time.monotonic() >= next_send:
                next_send += self.interval_s
                self.tick()

    def sample(self, now: float | None = None) -> None:
        """Feed the step clock one reading of the per-group counters (at ``now``, default the time). Never
        raises."""
        try:
            if self._status_fn is None:
                self._status_fn = _torch_status_fn()
                if self._status_fn is None:
                    return
            status = self._light_status()
            if status is not None:
                # groups whose counters mix send/recv and collective work (learnt from the entries)
                mixed = {str(pg_id) for pg_id in self._p2p_groups} if self._p2p_groups else ()
                self.steps.observe(time.time() if now is None else now, status, mixed)
        except Exception as exc:  # the probe must never break training
            self._count(type(exc).__name__)

    def tick(self) -> bool:
        """Take, reduce and send one snapshot; True when it was sent. Never raises."""
        start = time.thread_time()
        try:
            payload = self.snapshot()
            if payload is None:
                return False
            self.stats.last_bytes = len(payload)
            return self._send(payload)
        except Exception as exc:  # the probe must never break training
            self._count(type(exc).__name__)
            return False
        finally:
            self.stats.last_cpu_s = time.thread_time() - start

    def snapshot(self, now: float | None = None) -> bytes | None:
        """The encoded heads of this rank at ``now`` (default the time), or None when no flight recorder is
        available yet.

        At most one dump with entries per tick: of every entry when lone send/recv are due to be settled
        (:meth:`_settle_due`; it serves as the active one too), else of the active entries when
        :meth:`_needs_full` asks, else none (the status alone, and the last entries of groups whose mixed
        counters stand still)."""
        import msgspec

        now = time.time() if now is None else now
        if self._dump_fn is None and self._status_fn is None:
            self._status_fn = _torch_status_fn()
        status = self._light_status() if self._status_fn is not None else None
        wants_entries = status is None or self._needs_full(status, now)  # (its bookkeeping runs each tick)
        if status is not None:
            self._step_seen = self._step_group_progress(status)
        step_due = self._step_entries_due(now)
        every_fn = self._every_fn() if self._settle_due(now) or step_due else None
        if every_fn is None and status is not None and not wants_entries:
            unsettled = self._batches.unsettled
            heads = self._reduce({"pg_status": status, "entries": []}, now)
            self._batches.unsettled = unsettled  # nothing new seen: what the last entries left stands
            heads = self._with_still_mixed(heads, status, now)
        else:
            if every_fn is not None:
                data = _decode(every_fn())
                self.stats.every_dumps += 1
            else:
                dump_fn = self._dump_fn or _torch_dump_fn()
                if dump_fn is None:
                    self._count("no_flight_recorder")
                    return None
                self._dump_fn = dump_fn
                data = _decode(dump_fn())
                self.stats.active_dumps += 1
            self._last_full = now
            heads = self._reduce(data, now)
            self._step_seen = self._step_group_progress(data.get("pg_status")) or self._step_seen
            if every_fn is not None and int(self.steps.step_group) in self._p2p_groups:
                from sentinel.fr.steps import steps_from_entries

                self.steps.add(steps_from_entries(data.get("entries"), int(self.steps.step_group)))
                self._step_progress = self._step_seen
            self._settle(now, every=every_fn is not None)
            self._remember_mixed(data.get("pg_status"), heads, now)
        heads = self._with_unconfirmed_marked(heads)
        heads = msgspec.structs.replace(heads, steps=self.steps.recent())
        return encode_capped(self._with_observed_waits(heads, now))

    def _reduce(self, data: dict[str, Any], now: float) -> Any:
        from sentinel.fr.reduce import reduce_snapshot

        ident = self._identity
        return reduce_snapshot(
            data,
            rank=ident["rank"],
            now=now,
            known_groups=self._known_groups,
            op_map=self._op_map,
            job_id=ident["job_id"],
            world_size=ident["world_size"],
            local_rank=ident["local_rank"],
            pid=ident["pid"],
            batches=self._batches,
            p2p_groups=self._p2p_groups,
        )

    def _every_fn(self) -> DumpFn | None:
        """The dump of every entry (completed ones too), where there is one."""
        if self._all_fn is None and self._torch_all:
            self._all_fn = _torch_dump_fn(only_active=False)
        return self._all_fn

    def _settle_due(self, now: float) -> bool:
        """Whether this tick takes the dump of every entry that settles the lone send/recv left unconfirmed.

        The member of a completed batch of one reads exactly like a lone op still pending in an
        ``onlyActive`` snapshot (:class:`sentinel.fr.reduce.BatchMemory`); a dump of every entry holds its
        closing entry. Until then such an op is reported at its age marked ``unconfirmed``
        (:meth:`_with_unconfirmed_marked`), and the stuck detector counts no wait from it, whatever its
        config. The dump is taken when the oldest unconfirmed op is SETTLE_AFTER_S old and no dump of every
        entry was taken in the last SETTLE_MIN_GAP_S; it settles them all (one dump, not one per op).

        Why SETTLE_AFTER_S = 2 s. Lone ops of their own that complete sooner (p2p that is merely busy)
        leave the active entries before it and never cost a dump; in a pipeline that posts one-op batches
        all the time a lower value would not take more dumps (SETTLE_MIN_GAP_S bounds them) but a higher one
        would take fewer. At the detector's defaults a rank's own report of a wait counts from 2 s
        (OBSERVED_WAIT_FRACTION x min_wait_s = 0.5 x 4 s): an op confirmed by the tick where it is first
        2 s old is counted exactly when it would be if every tick read every entry.

        What it costs a really stuck op. It is confirmed at the tick where it is first SETTLE_AFTER_S old
        (2-4 s with ticks every 2 s), except when that tick comes less than SETTLE_MIN_GAP_S after the last
        such dump (the op was created around that dump: too young for it to confirm, or just after it):
        then at the next tick. A detector configured to count it sooner (min_wait_s below 4 s) counts it
        from that heads: at most one tick later than if every tick read every entry, whose first countable
        report of it comes at the tick before at the earliest (within SETTLE_MIN_GAP_S while ticks are late
        by under a second); at the defaults, not later. An op first listed at SETTLE_AFTER_S or older (its
        group's dumps skipped while its status stood still) is confirmed at that tick or the next. Bound:
        one dump of every entry per SETTLE_MIN_GAP_S (<= 20 a minute; 15 on time)."""
        if not self._unconfirmed or now - self._last_settle < SETTLE_MIN_GAP_S:
            return False
        return now - min(self._unconfirmed.values()) >= SETTLE_AFTER_S

    def _step_entries_due(self, now: float) -> bool:
        """Whether this tick takes a dump of every entry for the step times of a step group whose counters
        mix (its counters give none: sentinel.fr.steps): at most every STEP_ENTRIES_EVERY_S, counting the
        dumps of every entry taken to settle lone send/recv (they serve as well), and only when the step
        group's status as last read (this tick's, else the last dump's) moved since the last one that gave
        steps (a paused or stalled job completes no step: 30 min of a checkpoint pause would otherwise cost
        180 dumps of the whole buffer); unreadable, the time bound alone holds."""
        if (
            int(self.steps.step_group) not in self._p2p_groups
            or now - self._last_settle < STEP_ENTRIES_EVERY_S
        ):
            return False
        return self._step_seen is None or self._step_seen != self._step_progress

    def _step_group_progress(self, status: Any) -> tuple[int, int, int] | None:
        return _progress(status.get(self.steps.step_group)) if isinstance(status, dict) else None

    def _settle(self, now: float, *, every: bool) -> None:
        """After a reduction with entries: the lone ops it left unsettled are confirmed as ops of their own
        when a dump of every entry shows them without a closing entry (CONFIRM_LONE_AFTER_S old at least),
        and the rest are unconfirmed, with the time each was created."""
        unsettled = self._batches.unsettled
        confirmed = self._confirmed_lone
        if every:
            self._last_settle = now
            for batch, age in unsettled.items():
                if age >= CONFIRM_LONE_AFTER_S and batch not in confirmed:
                    if len(confirmed) >= MAX_LONE_CHECKED:
                        del confirmed[next(iter(confirmed))]
                    confirmed[batch] = None
        before = self._unconfirmed
        self._unconfirmed = {
            batch: min(before.get(batch, math.inf), now - age)
            for batch, age in unsettled.items()
            if batch not in confirmed
        }

    def _with_unconfirmed_marked(self, heads: Any) -> Any:
        """Unconfirmed lone send/recv marked ``unconfirmed`` at their age (see :meth:`_settle_due`); where no
        dump of every entry exists they are not marked (nothing could confirm them: marked, a really pending
        op would never be counted)."""
        import msgspec

        if not self._unconfirmed or self._every_fn() is None:
            return heads
        unconfirmed = self._unconfirmed
        replace = msgspec.structs.replace
        pgs = []
        for pg in heads.pgs:
            name = pg.pg_name
            flights = [
                replace(f, unconfirmed=True) if f.p2p and (name, f.seq) in unconfirmed else f
                for f in pg.in_flight
            ]
            changed = any(a is not b for a, b in zip(flights, pg.in_flight, strict=True))
            pgs.append(replace(pg, in_flight=flights) if changed else pg)
        return replace(heads, pgs=pgs)

    def _remember_mixed(self, status: Any, heads: Any, now: float) -> None:
        """The status and heads of each group whose counters mix and that had nothing in flight, as a dump
        with entries showed them.

        Only an idle group: a status that stands still does not show that an op listed in flight completed
        when its seq is the status's last completed value already (collective #k pending after send #k
        completed: #k's completion leaves 'completed k' as it was), so kept heads with an op in flight
        could show a completed op waiting, its age growing (a false stall). A group waiting is read every
        tick, as before: its job is stalled or about to be, not training."""
        self._mixed_seen = {}
        self._mixed_heads = {}
        if not self._p2p_groups or not isinstance(status, dict):
            return
        by_name = {pg.pg_name: pg for pg in heads.pgs}
        for pg_id, st in status.items():
            try:
                key = int(pg_id)
            except (TypeError, ValueError):
                continue
            progress = _progress(st)
            name = self._known_groups.get(key, ("", ""))[0]
            if (
                key in self._p2p_groups
                and progress is not None
                and name in by_name
                and not by_name[name].in_flight
            ):
                self._mixed_seen[key] = (progress, now)
                self._mixed_heads[name] = by_name[name]

    def _with_still_mixed(self, heads: Any, status: dict[str, Any] | None, now: float) -> Any:
        """A tick without entries: each group whose counters mix and whose status stands where the last
        dump with entries saw it, idle, keeps the heads those entries gave (its group ranks too); any other
        keeps what its status alone says (idle at the newest collective remembered: only behind)."""
        import msgspec

        if not self._mixed_heads or status is None:
            return heads
        still = {
            self._known_groups[key][0]
            for key, (progress, _) in self._mixed_seen.items()
            if key in self._known_groups and _progress(status.get(str(key))) == progress
        }
        pgs = []
        for pg in heads.pgs:
            kept = self._mixed_heads.get(pg.pg_name) if pg.pg_name in still else None
            pgs.append(pg if kept is None else kept)
        return msgspec.structs.replace(heads, pgs=pgs)

    def _light_status(self) -> dict[str, Any] | None:
        """pg_status only (no entries): microseconds even with a full ring buffer."""
        from sentinel.fr.safepickle import loads_plain

        assert self._status_fn is not None
        obj = loads_plain(self._status_fn(), source="live flight recorder")
        status = obj.get("pg_status") if isinstance(obj, dict) else None
        return status if isinstance(status, dict) else None

    def _needs_full(self, status: dict[str, Any], now: float) -> bool:
        """A dump of the active entries only to learn group names, for details of a wait that persists, or
        for a group whose counters mix when its status moved.

        A group that posts send/recv (known from its entries, or a last enqueued value below the last
        completed one, which only mixed counters give) has a status that counts send/recv work and
        collectives alike (:mod:`sentinel.fr.reduce`), so it can neither say that the group waits (an
        all_reduce #7 enqueued after send/recv #14 completed reads 7 < 14, no wait) nor which collective it
        is at; its active entries can (on NCCL only the pending ones). They are read at every tick, except
        while the group is idle (nothing in flight at the last dump with entries) and its status stands
        where that dump saw it: then it keeps those heads (:meth:`_with_still_mixed`) and is read again
        after MIXED_STILL_REFRESH_S (see :meth:`_remember_mixed` for why only an idle group)."""
        for pg_id, st in status.items():
            try:
                key = int(pg_id)
                progress = (int(st["last_enqueued_collective"]), int(st["last_completed_collective"]))
            except (KeyError, TypeError, ValueError):
                return True
            if key not in self._known_groups:
                if now - self._last_full >= FULL_DUMP_MIN_INTERVAL_S or self._last_full == 0.0:
                    return True
                continue  # (the groups after it still have their say)
            if key in self._p2p_groups:
                seen = self._mixed_seen.get(key)
                if seen is None or seen[0] != _progress(st) or now - seen[1] >= MIXED_STILL_REFRESH_S:
                    return True
                continue
            if progress[0] < progress[1]:
                return True
            since = self._waiting_since.get(key)
            if progress[0] > progress[1]:
                if since is None or since[0] != progress:
                    self._waiting_since[key] = (progress, now)
                elif now - since[1] >= self.interval_s and (
                    now - self._last_full >= FULL_DUMP_MIN_INTERVAL_S or (key, progress) not in self._detailed
                ):
                    # a wait that persists gets its op and entry details once, however recent the last full
                    # dump: stall evidence must name the collective (at most one extra dump per new wait)
                    if len(self._detailed) >= 64:
                        self._detailed.clear()
                    self._detailed.add((key, progress))
                    return True
            else:
                self._waiting_since.pop(key, None)
                learned = self._op_map.get(key)
                if learned is not None and learned[0] != progress[0]:
                    # gloo's op counter moved past the collective last mapped and now stands still (an
                    # idle or stuck rank): one full dump maps it exactly, once per position
                    since = self._unmapped_since.get(key)
                    if since is None or since[0] != progress:
                        self._unmapped_since[key] = (progress, now)
                    elif now - since[1] >= self.interval_s:
                        self._unmapped_since.pop(key, None)
                        return True
        return False

    def _with_observed_waits(self, heads: Any, now: float) -> Any:
        """Give groups that wait without entry details an in-flight entry aged by observation."""
        import msgspec

        from sentinel.fr.heads import InFlight

        names = {name: key for key, (name, _) in self._known_groups.items()}
        pgs = []
        for pg in heads.pgs:
            since = self._waiting_since.get(names.get(pg.pg_name, -1))
            if not pg.in_flight and pg.last_enqueued_seq > pg.last_completed_seq and since is not None:
                flight = InFlight(seq=pg.last_completed_seq + 1, op="unknown", age_s=now - since[1])
                pgs.append(msgspec.structs.replace(pg, in_flight=[flight]))
            else:
                pgs.append(pg)
        return msgspec.structs.replace(heads, pgs=pgs)

    def _send(self, payload: bytes) -> bool:
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        try:
            self._sock.sendto(payload, self.socket_path)
        except OSError as exc:
            self._count(type(exc).__name__)
            return False
        self.stats.sent += 1
        return True

    def _count(self, reason: str) -> None:
        self.stats.dropped += 1
        self.stats.errors[reason] = self.stats.errors.get(reason, 0) + 1


def encode_capped(heads: Any, limit: int = MAX_DATAGRAM) -> bytes:
    """msgpack of the heads, trimming the newest in-flight entries until it fits in ``limit`` bytes."""
    import msgspec

    from sentinel.fr.heads import MAX_IN_FLIGHT

    if any(len(pg.in_flight) > MAX_IN_FLIGHT for pg in heads.pgs):  # the agent refuses more: keep the oldest
        heads = msgspec.structs.replace(
            heads,
            pgs=[msgspec.structs.replace(pg, in_flight=pg.in_flight[:MAX_IN_FLIGHT]) for pg in heads.pgs],
        )
    data = msgspec.msgpack.encode(heads)
    if len(data) <= limit:
        return data
    pgs = list(heads.pgs)
    keep = max(len(pg.in_flight) for pg in pgs) if pgs else 0
    while keep > 0:
        keep //= 2
        trimmed = msgspec.structs.replace(
            heads, pgs=[msgspec.structs.replace(pg, in_flight=pg.in_flight[:keep]) for pg in pgs]
        )
        data = msgspec.msgpack.encode(trimmed)
        if len(data) <= limit:
            return data
    raise ValueError("heads do not fit in one datagram even without in-flight entries")


def _progress(st: Any) -> tuple[int, int, int] | None:
    """(last enqueued, started, completed) of one group's pg_status value, or None when unreadable."""
    try:
        return (
            int(st["last_enqueued_collective"]),
            int(st.get("last_started_collective", -1)),
            int(st["last_completed_collective"]),
        )
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def _decode(raw: bytes) -> dict[str, Any]:
    """A live dump, pickle (decoded without resolving any global) or JSON."""
    from sentinel.fr.safepickle import PICKLE_PROTO, loads_plain

    if not raw:
        return {}
    obj = loads_plain(raw, source="live flight recorder") if raw[0] == PICKLE_PROTO else json.loads(raw)
    return obj if isinstance(obj, dict) else {}


def _torch_dump_fn(only_active: bool = True) -> DumpFn | None:
    """The build's live FR dump with only active entries (or every entry), when torch is already in use.

    The pickle variant without stack traces is the cheapest (no symbolization, no JSON text); builds
    without it fall back to ``_dump_fr_trace_json`` / ``_dump_nccl_trace_json``.
    """
    if "torch" not in sys.modules:
        return None
    try:
        import torch
    except ImportError:
        return None
    c10d = getattr(torch._C, "_distributed_c10d", None)
    pickled: Callable[..., bytes] | None = getattr(c10d, "_dump_fr_trace", None)
    if pickled is not None:
        return _bind_active(pickled, only_active, includeStackTraces=False)
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        fn: Callable[..., bytes] | None = getattr(c10d, name, None)
        if fn is not None:
            return _bind_active(fn, only_active)
    return None


def _torch_status_fn() -> DumpFn | None:
    """torch's pickle dump without collectives: pg_config and pg_status only."""
    if "torch" not in sys.modules:
        return None
    import torch

    fn: Callable[..., bytes] | None = getattr(
        getattr(torch._C, "_distributed_c10d", None), "_dump_fr_trace", None
    )
    if fn is None:
        return None

    def status() -> bytes:
        return bytes(fn(includeCollectives=False, includeStackTraces=False, onlyActive=True))

    return status


def _bind_active(fn: Callable[..., bytes], only_active: bool, **extra: bool) -> DumpFn:
    def dump() -> bytes:
        return bytes(fn(includeCollectives=True, onlyActive=only_active, **extra))

    return dump


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _identity() -> dict[str, Any]:
    return {
        "rank": _env_int("RANK") or 0,
        "local_rank": _env_int("LOCAL_RANK"),
        "world_size": _env_int("WORLD_SIZE"),
        "job_id": os.environ.get("SENTINEL_JOB_ID")
        or os.environ.get("SLURM_JOB_ID")
        or os.environ.get("TORCHELASTIC_RUN_ID"),
        "pid": os.getpid(),
    }


_PROBE: Probe | None = None
_LOCK = threading.Lock()


def start(interval_s: float = 2.0, socket_path: str | None = None, *, dump_fn: DumpFn | None = None) -> Probe:
    """Start the probe thread once per process (later calls return the running one)."""
    global _PROBE  # noqa: PLW0603 - one probe per process
    with _LOCK:
        if _PROBE is None:
            path = socket_path or os.environ.get("SENTINEL_PROBE_SOCKET") or DEFAULT_SOCKET
            _PROBE = Probe(interval_s, path, dump_fn).start()
        return _PROBE
