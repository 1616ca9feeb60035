"""The result of ``sentinel fr analyze``: the verdict, its culprits and evidence (:class:`FrAnalysis`).

:meth:`FrAnalysis.to_json` is the ``--json`` object of the external contract (docs/contracts.md).
"""

from __future__ import annotations

from sentinel.fr.lateness import Straggler
from sentinel.fr.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


VERDICTS = ("healthy", "hang", "mismatch", "crash", "straggler", "inconclusive")


class FrAnalysis:
    """The result of :func:`sentinel.fr.analysis.analyze`; :meth:`to_json` is the contract's ``--json`` object."""

    __slots__ = (
        "collective",
        "culprit_ranks",
        "entries",
        "findings",
        "groups",
        "mismatch",
        "missing_dumps",
        "ranks_with_dumps",
        "stragglers",
        "summary",
        "verdict",
        "versions",
        "world_size",
    )

    def __init__(
        self,
        verdict: str,
        summary: str,
        *,
        missing_dumps: list[int] | None = None,
        stragglers: list[Straggler] | None = None,
        ranks_with_dumps: int = 0,
        world_size: int = 0,
        versions: list[str] | None = None,
        entries: int = 0,
        groups: list[dict[str, Any]] | None = None,
    ) -> None:
        self.verdict = verdict
        self.summary = summary
        self.culprit_ranks: list[int] = []
        self.collective: dict[str, Any] | None = None
        self.mismatch: dict[str, Any] | None = None
        self.missing_dumps: list[int] = [] if missing_dumps is None else missing_dumps
        self.stragglers: list[Straggler] = [] if stragglers is None else stragglers
        self.findings: list[str] = []
        self.ranks_with_dumps = ranks_with_dumps
        self.world_size = world_size
        self.versions: list[str] = [] if versions is None else versions
        self.entries = entries
        self.groups: list[dict[str, Any]] = [] if groups is None else groups

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.summary,
            "culprit_ranks": self.culprit_ranks,
            "collective": self.collective,
            "mismatch": self.mismatch,
            "missing_dumps": self.missing_dumps,
            "stragglers": [
                {
                    "rank": s.rank,
                    "lag_ms_median": round(s.lag_ms_median, 3),
                    "late_fraction": round(s.late_fraction, 3),
                    "n_collectives": s.n_collectives,
                    "group": s.group or None,
                }
                for s in self.stragglers
            ],
            "findings": self.findings,
            "ranks_with_dumps": self.ranks_with_dumps,
            "world_size": self.world_size,
            "versions": self.versions,
            "entries": self.entries,
            "groups": self.groups,
        }
