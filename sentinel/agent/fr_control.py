"""The agent's Flight Recorder dump control: which ranks of a job run here, and asking them to dump.

The ranks come from the process mapping and from the probe heads each tick (:meth:`LocalRanks.note`);
``fr_dump`` writes their dump pipes and, when asked to collect, gathers the dump files that appear
(:mod:`sentinel.agent.frdump`). Both the aggregator's ``fr_dump`` command and the local HTTP API go
through :class:`FrDumps`.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from sentinel.agent.frdump import MAX_COLLECT_BYTES, collect_dumps, trigger_fr_dump
from sentinel.config.agent import ProbeConfig
from sentinel.log import get_logger
from sentinel.wire import FrDumpAnswer, ProcInfo

log = get_logger(module="agent")

#: A simulated host's answer to fr_dump: it runs no PyTorch ranks, so there is no Flight Recorder to dump.
SIMULATED_NO_DUMP = "simulated host: runs no PyTorch ranks, so no flight-recorder dump to collect"
#: jobs whose local ranks (from probe heads) are remembered for fr_dump, oldest forgotten first
MAX_JOBS_REMEMBERED = 64
MAX_RANKS_REMEMBERED = 4096


class LocalRanks:
    """The ranks known to run on this host: the process mapping, and every rank whose heads came here."""

    def __init__(self, procs: Callable[[], list[ProcInfo]]) -> None:
        self.procs = procs
        self._ranks_by_job: dict[str, set[int]] = {}

    def note(self, job: str, rank: int) -> None:
        """Remember that ``rank`` of ``job`` reports from this host (fr_dump asks these ranks to dump)."""
        ranks = self._ranks_by_job.get(job)
        if ranks is None:
            if len(self._ranks_by_job) >= MAX_JOBS_REMEMBERED:
                self._ranks_by_job.pop(next(iter(self._ranks_by_job)))
            ranks = self._ranks_by_job[job] = set()
        if len(ranks) < MAX_RANKS_REMEMBERED:
            ranks.add(rank)

    def of(self, job: str | None) -> list[int]:
        """The ranks (of ``job``, or of every job) known to run here: process mapping and probe heads."""
        ranks = {p.rank for p in self.procs() if p.rank is not None and (job is None or p.job_id == job)}
        for name, seen in self._ranks_by_job.items():
            if job is None or name == job:
                ranks.update(seen)
        return sorted(ranks)


class FrDumps:
    """``fr_dump`` for this host's ranks: trigger their dump pipes, and collect what they write."""

    def __init__(self, probe: ProbeConfig, ranks: LocalRanks, *, simulated: bool = False) -> None:
        self.probe = probe
        self.ranks = ranks
        self.simulated = simulated

    def trigger_fr_dump(self, job: str | None = None) -> FrDumpAnswer:
        """Ask the local ranks (of ``job``, or all) to dump their flight recorder."""
        return trigger_fr_dump(self.probe.fr_pipe_prefix, self.ranks.of(job) or None)

    def fr_dump_collect(
        self, job: str | None, *, since: float, wait_s: float, max_bytes: int = MAX_COLLECT_BYTES
    ) -> FrDumpAnswer:
        """Trigger the job's local ranks, then gather their fresh dumps (blocking; run off the loop).

        The trigger's answer plus ``dumps`` (gzip bytes per rank) and ``skipped`` — see
        :func:`sentinel.agent.frdump.collect_dumps`. Ranks are the job's known local ranks; when none is
        known, every pipe is triggered and every fresh dump in the folder is returned.
        """
        if self.simulated:  # a simulated host: its "job" is the simulator's, not PyTorch processes
            return FrDumpAnswer(error=SIMULATED_NO_DUMP)
        triggered = self.trigger_fr_dump(job)
        directory = self.probe.fr_dump_dir
        if not directory:
            return msgspec.structs.replace(triggered, error="probe.fr_dump_dir not set")
        known = self.ranks.of(job)
        found = collect_dumps(
            directory,
            self.probe.fr_dump_prefix,
            since=since,
            expect=triggered.triggered,
            ranks=known or None,
            wait_s=wait_s,
            max_bytes=max_bytes,
        )
        log.info(
            "fr_dump_collected",
            job=job,
            triggered=len(triggered.triggered),
            dumps=len(found.dumps),
            skipped=len(found.skipped),
            waited_s=found.waited_s,
        )
        return msgspec.structs.replace(
            triggered, dumps=found.dumps, skipped=found.skipped, waited_s=found.waited_s
        )
