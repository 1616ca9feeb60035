"""Which verdict caught which injected fault, how late, and what was flagged that should not have been.

The demo knows the truth (the scenario's faults and when they were injected) and sees what the aggregator
concluded (its verdicts, from the REST API). This module holds the pure comparison both the live view and
the final summary use. No I/O and no clock: times are seconds since the demo started, passed in.

A verdict *catches* a fault when it names the fault's host (and GPU, where both name one), its kind is one a
correct detector may give for that fault kind (a thermal throttle may show as a thermal straggler or as a
degraded GPU; an Xid 79 as a faulty GPU), and it opened after the fault was injected. A verdict that catches
no fault but names a GPU (or host) already hit by a fault is a *consequence* (an Xid 79 GPU's rank stops, so
its job may also report it stuck) and is not wrong. Any other verdict is *flagged wrongly*: a waiting peer
blamed for a hang, a healthy GPU called faulty. Some faults must open no verdict at all (an application
Xid): they are handled correctly when nothing names their GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sentinel.components.xid.catalog import xid_info

#: Verdict kinds a correct detector may open for each fault kind (contract section 4).
ACCEPTED_KINDS: Mapping[str, frozenset[str]] = {
    "xid": frozenset({"faulty", "degraded"}),
    "gpu_lost": frozenset({"faulty"}),
    "nvml_hang": frozenset({"faulty", "degraded"}),
    "row_remap_pending": frozenset({"degraded", "faulty"}),
    "row_remap_failure": frozenset({"faulty"}),
    "ecc_uncorrectable": frozenset({"faulty", "degraded"}),
    "nvlink_errors": frozenset({"degraded", "faulty"}),
    "thermal_throttle": frozenset({"straggler", "degraded"}),
    "straggler": frozenset({"straggler"}),
    "hang": frozenset({"stuck"}),
    "nccl_net_error": frozenset({"stuck", "degraded", "faulty"}),
    "host_down": frozenset({"host_silent"}),
    "xid_recurring": frozenset({"faulty"}),
}

#: How long after a fault a correct detector has to name it (the aggregator issue's bounds: hardware 3 s,
#: hang 10 s, straggler 60 s; a silent host after 10 missed ticks), plus one agent tick of transport. A fault
#: without a verdict is only *missed* once its bound has passed; before that it is *pending*.
DETECTION_BOUND_S: Mapping[str, float] = {
    "straggler": 60.0,
    "thermal_throttle": 60.0,
    "hang": 10.0,
    "nccl_net_error": 10.0,
    "host_down": 15.0,
}
HARDWARE_BOUND_S = 3.0


def detection_bound_s(kind: str) -> float:
    """Seconds a detector may take for a fault of ``kind``, transport included."""
    return DETECTION_BOUND_S.get(kind, HARDWARE_BOUND_S) + 1.0


#: A verdict opened this long before the injection time still counts (the two clocks are the same process's,
#: but the injection is scheduled on a tick, so it may land a fraction of a tick early).
EARLY_SLACK_S = 0.5


@dataclass(frozen=True)
class Fault:
    """One injected fault: where, what, when (seconds after the demo started)."""

    index: int
    at_s: float
    host: str
    gpu: int | None
    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """``xid 79``, ``thermal_throttle clock_mhz=1050``, ``hang``."""
        params = {k: f"{v:g}" if isinstance(v, float) else str(v) for k, v in self.params.items()}
        if self.kind == "xid" and "xid" in params:
            return f"xid {params['xid']}"
        if self.kind == "thermal_throttle" and "clock_mhz" in params:
            return f"thermal_throttle {params['clock_mhz']} MHz"
        extra = " ".join(f"{key}={value}" for key, value in sorted(params.items()))
        return f"{self.kind} {extra}".strip()

    def where(self) -> str:
        return self.host if self.gpu is None else f"{self.host} gpu {self.gpu}"

    @property
    def expects_verdict(self) -> bool:
        """False for faults a correct aggregator leaves alone: an application Xid (13, 31, 43, 45) is the
        program's error, not the GPU's, and must not make the GPU faulty; a storm is one informational
        verdict, never a GPU's fault."""
        if self.kind == "xid_storm":
            return False
        if self.kind == "xid":
            code = self.params.get("xid")
            return not (isinstance(code, int) and xid_info(code).cause == "application")
        return True


@dataclass(frozen=True)
class Verdict:
    """A verdict as the REST API shows it, with its opening time turned into demo seconds."""

    id: str
    kind: str
    host: str | None
    gpu: int | None
    job: str | None
    rank: int | None
    reason: str
    action: str
    evidence: tuple[str, ...]
    opened_s: float
    state: str = "open"

    def where(self) -> str:
        place = self.host or "?"
        if self.gpu is not None:
            place += f" gpu {self.gpu}"
        if self.job:
            place += f" ({self.job}" + (f" rank {self.rank})" if self.rank is not None else ")")
        return place


@dataclass(frozen=True)
class Catch:
    fault: Fault
    verdict: Verdict | None  # None: missed, pending, or nothing expected
    flagged_by: Verdict | None = None  # a fault that expects no verdict got this one anyway
    pending: bool = False  # no verdict yet, but still within its detection bound

    @property
    def delay_s(self) -> float | None:
        if self.verdict is None:
            return None
        return max(0.0, self.verdict.opened_s - self.fault.at_s)

    @property
    def ok(self) -> bool:
        """Caught (or still within its bound), or (for a fault that must not open a verdict) left alone."""
        if self.fault.expects_verdict:
            return self.verdict is not None or self.pending
        return self.flagged_by is None


