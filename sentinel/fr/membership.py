"""Process groups as seen across all dumps: their members, the world size, the ranks that left no dump.

``pg_config`` is empty under gloo, so members are inferred from the entries and completed with absent
ranks when the world size or an all_gather's shape says one is missing. Every hint is capped at twice the
ranks seen, so a hostile dump cannot make the analysis enumerate millions of ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

from sentinel.fr.rank_summary import GroupTrack, RankSummary


class Group:
    """A process group as seen across all dumps."""

    __slots__ = ("desc", "members", "name", "size_hint", "tracks", "unknown_members")

    def __init__(self, name: str, desc: str, tracks: dict[int, GroupTrack], members: set[int]) -> None:
        self.name = name
        self.desc = desc
        self.tracks = tracks
        self.members = members
        self.size_hint = 0
        self.unknown_members = 0

    def label(self) -> str:
        return f"{self.name} ({self.desc})" if self.desc else self.name


def build_groups(summaries: Sequence[RankSummary]) -> dict[str, Group]:
    groups: dict[str, Group] = {}
    config: dict[str, set[int]] = {}
    max_rank = max(s.rank for s in summaries)
    for s in summaries:
        for t in s.groups:
            g = groups.get(t.name)
            if g is None:
                g = groups[t.name] = Group(name=t.name, desc=t.desc, tracks={}, members=set())
            if not g.desc and t.desc:
                g.desc = t.desc
            g.tracks[s.rank] = t
            if t.size_hints:
                g.size_hint = max(g.size_hint, *t.size_hints)
            if t.config_ranks and t.name not in config:  # every member reports the same table
                # believed up to twice the ranks seen (see infer_world_size): linear in the dumps, not in a claim
                cap = 2 * (max(len(summaries), max_rank + 1))
                config[t.name] = {
                    r for start, stop in t.config_ranks[:cap] for r in range(start, min(stop, cap))
                }
    for name, g in groups.items():
        g.members = set(g.tracks) | config.get(name, set())
    return groups


def _is_world(g: Group, present: set[int]) -> bool:
    return g.desc == "default_pg" or (len(present) > 1 and set(g.tracks) == present and g.name == "0")


def infer_world_size(present: set[int], groups: dict[str, Group], summaries: Sequence[RankSummary]) -> int:
    """The job's world size: at least max rank + 1, more when pg_config, any group's all_gather
    shapes or a short sub-group family say ranks left no dump. Hints are believed up to twice the ranks
    seen: a hostile shape must not make the analysis enumerate millions of absent ranks."""
    seen = max(present) + 1
    cap = max(2 * seen, 2 * len(present))
    size = seen
    for s in summaries:
        if s.config_world > size:  # ranks a pg_config lists, in a named group or not (gloo's unnamed one)
            size = min(s.config_world, cap)
    for g in groups.values():
        if g.members:
            size = max(size, min(max(g.members) + 1, cap))
        # an all_gather's shapes give its group's size, and no group is larger than the world: a 2-rank
        # job whose peer died before dumping shows its size only in a sub-group's gather
        size = max(size, min(g.size_hint, cap))
    # a family of sub-groups (same description) that partitions the ranks with one group short of the
    # family's size says the world is larger than the ranks seen (the highest rank left no dump)
    families: dict[str, list[Group]] = {}
    for g in groups.values():
        if g.desc and not _is_world(g, present):
            families.setdefault(g.desc, []).append(g)
    for family in families.values():
        covered = [r for g in family for r in g.members]
        if len(family) < 2 or len(covered) != len(set(covered)) or set(covered) != present:
            continue
        fam_size = max(max(len(g.members), g.size_hint) for g in family)
        if any(len(g.members) < fam_size for g in family):
            size = max(size, min(fam_size * len(family), cap))
    return size


def complete_members(groups: dict[str, Group], present: set[int], missing: list[int], world: int) -> None:
    """Add members that left no dump: every rank to the world group, and missing ranks to short groups."""
    for g in groups.values():
        if _is_world(g, present):
            g.members |= set(range(world))
    if not missing:
        return
    families: dict[str, list[Group]] = {}
    for g in groups.values():
        if not _is_world(g, present):
            families.setdefault(g.desc or g.name, []).append(g)
    for family in families.values():
        size = max(max(len(g.members), g.size_hint) for g in family)
        short = [g for g in family if len(g.members) < size]
        covered = set().union(*(g.members for g in family))
        candidates = [r for r in missing if r not in covered]
        for g in short:
            g.unknown_members = size - len(g.members)
        if len(short) == 1 and 0 < len(candidates) <= short[0].unknown_members:
            short[0].members |= set(candidates)
            short[0].unknown_members -= len(candidates)
        elif short and len(candidates) == len(short) and all(g.unknown_members == 1 for g in short):
            # one missing rank per short group: ranks are usually laid out in order
            for g, r in zip(sorted(short, key=lambda g: min(g.members)), sorted(candidates), strict=True):
                g.members.add(r)
                g.unknown_members = 0


def key_at(t: GroupTrack, seq: int) -> int:
    i = seq - t.first_seq
    if 0 <= i < len(t.keys) // 4:
        return int.from_bytes(t.keys[4 * i : 4 * i + 4], "little")
    for p in t.pending:
        if p.seq == seq and not p.p2p:
            return p.key
    return 0


def time_at(t: GroupTrack, seq: int) -> int:
    i = seq - t.first_seq
    if 0 <= i < len(t.times) // 8:
        return int.from_bytes(t.times[8 * i : 8 * i + 8], "little", signed=True)
    return 0
