"""Hold-down of flapping nodes: a node drained again and again for the same GPU and reason stays drained.

With resume on, a GPU whose fault returns after every reset would be drained, resumed and drained again for
ever (each reset closes the verdict with real evidence, each return opens a new one). :class:`HoldDown`
remembers every drain sentinel did, keyed by (node, GPU, reason), within ``window_s``; once a key has
``drains`` of them the node is *held down*: no automatic resume until the window has passed without a drain
of that key (an operator may still resume it). Pure and clock-free: times come in as arguments.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

#: drains remembered per key, and keys remembered, at most (older ones dropped first; the breaker keeps the
#: drains far fewer than this)
MAX_DRAINS_PER_KEY = 64
MAX_KEYS = 10_000


@dataclass(frozen=True, slots=True)
class Held:
    """Why a node is held down: which GPU and reason, how many drains since when."""

    node: str
    gpu: int | None
    reason: str
    drains: int
    first_t: float
    window_s: float

    def detail(self) -> str:
        gpu = f"GPU {self.gpu} " if self.gpu is not None else ""
        return (
            f"held down: drained {self.drains} times for {gpu}{self.reason} within {self.window_s:g} s; "
            "no automatic resume"
        )


class HoldDown:
    """The drains sentinel did, by (node, GPU, reason); which nodes are held down now."""

    def __init__(self, drains: int, window_s: float) -> None:
        self.drains = drains
        self.window_s = window_s
        self._times: dict[tuple[str, int | None, str], deque[float]] = {}

    def drained(self, node: str, gpu: int | None, reason: str, t: float) -> Held | None:
        """Remember one drain; the hold it puts the node under (None: not held)."""
        key = (node, gpu, reason)
        times = self._times.pop(key, None) or deque(maxlen=MAX_DRAINS_PER_KEY)
        times.append(t)
        self._times[key] = times  # most recent last: the oldest key is dropped first
        while len(self._times) > MAX_KEYS:
            self._times.pop(next(iter(self._times)))
        return self._held(key, t)

    def held(self, node: str, t: float) -> Held | None:
        """The hold on ``node`` at ``t`` (the key with the most drains in the window), or None."""
        found: Held | None = None
        for key in [k for k in self._times if k[0] == node]:
            held = self._held(key, t)
            if held is not None and (found is None or held.drains > found.drains):
                found = held
        return found

    def held_nodes(self, t: float) -> set[str]:
        return {key[0] for key in list(self._times) if self._held(key, t) is not None}

    def _held(self, key: tuple[str, int | None, str], t: float) -> Held | None:
        times = self._times.get(key)
        if times is None:
            return None
        while times and times[0] < t - self.window_s:
            times.popleft()
        if not times:
            del self._times[key]
            return None
        if self.drains <= 0 or len(times) < self.drains:
            return None
        return Held(key[0], key[1], key[2], len(times), times[0], self.window_s)
