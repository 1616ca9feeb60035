"""Counter rates per second between consecutive readings of each interface (a counter that went down —
a driver reload, a recreated interface — restarts that interface's rates)."""

from __future__ import annotations

from sentinel.components.netdev.record import Netdev, NetdevReading

MAX_TRACKED = 256


class NetdevRates:
    def __init__(self) -> None:
        self._prev: dict[str, tuple[float, dict[str, int]]] = {}

    def update(self, readings: list[NetdevReading], now: float) -> list[Netdev]:
        out: list[Netdev] = []
        seen: dict[str, tuple[float, dict[str, int]]] = {}
        for r in readings[:MAX_TRACKED]:
            rates: dict[str, float] = {}
            prev = self._prev.get(r.name)
            if prev is not None and now > prev[0]:
                dt = now - prev[0]
                before = prev[1]
                if all(r.counters.get(n, v) >= v for n, v in before.items()):
                    rates = {n: (v - before[n]) / dt for n, v in r.counters.items() if n in before}
            seen[r.name] = (now, r.counters)
            out.append(
                Netdev(
                    name=r.name,
                    operstate=r.operstate,
                    speed_mbps=r.speed_mbps,
                    counters=r.counters,
                    t=now,
                    rates=rates,
                    qdisc=r.qdisc,
                    qdisc_backlog_bytes=r.qdisc_backlog_bytes,
                )
            )
        self._prev = seen
        return out
