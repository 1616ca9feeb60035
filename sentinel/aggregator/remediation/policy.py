"""Pure decisions of remediation: which verdicts drain their node, and whether the breaker allows a drain.

No I/O and no clock: the verdict, the rules, Slurm's node list and ``now`` in, a decision out — so the same
rules are tested exhaustively here and the remediator only carries them out.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from sentinel.config.aggregator import BreakerConfig, RemediationRule
from sentinel.slurm import SlurmNode


def wants_drain(rules: Sequence[RemediationRule], kind: str, action: str, reason: str) -> bool:
    """The policy's answer for a verdict: the first rule whose globs all match decides; none matching: no."""
    for rule in rules:
        if (
            fnmatch.fnmatchcase(kind, rule.kind)
            and fnmatch.fnmatchcase(action, rule.action)
            and fnmatch.fnmatchcase(reason, rule.reason)
        ):
            return rule.do == "drain"
    return False


@dataclass(frozen=True, slots=True)
class BreakerCheck:
    """The breaker's view of one drain: allowed, or refused with the limit it would pass."""

    allowed: bool
    refusal: str  # "" | breaker_sentinel_drains | breaker_sentinel_fraction | breaker_partition_unavailable
    detail: str
    sentinel_drains: int  # sentinel drains within the window (re-drains of a node each), before this one
    unavailable: int  # nodes down or drained for any reason, before this one
    nodes: int


def check_breaker(
    cfg: BreakerConfig,
    nodes: Sequence[SlurmNode],
    target: str,
    now: float,
    done: Sequence[tuple[str, float]] = (),
) -> BreakerCheck:
    """Would draining ``target`` pass a limit? Counted from Slurm's node list and the drains sentinel did.

    Sentinel's drains are the nodes whose reason starts ``sentinel:`` and was set within the window (a drain
    whose time Slurm does not show counts as recent: unknown is not old) — and every drain in ``done``
    ((node, time) of the drains this aggregator did) within the window, so a node drained, resumed and
    drained again counts each time, the target's own earlier drains included: per node, the larger of
    the two counts. The partition's unavailable nodes are those down, drained, draining, failing or in
    maintenance, whoever did it.
    """
    total = len(nodes)
    since = now - cfg.window_s
    per_node: dict[str, int] = {}
    for name, t in done:
        if t >= since:
            per_node[name] = per_node.get(name, 0) + 1
    for n in nodes:
        if n.drained_by_sentinel and n.name != target and (n.reason_time is None or n.reason_time >= since):
            per_node[n.name] = max(per_node.get(n.name, 0), 1)
    recent = sum(per_node.values())
    unavailable = sum(1 for n in nodes if n.unavailable and n.name != target)

    def refuse(code: str, detail: str) -> BreakerCheck:
        return BreakerCheck(False, code, detail, recent, unavailable, total)

    if total == 0:
        return refuse("breaker_partition_unavailable", "Slurm lists no node to count against")
    if recent + 1 > cfg.max_drains:
        return refuse(
            "breaker_sentinel_drains",
            f"{recent} drains by sentinel (each re-drain of a node counted) in the last {cfg.window_s:g} s; limit {cfg.max_drains}",
        )
    if (recent + 1) / total > cfg.max_fraction:
        return refuse(
            "breaker_sentinel_fraction",
            f"{recent + 1} of {total} nodes would be drained by sentinel in the last {cfg.window_s:g} s; "
            f"limit {cfg.max_fraction:.0%}",
        )
    if (unavailable + 1) / total > cfg.max_unavailable_fraction:
        return refuse(
            "breaker_partition_unavailable",
            f"{unavailable} of {total} nodes are already down or drained; one more passes "
            f"{cfg.max_unavailable_fraction:.0%}",
        )
    return BreakerCheck(True, "", "", recent, unavailable, total)