@dataclass(frozen=True)
class Outcome:
    catches: tuple[Catch, ...]
    consequences: tuple[tuple[Verdict, Fault], ...]  # verdict explained by an earlier fault on the same place
    wrong: tuple[Verdict, ...]  # verdicts no injected fault explains

    @property
    def missed(self) -> tuple[Fault, ...]:
        return tuple(c.fault for c in self.catches if not c.ok and c.fault.expects_verdict)

    @property
    def pending(self) -> tuple[Fault, ...]:
        return tuple(c.fault for c in self.catches if c.pending)

    @property
    def all_caught(self) -> bool:
        """No injected fault was missed (past its bound without a verdict), none that should be ignored was
        flagged."""
        return all(c.ok for c in self.catches)


def _same_place(fault: Fault, verdict: Verdict) -> bool:
    if verdict.host != fault.host:
        return False
    return fault.gpu is None or verdict.gpu is None or fault.gpu == verdict.gpu


def _after(fault: Fault, verdict: Verdict) -> bool:
    return verdict.opened_s >= fault.at_s - EARLY_SLACK_S


def catches(fault: Fault, verdict: Verdict) -> bool:
    """Whether ``verdict`` is a correct detection of ``fault``."""
    return (
        fault.expects_verdict
        and verdict.kind in ACCEPTED_KINDS.get(fault.kind, frozenset())
        and _same_place(fault, verdict)
        and _after(fault, verdict)
    )


def evaluate(faults: Sequence[Fault], verdicts: Iterable[Verdict], now_s: float) -> Outcome:
    """Match verdicts to the faults injected by ``now_s``; each fault takes its earliest catching verdict."""
    injected = [f for f in faults if f.at_s <= now_s]
    ordered = sorted(verdicts, key=lambda v: (v.opened_s, v.id))
    used: set[str] = set()
    result: list[Catch] = []
    for fault in injected:
        match = next((v for v in ordered if v.id not in used and catches(fault, v)), None)
        if match is not None:
            used.add(match.id)
        pending = (
            match is None and fault.expects_verdict and now_s < fault.at_s + detection_bound_s(fault.kind)
        )
        result.append(Catch(fault, match, pending=pending))
    consequences: list[tuple[Verdict, Fault]] = []
    wrong: list[Verdict] = []
    causes = [f for f in injected if f.expects_verdict]  # an ignorable fault explains no verdict
    for verdict in ordered:
        if verdict.id in used:
            continue
        cause = next((f for f in causes if _same_place(f, verdict) and _after(f, verdict)), None)
        if cause is None:
            wrong.append(verdict)
        else:
            consequences.append((verdict, cause))
    for i, catch in enumerate(result):
        if not catch.fault.expects_verdict:
            flag = next((v for v in wrong if _same_place(catch.fault, v) and _after(catch.fault, v)), None)
            result[i] = Catch(catch.fault, None, flag)
    return Outcome(tuple(result), tuple(consequences), tuple(wrong))


class ApiShapeError(ValueError):
    """The aggregator answered with JSON this client cannot read (names the field)."""


def _opt_int(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiShapeError(f"verdict field {key!r}: expected an integer or null, got {value!r}")
    return value


def _opt_str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    return str(value)


def timestamp(value: Any) -> float | None:
    """A unix time from the API: a number of seconds or an ISO 8601 string; None when absent."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ApiShapeError(f"expected a time, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError as exc:
            raise ApiShapeError(f"expected an ISO 8601 time, got {value!r}") from exc
    raise ApiShapeError(f"expected a time, got {value!r}")


def verdict_from_api(obj: Any, started_at: float, seen_at: float) -> Verdict:
    """Read one verdict object of ``GET /api/v1/verdicts`` (contract sections 4 and 5).

    ``started_at`` is the demo's start (unix seconds); ``seen_at`` is used when the verdict has no
    ``opened_at``, so a missing field costs accuracy, not the demo.
    """
    if not isinstance(obj, Mapping):
        raise ApiShapeError(f"verdict: expected an object, got {type(obj).__name__}")
    for key in ("id", "kind"):
        if obj.get(key) is None:
            raise ApiShapeError(f"verdict: missing field {key!r}")
    opened = timestamp(obj.get("opened_at"))
    evidence = obj.get("evidence") or []
    if not isinstance(evidence, list):
        raise ApiShapeError(f"verdict field 'evidence': expected a list, got {evidence!r}")
    return Verdict(
        id=str(obj["id"]),
        kind=str(obj["kind"]),
        host=_opt_str(obj, "host"),
        gpu=_opt_int(obj, "gpu"),
        job=_opt_str(obj, "job"),
        rank=_opt_int(obj, "rank"),
        reason=str(obj.get("reason") or ""),
        action=str(obj.get("action") or "none"),
        evidence=tuple(str(e) for e in evidence),
        opened_s=(opened if opened is not None else seen_at) - started_at,
        state=str(obj.get("state") or "open"),
    )
