"""Port history: readings in, :class:`~sentinel.components.ib.record.IbPort` records out.

Flaps, per-hour error budgets and counter growth need history, so the agent keeps per port the previous
reading, spaced error-counter samples and the link-down events of the flap window (from ``link_downed``,
else from an observed up → down), with the kernel's own lines as evidence. That history is persisted in a
small bounded JSON file in the state directory, so an agent restart neither forgets a flapping link nor
mistakes a long-down port for a fresh one; a damaged file is ignored with a log line.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from sentinel.components.ib.kernel import PortLogLine, names_port
from sentinel.components.ib.record import ERROR_COUNTERS, IbPort, PortReading
from sentinel.log import get_logger

log = get_logger(module="components.ib.tracker")

MAX_PORTS = 1024
MAX_DOWNS = 64
MAX_ERROR_SAMPLES = 64
MAX_KERNEL_LINES = 8  # per port: the latest kernel lines about it
MAX_PENDING_LINES = 64  # lines about ports not read yet (the kernel log is replayed before the first scan)
STATE_VERSION = 1
#: persist at least this often even when nothing verdict-relevant changed (error samples move on)
PERSIST_EVERY_S = 60.0
MAX_STATE_BYTES = 4 * 1024 * 1024
_ERRORS = frozenset(ERROR_COUNTERS)


@dataclass
class _History:
    counters: dict[str, int] = field(default_factory=dict)
    t: float = -math.inf
    up: bool | None = None
    seen_up: bool = False
    down_since: float | None = None
    downs: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_DOWNS))
    samples: deque[tuple[float, dict[str, int]]] = field(
        default_factory=lambda: deque(maxlen=MAX_ERROR_SAMPLES)
    )
    kernel: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=MAX_KERNEL_LINES))
    reading: PortReading | None = None  # the previous reading and its record (the unchanged-port fast path)
    record: IbPort | None = None


class PortTracker:
    """Turns readings into records; ``state_path`` (None: memory only) keeps the history across restarts."""

    def __init__(
        self, *, flap_window_s: float = 600.0, error_window_s: float = 3600.0, state_path: Path | None = None
    ) -> None:
        self.flap_window_s = flap_window_s
        self.error_window_s = error_window_s
        self.state_path = state_path
        self.ports: dict[str, _History] = {}
        self._pending: deque[tuple[float, PortLogLine]] = deque(maxlen=MAX_PENDING_LINES)
        self.persist_errors = 0
        self._dirty = False
        self._persisted_at = -math.inf
        if state_path is not None:
            self._load(state_path)

    # -- readings ---------------------------------------------------------------------------------------

    def update(self, readings: list[PortReading], now: float) -> list[IbPort]:
        readings = readings[:MAX_PORTS]
        if self._pending:
            self._match_pending(readings, now)
        out = [self._one(reading, now) for reading in readings]
        out.extend(self._missing({r.key for r in readings}, now))
        self._persist(now)
        return out

    def _missing(self, present: set[str], now: float) -> list[IbPort]:
        """Ports seen up before and gone from sysfs (an HCA that fell off the bus, a driver that died): a
        ``missing`` record, down since they vanished, for as long as the flap window; then forgotten."""
        out: list[IbPort] = []
        for key, h in list(self.ports.items()):
            if key in present or h.record is None or not h.seen_up:
                continue
            if h.down_since is not None and now - h.down_since > self.flap_window_s:
                del self.ports[key]
                self._dirty = True
                continue
            if h.up:
                h.downs.append(now)
                h.up = False
                h.down_since = now
                self._dirty = True
            h.t = now
            h.record = msgspec.structs.replace(
                h.record,
                state="missing",
                phys_state="missing",
                t=now,
                rates={},
                downs=list(h.downs),
                down_since=h.down_since,
            )
            out.append(h.record)
        return out

    def note_kernel_line(self, line: PortLogLine, now: float) -> None:
        """Keep a kernel line about a port as evidence on its next record (held until the port has been
        read when no known port matches yet; bounded either way)."""
        matched = False
        for h in self.ports.values():
            r = h.reading
            if r is not None and names_port(line, r.device, r.port, r.netdev, r.pci_bus):
                h.kernel.append((now, line.text))
                matched = True
        if not matched:
            self._pending.append((now, line))

    def _match_pending(self, readings: list[PortReading], now: float) -> None:
        keep: deque[tuple[float, PortLogLine]] = deque(maxlen=MAX_PENDING_LINES)
        for t, line in self._pending:
            if now - t > self.flap_window_s:
                continue
            hits = [r for r in readings if names_port(line, r.device, r.port, r.netdev, r.pci_bus)]
            for r in hits:
                self.ports.setdefault(r.key, _History()).kernel.append((t, line.text))
            if not hits:
                keep.append((t, line))
        self._pending = keep

    def _one(self, r: PortReading, now: float) -> IbPort:
        key = r.key
        h = self.ports.get(key)
        if h is None:
            if len(self.ports) >= MAX_PORTS:
                self.ports.pop(next(iter(self.ports)))
            h = self.ports[key] = _History()
        record = h.record
        if (
            record is not None
            and (r is h.reading or r == h.reading)
            and not h.downs
            and not h.kernel
            and self._window_steady(h, now)
        ):
            # nothing changed since the previous reading: the same record, zero rates, the clock moved on
            h.t = now
            zero = record.rates if not any(record.rates.values()) else dict.fromkeys(record.rates, 0.0)
            record = msgspec.structs.replace(
                record, t=now, rates=zero, window_s=min(self.error_window_s, max(0.0, now - h.samples[0][0]))
            )
            h.record = record
            return record
        moved = self._only_traffic_moved(h, r, now) if record is not None else None
        if moved is not None:
            return moved
        up = r.up
        rates: dict[str, float] = {}
        prev = h.counters
        reset = False
        downed = 0
        if prev:
            dt = now - h.t
            per_s = 1.0 / dt if dt > 0 else 0.0
            for name, value in r.counters.items():
                before = prev.get(name)
                if before is None:
                    continue
                if value < before:
                    reset = True
                    break
                if per_s:
                    rates[name] = (value - before) * per_s
            if reset:
                rates = {}
            else:
                downed = r.counters.get("link_downed", 0) - prev.get("link_downed", 0)
        if reset:
            h.samples.clear()  # a driver reload or reboot zeroed the counters: the window starts over
            self._dirty = True
        went_down = h.up is True and not up
        events = max(downed, 1 if went_down else 0)
        for _ in range(min(events, MAX_DOWNS)):
            h.downs.append(now)
        if events:
            self._dirty = True
        if up:
            if not h.seen_up or h.down_since is not None:
                self._dirty = True
            h.seen_up = True
            h.down_since = None
        elif h.down_since is None:
            h.down_since = now
            self._dirty = True
        while h.downs and now - h.downs[0] > self.flap_window_s:
            h.downs.popleft()
            self._dirty = True
        while h.kernel and now - h.kernel[0][0] > self.flap_window_s:
            h.kernel.popleft()
        errors = {name: r.counters[name] for name in ERROR_COUNTERS if name in r.counters}
        spacing = self.error_window_s / (MAX_ERROR_SAMPLES - 1)
        if not h.samples or now - h.samples[-1][0] >= spacing:
            h.samples.append((now, errors))
        while len(h.samples) > 1 and now - h.samples[1][0] >= self.error_window_s:
            h.samples.popleft()
        oldest = h.samples[0][1]
        increase = {
            name: value - oldest[name]
            for name, value in errors.items()
            if name in oldest and value > oldest[name]
        }
        h.counters, h.t, h.up, h.reading = dict(r.counters), now, up, r
        h.record = IbPort(
            device=r.device,
            port=r.port,
            state=r.state,
            phys_state=r.phys_state,
            rate_gbps=r.rate_gbps,
            link_layer=r.link_layer,
            counters=r.counters,
            gpus=r.gpus,
            netdev=r.netdev,
            pci_bus=r.pci_bus,
            numa_node=r.numa_node,
            locality=r.locality,
            t=now,
            rates=rates,
            window_increase=increase,
            window_s=min(self.error_window_s, max(0.0, now - h.samples[0][0])),
            downs=list(h.downs),
            flap_window_s=self.flap_window_s,
            seen_up=h.seen_up,
            down_since=h.down_since,
            kernel_log=[text for _, text in h.kernel],
        )
        return h.record

    def _window_steady(self, h: _History, now: float) -> bool:
        """No error sample is due now and none leaves the error window: the record's window is as it was."""
        samples = h.samples
        return now - samples[-1][0] < self.error_window_s / (MAX_ERROR_SAMPLES - 1) and (
            len(samples) < 2 or now - samples[1][0] < self.error_window_s
        )

    def _only_traffic_moved(self, h: _History, r: PortReading, now: float) -> IbPort | None:
        """A busy port's record when, since the previous reading of the up port, only counters outside
        :data:`ERROR_COUNTERS` changed, none went back, and no down, kernel line or error sample is due: what
        the full path of :meth:`_one` would build, without rebuilding what stays the same. None otherwise."""
        last, record, prev, counters = h.reading, h.record, h.counters, r.counters
        if (
            last is None
            or record is None
            or h.up is not True
            or h.down_since is not None
            or not h.seen_up
            or h.downs
            or h.kernel
            or not r.up
            or len(counters) != len(prev)
            or not self._window_steady(h, now)
            or msgspec.structs.replace(r, counters=last.counters) != last  # anything but the counters
        ):
            return None
        dt = now - h.t
        per_s = 1.0 / dt if dt > 0 else 0.0
        rates: dict[str, float] = {}
        for name, value in counters.items():  # the same names as before (as many, each known)
            before = prev.get(name)
            if before is None or value < before or (value != before and name in _ERRORS):
                return None
            rates[name] = (value - before) * per_s
        if not per_s:
            rates = {}
        h.counters, h.t, h.reading = dict(counters), now, r
        h.record = msgspec.structs.replace(
            record,
            counters=counters,
            t=now,
            rates=rates,
            window_s=min(self.error_window_s, max(0.0, now - h.samples[0][0])),
        )
        return h.record

    # -- persistence ------------------------------------------------------------------------------------

    def _persist(self, now: float) -> None:
        path = self.state_path
        if path is None or (not self._dirty and now - self._persisted_at < PERSIST_EVERY_S):
            return
        document = {
            "version": STATE_VERSION,
            "ports": {
                key: {
                    "counters": h.counters,
                    "t": h.t,
                    "up": h.up,
                    "seen_up": h.seen_up,
                    "down_since": h.down_since,
                    "downs": list(h.downs),
                    "samples": [[t, c] for t, c in h.samples],
                }
                for key, h in self.ports.items()
            },
        }
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(document, separators=(",", ":")))
            os.replace(tmp, path)
        except OSError as exc:
            self.persist_errors += 1
            log.warning("ib_state_write_failed", path=str(path), error=exc.strerror or str(exc))
            return
        self._dirty = False
        self._persisted_at = now

    def _load(self, path: Path) -> None:
        try:
            with path.open("rb") as handle:
                raw = handle.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("ib_state_unreadable", path=str(path), error=exc.strerror or str(exc))
            return
        try:
            if len(raw) > MAX_STATE_BYTES:
                raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
            document = json.loads(raw)
            if not isinstance(document, dict) or document.get("version") != STATE_VERSION:
                raise ValueError("unknown version")
            ports = document.get("ports")
            if not isinstance(ports, dict):
                raise ValueError("no ports object")
            for key, entry in list(ports.items())[:MAX_PORTS]:
                self.ports[str(key)[:160]] = _history_of(entry)
        except (ValueError, TypeError, KeyError) as exc:
            self.ports.clear()
            log.warning("ib_state_ignored", path=str(path), error=str(exc)[:200])


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {str(value)[:40]}")
    return float(value)


def _counts(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise ValueError("counters not an object")
    out: dict[str, int] = {}
    for name, count in list(value.items())[:256]:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"counter {str(name)[:40]} not a non-negative integer")
        out[str(name)[:64]] = count
    return out


def _history_of(entry: Any) -> _History:
    if not isinstance(entry, dict):
        raise ValueError("port entry not an object")
    h = _History()
    h.counters = _counts(entry.get("counters", {}))
    h.t = _number(entry.get("t", 0.0))
    up = entry.get("up")
    h.up = up if isinstance(up, bool) else None
    h.seen_up = entry.get("seen_up") is True
    since = entry.get("down_since")
    h.down_since = None if since is None else _number(since)
    for t in list(entry.get("downs", []))[-MAX_DOWNS:]:
        h.downs.append(_number(t))
    for item in list(entry.get("samples", []))[-MAX_ERROR_SAMPLES:]:
        if not isinstance(item, list) or len(item) != 2:
            raise ValueError("sample not a [t, counters] pair")
        h.samples.append((_number(item[0]), _counts(item[1])))
    return h
