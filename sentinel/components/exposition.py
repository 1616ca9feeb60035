"""What a component's ``metrics.py`` writes with: the Prometheus text format (0.0.4), written directly.

A generic path (a Sample tuple and label escaping per series) is costly per series, and
with NVLink counters an 8-GPU host has about a thousand series scraped every second.
So the agent escapes each GPU's label set once (:attr:`GpuRow.labels`) and every component appends its
families as text through a :class:`Writer`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from sentinel.components.device.record import GpuInfo, GpuState
from sentinel.components.families import (
    Family,
    SampleLike,
    escape_label_name,
    escape_metric_name,
    float_to_go_string,
)
from sentinel.wire import GpuSample


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v: float) -> str:
    if v - v == 0.0:  # finite: the common case, one comparison
        return repr(v)
    if math.isnan(v):
        return "NaN"
    return "+Inf" if v > 0 else "-Inf"


#: the text of a nonzero finite float value, as :meth:`Writer.line` writes it: most values (clocks, limits,
#: sizes, flags) repeat from one scrape to the next, and a lookup is cheaper than ``repr`` (bounded: cleared
#: when full; zero is not kept, as -0.0 would find 0.0's text)
_value_texts: dict[float, str] = {}
_MAX_VALUE_TEXTS = 1024


class Writer:
    """Accumulates exposition lines."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def family(self, name: str, kind: str, doc: str) -> None:
        self._parts.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")

    def line(self, name: str, labels: str, value: float, extra: str = "") -> None:
        text = _value_texts.get(value) if type(value) is float else None
        if text is None:
            text = repr(value) if value - value == 0.0 else _value(value)  # finite: _value's repr, inline
            if value and type(value) is float and value - value == 0.0:
                if len(_value_texts) >= _MAX_VALUE_TEXTS:
                    _value_texts.clear()
                _value_texts[value] = text
        if extra:
            self._parts.append(f"{name}{{{labels},{extra}}} {text}\n")
        else:
            self._parts.append(f"{name}{{{labels}}} {text}\n")

    def raw(self, text: str) -> None:
        """Lines already written (by another Writer)."""
        self._parts.append(text)

    def text(self) -> str:
        return "".join(self._parts)


#: a name's escaping, once per name (names and label names are few, fixed by the code)
_metric_name = functools.lru_cache(maxsize=1024)(escape_metric_name)
_label_name = functools.lru_cache(maxsize=1024)(escape_label_name)
_float_text: Callable[[float], str] = float_to_go_string  # Go's float formatting, as the Prometheus server's
_SPLIT_OUT = ("_created", "_gsum", "_gcount")  # OpenMetrics samples written as gauges after their family
_PROMETHEUS_TYPE = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


#: a series' text up to its value (``name{labels} ``), by its name and (label, value) pairs in the family's
#: order: most series keep theirs from one scrape to the next, so the sort and escaping happen once (bounded:
#: cleared when full)
_series_texts: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
_MAX_SERIES_TEXTS = 8192


def _series_text(name: str, labels: dict[str, str]) -> str:
    key = (name, tuple(labels.items()))
    text = _series_texts.get(key)
    if text is None:
        pairs = ",".join(f'{_label_name(k)}="{escape(v)}"' for k, v in sorted(key[1]))
        text = f"{_metric_name(name)}{{{pairs}}} " if pairs else f"{_metric_name(name)} "
        if len(_series_texts) >= _MAX_SERIES_TEXTS:
            _series_texts.clear()
        _series_texts[key] = text
    return text


#: :data:`_value_texts` for the families' samples, in Go's formatting (the same text below 1e6)
_go_texts: dict[float, str] = {}


def _sample_line(sample: SampleLike) -> str:
    value = sample.value
    text = _go_texts.get(value) if type(value) is float else None
    if text is None:
        # Go writes these as Python's repr does (no exponent below 1e6): the common case, without a call
        text = repr(value) if type(value) is float and -math.inf < value < 1e6 else _float_text(value)
        if value and type(value) is float and value - value == 0.0:
            if len(_go_texts) >= _MAX_VALUE_TEXTS:
                _go_texts.clear()
            _go_texts[value] = text
    if sample.timestamp is None:
        return f"{_series_text(sample.name, sample.labels)}{text}\n"
    stamp = int(float(sample.timestamp) * 1000)
    return f"{_series_text(sample.name, sample.labels)}{text} {stamp:d}\n"


#: a family's text by its name, with what it was written from: (type, help, samples, the positions of the
#: samples whose value is -0.0, text)
KeptFamilies = dict[str, tuple[str, str, list[SampleLike], list[int], str]]


def _negative_zeros(samples: list[SampleLike]) -> list[int]:
    """Where ``samples`` hold -0.0 (equal to 0.0, but written otherwise)."""
    return [i for i, s in enumerate(samples) if s.value == 0 and math.copysign(1.0, s.value) < 0]


