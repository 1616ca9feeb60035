"""In-process probe: send this rank's live collective progress to the local sentinel agent.

One call in a training script::

    import sentinel.probe
    sentinel.probe.start()          # every 2 s, to $SENTINEL_PROBE_SOCKET or /run/sentinel/probe.sock

A daemon thread takes the live Flight Recorder with only the active entries
(``torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=True)``, or
``_dump_nccl_trace_json`` on builds that only have that), reduces it to :class:`sentinel.fr.heads.FrHeads`
with this rank's identity and its latest steps' compute times (:mod:`sentinel.fr.steps`, from the
per-group counters sampled every 50 ms), and sends it as one unix datagram (msgpack, at most 60 KiB: in-flight entries
are trimmed to fit). It never blocks or breaks training: a missing socket or a full queue drops the
snapshot and counts it, the next tick tries again. Importing this module imports nothing heavy; torch is
imported by the thread, and only if the process already uses it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SOCKET = "/run/sentinel/probe.sock"
MAX_DATAGRAM = 60 * 1024
#: Full dumps (with entries) cost ~15-40 ms at 2,000 entries under gloo, whose onlyActive filter keeps
#: everything; they are taken only to learn group names or detail a wait, at most this often.
FULL_DUMP_MIN_INTERVAL_S = 30.0

#: lone send/recv remembered as checked against a dump of every entry (see Probe._unsettled)
MAX_LONE_CHECKED = 4096

#: how often the per-group counters are sampled between snapshots, to time each step's compute (the
#: status dump without entries costs microseconds; 50 ms keeps the step timing within ~1/20 of a second)
SAMPLE_S = 0.05

DumpFn = Callable[[], bytes]


@dataclass(slots=True)
class ProbeStats:
    """Counters the probe keeps (read them from the handle; nothing is logged from the training process)."""

    sent: int = 0
    dropped: int = 0  # socket missing/full or snapshot unusable
    errors: dict[str, int] = field(default_factory=dict)
    last_cpu_s: float = 0.0  # thread CPU time of the last snapshot (dump + reduce + encode + send)
    last_bytes: int = 0


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
    ) -> None:
        from sentinel.fr.reduce import BatchMemory
        from sentinel.fr.steps import StepClock

        self.interval_s = interval_s
        self.sample_s = min(sample_s, interval_s)
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
        # lone scheduled send/recv a dump of every entry showed without a closing entry, when: checked again
        # only after FULL_DUMP_MIN_INTERVAL_S (a dump taken mid-batch, before its endCoalescing)
        self._lone_checked: dict[tuple[str, int], float] = {}
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

    def _run(self) -> None:
        next_send = time.monotonic() + self.interval_s
        while not self._stop.wait(self.sample_s):
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
                self.steps.observe(time.time() if now is None else now, status)
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
        available yet."""
        import msgspec

        now = time.time() if now is None else now
        if self._dump_fn is None and self._status_fn is None:
            self._status_fn = _torch_status_fn()
        status = self._light_status() if self._status_fn is not None else None
        if status is not None and not self._needs_full(status, now):
            data: dict[str, Any] = {"pg_status": status, "entries": []}
        else:
            dump_fn = self._dump_fn or _torch_dump_fn()
            if dump_fn is None:
                self._count("no_flight_recorder")
                return None
            self._dump_fn = dump_fn
            data = _decode(dump_fn())
            self._last_full = now
        heads = self._reduce(data, now)
        if self._unsettled(now):
            all_fn = self._all_fn or (_torch_dump_fn(only_active=False) if self._torch_all else None)
            if all_fn is not None:
                self._all_fn = all_fn
                heads = self._reduce(_decode(all_fn()), now)
                for batch in self._batches.unsettled:  # no closing entry even there: an op of its own
                    self._lone_checked[batch] = now
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

    def _unsettled(self, now: float) -> bool:
        """Whether the last reduction left a lone scheduled send/recv not checked in the last
        FULL_DUMP_MIN_INTERVAL_S: the member of a completed batch of one reads exactly like a lone op still
        pending in an ``onlyActive`` snapshot (:class:`sentinel.fr.reduce.BatchMemory`), and a dump of every
        entry holds its closing entry. One such dump per new op; MAX_LONE_CHECKED remembered."""
        if len(self._lone_checked) >= MAX_LONE_CHECKED:
            self._lone_checked = {
                b: t for b, t in self._lone_checked.items() if now - t < FULL_DUMP_MIN_INTERVAL_S
            }
            if len(self._lone_checked) >= MAX_LONE_CHECKED:
                self._lone_checked.clear()
        checked = self._lone_checked
        return any(
            b not in checked or now - checked[b] >= FULL_DUMP_MIN_INTERVAL_S for b in self._batches.unsettled
        )

    def _light_status(self) -> dict[str, Any] | None:
        """pg_status only (no entries): microseconds even with a full ring buffer."""
        from sentinel.fr.safepickle import loads_plain

        assert self._status_fn is not None
        obj = loads_plain(self._status_fn(), source="live flight recorder")
        status = obj.get("pg_status") if isinstance(obj, dict) else None
        return status if isinstance(status, dict) else None

    def _needs_full(self, status: dict[str, Any], now: float) -> bool:
        """A full (costly) dump only to learn group names, or for details of a wait that persists.

        A group that posts send/recv (known from its entries, or a last enqueued value below the last
        completed one, which only mixed counters give) gets an ``onlyActive`` dump every tick: NCCL's status
        there counts send/recv work and collectives alike (:mod:`sentinel.fr.reduce`), so it can neither say
        that the group waits (an all_reduce #7 enqueued after send/recv #14 completed reads 7 < 14, no wait)
        nor which collective it is at; the active entries can, and on NCCL they are only the pending ones."""
        for pg_id, st in status.items():
            try:
                key = int(pg_id)
                progress = (int(st["last_enqueued_collective"]), int(st["last_completed_collective"]))
            except (KeyError, TypeError, ValueError):
                return True
            if key not in self._known_groups:
                return now - self._last_full >= FULL_DUMP_MIN_INTERVAL_S or self._last_full == 0.0
            if key in self._p2p_groups or progress[0] < progress[1]:
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
