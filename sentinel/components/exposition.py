"""What a component's ``metrics.py`` writes with: the Prometheus text format (0.0.4), written directly.

prometheus-client's generic path (a Sample tuple and label escaping per series) is costly per series, and
with NVLink counters an 8-GPU host has about a thousand series scraped every second.
So the agent escapes each GPU's label set once (:attr:`GpuRow.labels`) and every component appends its
families as text through a :class:`Writer`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sentinel.components.device.record import GpuInfo, GpuState
from sentinel.wire import GpuSample


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if v - v == 0.0:  # finite: the common case, one comparison
        return repr(v)
    if math.isnan(v):
        return "NaN"
    return "+Inf" if v > 0 else "-Inf"


class Writer:
    """Accumulates exposition lines."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def family(self, name: str, kind: str, doc: str) -> None:
        self._parts.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")

    def line(self, name: str, labels: str, value: float, extra: str = "") -> None:
        if extra:
            self._parts.append(f"{name}{{{labels},{extra}}} {_value(value)}\n")
        else:
            self._parts.append(f"{name}{{{labels}}} {_value(value)}\n")

    def raw(self, text: str) -> None:
        """Lines already written (by another Writer)."""
        self._parts.append(text)

    def text(self) -> str:
        return "".join(self._parts)


@dataclass(slots=True)
class GpuRow:
    """One GPU as the metrics see it: escaped labels, identity, state, latest fast and slow samples."""

    index: int
    labels: str
    info: GpuInfo
    state: GpuState
    fast: GpuSample | None
    slow: GpuSample | None
    #: (xid code, catalog severity) → occurrences seen by this agent
    xids: dict[tuple[int, str], int] = field(default_factory=dict)


@dataclass(slots=True)
class MetricsView:
    """Every GPU of the host (``rows``) and those answering NVML with a sample (``ok``)."""

    rows: list[GpuRow]

    @property
    def ok(self) -> list[GpuRow]:
        return [r for r in self.rows if r.state == "ok" and r.fast is not None]

    def fast(self) -> list[tuple[GpuSample, str]]:
        return [(r.fast, r.labels) for r in self.rows if r.state == "ok" and r.fast is not None]

    def slow(self) -> list[tuple[GpuSample, str]]:
        return [
            (r.slow, r.labels)
            for r in self.rows
            if r.state == "ok" and r.fast is not None and r.slow is not None
        ]


#: (GpuSample attribute, metric, help, multiplier, divisor)
Gauge = tuple[str, str, str, float, float]


def gauges(out: Writer, rows: list[tuple[GpuSample, str]], table: tuple[Gauge, ...]) -> None:
    """Families of one plain number per GPU."""
    for attr, name, doc, mul, div in table:
        out.family(name, "gauge", doc)
        for sample, labels in rows:
            value = getattr(sample, attr)
            if value is not None:
                out.line(name, labels, float(value) / div if div != 1 else float(value) * mul)
