"""The detector contract: a name, its own state, and fleet state + the clock in, findings out.

A detector never changes :class:`~sentinel.aggregator.state.FleetState` (the agents' batches do, through its
methods); what it must remember between evaluations (streaks, per-rank step histories, the last stall) is its
own, in msgspec structs or plain dataclasses that :meth:`Detector.snapshot` can turn into builtins. The
engine runs every enabled detector in isolation — an exception in one is counted and logged and the others
still run — and reconciles each one's findings into verdicts with :meth:`VerdictBook.reconcile`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from sentinel.aggregator.state import FleetState
from sentinel.aggregator.verdicts import Finding
from sentinel.components.gpu_view import GpuView
from sentinel.config.aggregator import AggregatorConfig

Key = tuple[str, ...]
T = TypeVar("T")

#: work a sliced detector does between two yields (ranks, GPUs): a few tens of milliseconds at most, so the
#: hardware verdicts of the batches that arrive meanwhile wait that long, not a whole job comparison
ITEMS_PER_STEP = 4096

#: a detector's run in steps: it yields (the event loop runs ingest) and returns its evaluation
Steps = Generator[None, None, T]


def run_steps(steps: Steps[T]) -> T:
    """Run a generator of :data:`Steps` to its end in one piece (``evaluate`` of a sliced detector)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class Observation:
    """What a detector looks at: the fleet (read-only by contract), the clock, and what changed."""

    fleet: FleetState
    now: float
    #: GPUs whose hardware facts changed since the last hardware evaluation (drained by the engine)
    changed_gpus: Sequence[GpuView] = ()
    #: the once-per-tick run (False: the run right after an ingested batch, for ``on_ingest`` detectors)
    tick: bool = True


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A detector's findings; ``scope`` limits which of its open verdicts may close (None: all of them)."""

    findings: list[Finding]
    scope: Callable[[Key], bool] | None = None


class Detector(ABC):
    """One rule family. Subclasses set :attr:`name` and implement :meth:`evaluate`."""

    #: the detector's name: the ``detector`` of its verdicts, its metrics label, its switch in ``detect.disabled``
    name: ClassVar[str]
    #: also evaluated right after a batch that changed some GPU's hardware facts (not only once per tick)
    on_ingest: ClassVar[bool] = False

    def __init__(self, config: AggregatorConfig) -> None:
        self.config = config

    def configure(self, config: AggregatorConfig) -> None:
        """A reloaded configuration (SIGHUP): thresholds change, the detector's memory is kept."""
        self.config = config

    @abstractmethod
    def evaluate(self, seen: Observation) -> Evaluation | None:
        """The findings true at ``seen.now``; None when the detector did not evaluate this time (not due)."""

    def evaluate_steps(self, seen: Observation) -> Steps[Evaluation | None]:
        """:meth:`evaluate` in steps, for the tick (:meth:`~sentinel.aggregator.engine.Engine.tick_stages`
        resumes the event loop at each ``yield``). A detector whose run over a whole job or fleet takes
        tenths of a second yields every :data:`ITEMS_PER_STEP` items and defines ``evaluate`` as
        ``run_steps(self.evaluate_steps(seen))``; the default is one step. Between steps the fleet may
        change (batches are applied): a sliced detector iterates over copies and reads each item once."""
        return self.evaluate(seen)
        yield  # a generator: the default runs in one step

    def switched_on(self) -> None:
        """The detector was off and is on again (a reload): what happened meanwhile must be looked at."""
        return

    def stalled_jobs(self) -> Mapping[str, Any]:
        """Jobs this detector found stalled at its latest run, job → its ``Stall`` (the stuck detector's
        answer; others: none)."""
        return {}

    def join_dumps(self, job: str, analysis: Mapping[str, Any] | None) -> Any:
        """A stalled job's Flight Recorder dumps were analyzed: what this detector makes of them, a
        ``DumpJudgement`` (None: nothing, or the job no longer stalls)."""
        return None

    def rank_judgement(self, job: str, rank: int) -> Any:
        """This detector's view of one rank's compute time, a ``RankJudgement`` (the straggler detector's;
        others: None)."""
        return None

    def job_ended(self, job: str) -> None:
        """Forget what is remembered about ``job`` (it is gone from the fleet)."""
        return

    def host_forgotten(self, host: str) -> None:
        """Forget what is remembered about ``host`` (retention or eviction dropped it from the fleet): a
        stream of made-up host names must not leave memory behind in any detector."""
        return

    def snapshot(self) -> dict[str, Any]:
        """The detector's memory as builtins (for persistence and the debug API); empty when stateless."""
        return {}

    def memory(self) -> Any:
        """What the state store encodes: :meth:`snapshot`, or (overridden) the same memory as msgspec structs
        that encode to the same bytes without building builtins first (a large memory's cost on the loop)."""
        return self.snapshot()

    def memory_steps(self) -> Steps[Any]:
        """:meth:`memory` in steps (the state store prepares it ahead of a flush, the loop resumed at each
        yield); the default is one step."""
        return self.memory()
        yield  # a generator: the default runs in one step

    def restore(self, state: dict[str, Any]) -> None:
        """Take back the :meth:`snapshot` of an earlier process (the aggregator's durable state store).

        The default keeps nothing of it and looks at the whole fleet again, as after being switched on: the
        restored fleet facts are evaluated afresh, and the restored verdicts of a detector whose inputs are
        live (heads, steps) are held open while it gathers them again
        (:attr:`~sentinel.aggregator.verdicts.VerdictBook.restore_hold_s`). A detector whose memory is worth
        more than that overrides this.
        """
        self.switched_on()
