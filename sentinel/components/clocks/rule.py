"""Clock rules: the share of an interval each policy held the clocks back (from NVML's violation time), and
what that says about a slow GPU.

Pure: two :class:`ClockViolations` readings in, shares out. The straggler detector names a slow GPU's
reason ``power`` or ``thermal`` from these shares (and the instantaneous reason bits), so "slow because
it sits at its power limit 70% of the time" is told from "slow for no reason the GPU reports".
"""

from __future__ import annotations

import operator
from collections.abc import Callable

from sentinel.components.clocks.record import VIOLATION_NAMES, ClockViolations

#: a policy holding the clocks back this share of the interval or more is the slow GPU's reason
REASON_SHARE = 0.5


def violation_shares(prev: ClockViolations, cur: ClockViolations) -> dict[str, float]:
    """Policy → share (0..1) of the interval between the readings it held the clocks back.

    Only policies both readings report; a counter that went backwards (the driver reloaded, the GPU was
    reset) says nothing about the interval and is left out, as is an interval NVML did not advance.
    """
    span_ns = (cur.reference_us - prev.reference_us) * 1000
    if span_ns <= 0:
        return {}
    out: dict[str, float] = {}
    for name, before, after in zip(VIOLATION_NAMES, _policies(prev), _policies(cur), strict=True):
        if before is None or after is None or after < before:
            continue
        out[name] = min(1.0, (after - before) / span_ns)
    return out


#: a reading's violation time per policy, in the order of VIOLATION_NAMES (the aggregator asks every GPU's
#: slow reading)
_policies: Callable[[ClockViolations], tuple[int | None, ...]] = operator.attrgetter(*VIOLATION_NAMES)


def describe(shares: dict[str, float], span_s: float) -> str:
    """Evidence: the policies that held the clocks back at all, largest first."""
    held = sorted(
        ((v, k) for k, v in shares.items() if v > 0.005 and k not in ("app_clocks", "base_clocks")),
        reverse=True,
    )
    if not held:
        return f"no NVML clock policy held the clocks back over the last {span_s:.0f} s"
    parts = ", ".join(f"{name} {share:.0%}" for share, name in held)
    return f"clocks held back by {parts} of the last {span_s:.0f} s (NVML violation time)"