def write_families(out: Writer, families: Iterable[Family], kept: KeptFamilies | None = None) -> None:
    """Metric families (:mod:`sentinel.components.families`, or prometheus-client's) in the text format, as
    prometheus-client's ``generate_latest`` writes them (the same bytes), with each series' text up to its
    value kept from one scrape to the next.

    ``kept`` (the caller's, from its last call) holds each family's text with the samples it was written
    from: a family whose samples are equal is not written again. It is replaced by this call's families.
    """
    lines: list[str] = []
    fresh: KeptFamilies = {}
    for metric in families:
        samples = list(metric.samples)
        last = kept.get(metric.name) if kept is not None else None
        # equal samples write the same text (their values compare as numbers: -0.0 is equal to 0.0)
        if (
            last is not None
            and last[:3] == (metric.type, metric.documentation, samples)
            and last[3] == _negative_zeros(samples)
        ):
            lines.append(last[4])
            fresh[metric.name] = last
            continue
        text = _family_text(metric, samples)
        lines.append(text)
        if kept is not None:
            fresh[metric.name] = (
                metric.type,
                metric.documentation,
                samples,
                _negative_zeros(samples),
                text,
            )
    if kept is not None:
        kept.clear()
        kept.update(fresh)
    out.raw("".join(lines))


def _family_text(metric: Family, samples: list[SampleLike]) -> str:
    name, kind = metric.name, metric.type
    if kind == "counter":
        name += "_total"
    elif kind == "info":
        name += "_info"
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    escaped = _metric_name(name)
    lines = [f"# HELP {escaped} {doc}\n# TYPE {escaped} {_PROMETHEUS_TYPE.get(kind, kind)}\n"]
    split_names = {metric.name + suffix: suffix for suffix in _SPLIT_OUT}
    split: dict[str, list[str]] = {}
    for sample in samples:
        suffix = split_names.get(sample.name)
        if suffix is None:
            lines.append(_sample_line(sample))
        else:
            split.setdefault(suffix, []).append(_sample_line(sample))
    for suffix, split_lines in sorted(split.items()):
        escaped = _metric_name(metric.name + suffix)
        lines.append(f"# HELP {escaped} {doc}\n# TYPE {escaped} gauge\n")
        lines.extend(split_lines)
    return "".join(lines)


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


class MetricsView:
    """Every GPU of the host (``rows``) and those answering NVML with a sample (``ok``).

    It notes whether a render read more than :meth:`slow` (``read_beyond_slow``): a family written from the
    slow samples alone is the same text while they are, which the agent keeps between scrapes.
    """

    __slots__ = ("_rows", "read_beyond_slow")

    def __init__(self, rows: list[GpuRow]) -> None:
        self._rows = rows
        self.read_beyond_slow = False

    @property
    def rows(self) -> list[GpuRow]:
        self.read_beyond_slow = True
        return self._rows

    @property
    def ok(self) -> list[GpuRow]:
        self.read_beyond_slow = True
        return [r for r in self._rows if r.state == "ok" and r.fast is not None]

    def fast(self) -> list[tuple[GpuSample, str]]:
        self.read_beyond_slow = True
        return [(r.fast, r.labels) for r in self._rows if r.state == "ok" and r.fast is not None]

    def slow(self) -> list[tuple[GpuSample, str]]:
        return [
            (r.slow, r.labels)
            for r in self._rows
            if r.state == "ok" and r.fast is not None and r.slow is not None
        ]


#: (GpuSample attribute, metric, help, multiplier, divisor)
Gauge = tuple[str, str, str, float, float]

#: per place in the body (a family, or one GPU's lines of a family: ``slot``), the text last written there and
#: everything it was written from (``key``): lines whose values did not change since the last scrape (most of
#: them) are looked up, not written again. One text a place, so what it holds does not grow with time
#: (bounded in places too: cleared when full)
_blocks: dict[Hashable, tuple[Hashable, str]] = {}
_MAX_BLOCKS = 4096


def kept_block(slot: Hashable, key: Hashable) -> str | None:
    """The text last kept at ``slot``, if it was written from ``key`` (labels, :func:`value_key` of each
    value, whatever else it depends on)."""
    kept = _blocks.get(slot)
    return kept[1] if kept is not None and kept[0] == key else None


def forget_blocks() -> None:
    """Drop every kept text (the next scrape writes everything afresh)."""
    _blocks.clear()


def keep_block(slot: Hashable, key: Hashable, text: str) -> str:
    if len(_blocks) >= _MAX_BLOCKS and slot not in _blocks:
        _blocks.clear()
    _blocks[slot] = (key, text)
    return text


def value_key(value: float | None) -> float | str | None:
    """A value as a key part that tells apart what is written apart: equal numbers write the same text
    except 0.0 and -0.0 (and 0), which are keyed by their text."""
    return value if value or value is None else repr(value)


def gauges(out: Writer, rows: list[tuple[GpuSample, str]], table: tuple[Gauge, ...]) -> None:
    """Families of one plain number per GPU."""
    for attr, name, doc, mul, div in table:
        values = [getattr(sample, attr) for sample, _ in rows]
        slot = (name, *[labels for _, labels in rows])
        key = (doc, mul, div, *[value_key(v) for v in values])
        text = kept_block(slot, key)
        if text is None:
            fresh = Writer()
            fresh.family(name, "gauge", doc)
            for (_, labels), value in zip(rows, values, strict=True):
                if value is not None:
                    fresh.line(name, labels, float(value) / div if div != 1 else float(value) * mul)
            text = keep_block(slot, key, fresh.text())
        out.raw(text)
