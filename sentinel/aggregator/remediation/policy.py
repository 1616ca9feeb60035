"""Pure decisions of remediation: which verdicts drain their node, whether a verdict resting on what the fleet
taught is backed by enough other hosts to be acted on, and whether the breaker allows a drain.

No I/O and no clock: the verdict, the rules, Slurm's node list and ``now`` in, a decision out — so the same
rules are tested exhaustively here and the remediator only carries them out.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sentinel.aggregator.verdicts import Verdict
from sentinel.config.aggregator import BreakerConfig, RemediationRule
from sentinel.slurm import MAX_REASON_CHARS, REASON_PREFIX, SlurmNode

_NOT_IN_TOKEN = re.compile(r"[^\x21-\x7e]")
#: what stands for the cut end of a job id in a drain reason
_CUT = "..."


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


def backed(learned_from: int | None, quorum: int) -> bool:
    """May a verdict be acted on at all? Yes when it rests on its host's own evidence or on configured
    expectations (``learned_from`` None), or on a yardstick learned from the fleet that at least ``quorum``
    hosts other than its own hold — never on one that its own host, or too few others, could have moved."""
    return learned_from is None or learned_from >= quorum


def _token(text: str, cap: int) -> str:
    """``text`` as one printable ASCII token (whitespace and the rest as ``_``), at most ``cap`` characters."""
    return _NOT_IN_TOKEN.sub("_", text[:cap])


def drain_reason_of(verdict: Verdict, limit: int = MAX_REASON_CHARS) -> str:
    """``sentinel: <kind> <reason> [GPU g] [job j [rank r]] <verdict id>`` — what on-call reads in sinfo -R —
    within ``limit`` characters. The verdict id (which resume and on-call look for) is always whole and last;
    the job id, the one part an agent chose, is cut to the room left (ending ``...``), or left out with its
    rank when there is none. Every part is one token, so the id is the reason's last word."""
    head = [REASON_PREFIX, _token(verdict.kind, 32), _token(verdict.reason, 64)]
    if verdict.gpu is not None:
        head += ["GPU", str(verdict.gpu)]
    tail = [_token(verdict.id, 64)]
    if verdict.job:
        rank = ["rank", str(verdict.rank)] if verdict.rank is not None else []
        room = limit - len(" ".join([*head, "job", "", *rank, *tail]))
        job = _token(verdict.job, max(room, 0) + 1)
        if len(job) > room:
            job = job[: room - len(_CUT)] + _CUT if room > len(_CUT) else ""
        if job:
            head += ["job", job, *rank]
    return " ".join([*head, *tail])[-limit:]


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
