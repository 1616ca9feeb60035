"""Metric families as collectors hand them to the exposition writer (:mod:`sentinel.components.exposition`).

The slice of prometheus-client's data model the agent uses — samples, counter and gauge families, a registry
of collectors — without its HTTP servers, push gateway and multiprocess machinery, whose imports were several
MB of every agent's memory. The objects carry prometheus-client's attribute names, so its ``generate_latest``
renders them as well (the tests compare both).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol, SupportsFloat

CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"
_LEGACY_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LEGACY_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


class SampleLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def value(self) -> float: ...
    @property
    def timestamp(self) -> SupportsFloat | None: ...


class Family(Protocol):
    """What the writer reads of a family (this module's, or prometheus-client's)."""

    name: str
    type: str
    documentation: str

    @property
    def samples(self) -> Sequence[SampleLike]: ...


class Metric:
    """A family: name, help, type and its samples."""

    def __init__(self, name: str, documentation: str, typ: str) -> None:
        self.name = name
        self.documentation = documentation
        self.type = typ
        self.unit = ""
        self.samples: list[Sample] = []


class CounterMetricFamily(Metric):
    """Counters, one sample per label-value tuple (the sample is named ``<name>_total``)."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name.removesuffix("_total"), documentation, "counter")
        self._labelnames = tuple(labels)

    def add_metric(self, labels: Sequence[str], value: float, timestamp: float | None = None) -> None:
        self.samples.append(
            Sample(self.name + "_total", dict(zip(self._labelnames, labels, strict=False)), value, timestamp)
        )


class GaugeMetricFamily(Metric):
    """Gauges, one sample per label-value tuple."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, documentation, "gauge")
        self._labelnames = tuple(labels)

    def add_metric(self, labels: Sequence[str], value: float, timestamp: float | None = None) -> None:
        self.samples.append(
            Sample(self.name, dict(zip(self._labelnames, labels, strict=False)), value, timestamp)
        )


class Collector(Protocol):
    def collect(self) -> Iterable[Family]: ...


class CollectorRegistry:
    """The collectors one agent exports, in registration order."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        self._collectors.append(collector)

    def unregister(self, collector: Collector) -> None:
        self._collectors.remove(collector)

    def collect(self) -> Iterable[Family]:
        for collector in list(self._collectors):
            yield from collector.collect()


def _underscores(name: str, extra: str) -> str:
    """Each character outside the legacy set (letters, ``_``, digits after the first, ``extra``) as ``_``."""
    return "".join(
        c
        if ("a" <= c <= "z" or "A" <= c <= "Z" or c == "_" or c in extra or ("0" <= c <= "9" and i))
        else "_"
        for i, c in enumerate(name)
    )


def escape_metric_name(name: str) -> str:
    """A metric name as the text format writes it (prometheus-client's default ``underscores`` escaping)."""
    if not name or _LEGACY_METRIC_NAME.match(name):
        return name
    return _underscores(name, ":")


def escape_label_name(name: str) -> str:
    """A label name as the text format writes it (prometheus-client's default ``underscores`` escaping)."""
    if not name or (_LEGACY_LABEL_NAME.match(name) and not name.startswith("__")):
        return name
    return _underscores(name, "")


def float_to_go_string(value: float) -> str:
    """A float as Go (and so the Prometheus server) formats it."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s
