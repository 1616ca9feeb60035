"""The families writer writes what prometheus-client's generate_latest writes, byte for byte."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import CollectorRegistry

from sentinel.components import exposition
from sentinel.components.clocks import metrics as clocks_metrics
from sentinel.components.clocks.record import ClockViolations
from sentinel.components.device import metrics as device_metrics
from sentinel.components.exposition import (
    GpuRow,
    KeptFamilies,
    MetricsView,
    Writer,
    forget_blocks,
    write_families,
)
from sentinel.wire import GpuInfo, GpuSample

names = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,20}", fullmatch=True).filter(lambda n: not n.startswith("__"))
texts = st.text(max_size=12)
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**20), 10**20))


@st.composite
def families(draw: st.DrawFn) -> list[Metric]:
    out: list[Metric] = []
    for _ in range(draw(st.integers(0, 4))):
        name = draw(names)
        doc = draw(texts)
        labels = draw(st.lists(names, max_size=3, unique=True))
        kind = draw(st.sampled_from(["counter", "gauge", "info", "unknown"]))
        rows = draw(st.lists(st.tuples(st.lists(texts, min_size=len(labels), max_size=len(labels)), values)))
        stamp = draw(st.one_of(st.none(), st.floats(0, 2e9)))
        if kind == "counter":
            created = draw(st.one_of(st.none(), st.floats(0, 2e9)))
            counter = CounterMetricFamily(name, doc, labels=labels)
            for label_values, value in rows:
                counter.add_metric(label_values, abs(float(value)) if value == value else 0.0, created, stamp)
            out.append(counter)
        elif kind == "gauge":
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            for label_values, value in rows:
                gauge.add_metric(label_values, value, stamp)
            out.append(gauge)
        elif kind == "info":
            info = InfoMetricFamily(name, doc, labels=labels)
            for label_values, _ in rows:
                info.add_metric(label_values, {"version": draw(texts)}, stamp)
            out.append(info)
        else:
            unknown = UnknownMetricFamily(name, doc, labels=labels)
            for label_values, value in rows:
                unknown.add_metric(label_values, value, stamp)
            out.append(unknown)
    return out


class _Fixed:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


@settings(max_examples=300, deadline=None)
@given(families())
def test_families_are_written_as_generate_latest_writes_them(metrics: list[Metric]) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(metrics))
    out = Writer()
    write_families(out, registry.collect())
    assert out.text().encode() == generate_latest(registry)


@settings(max_examples=200, deadline=None)
@given(st.lists(families(), min_size=1, max_size=4), st.data())
def test_families_kept_between_scrapes_are_written_as_generate_latest_writes_them(
    scrapes: list[list[Metric]], data: st.DataObject
) -> None:
    """A writer keeping its families' text across scrapes writes each scrape as generate_latest does, also
    when a scrape repeats the last one's families."""
    kept: KeptFamilies = {}
    for metrics in scrapes:
        for current in (metrics, metrics if data.draw(st.booleans()) else []):
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_Fixed(current))
            out = Writer()
            write_families(out, registry.collect(), kept)
            assert out.text().encode() == generate_latest(registry)


def test_a_kept_family_follows_the_sign_of_zero() -> None:
    kept: KeptFamilies = {}
    for value in (-0.0, 0.0, -0.0):
        gauge = GaugeMetricFamily("g", "a gauge")
        gauge.add_metric([], value)
        out = Writer()
        write_families(out, [gauge], kept)
        assert out.text().endswith(f"g {value!r}\n")


@settings(max_examples=100, deadline=None)
@given(st.lists(values, max_size=30))
def test_a_line_writes_each_value_as_its_repr_however_often_it_was_written(row: list[float]) -> None:
    """Values repeat from one scrape to the next (and -0.0 equals 0.0, 1 equals 1.0): each line is still
    written from its own value."""
    for value in [*row, *row, -0.0, 0.0, 1, 1.0, -0.0]:
        out = Writer()
        out.line("g", 'gpu="0"', value)
        finite = value - value == 0
        text = repr(value) if finite else ("NaN" if value != value else ("+Inf" if value > 0 else "-Inf"))
        assert out.text() == f'g{{gpu="0"}} {text}\n'


zeros_and_more = st.sampled_from([0.0, -0.0, 1.0, 62.5, 1e7, float("nan"), None])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(["power_cap", "sw_thermal", "hw_slowdown", "unknown"]), max_size=3),
            zeros_and_more,
            st.sampled_from(["ok", "lost", "unresponsive"]),
            st.one_of(st.none(), st.integers(0, 3), st.just(-0.0)),
        ),
        min_size=1,
        max_size=6,
    )
)
@example([(["power_cap"], 0.0, "ok", 0), ([], -0.0, "ok", -0.0), (["power_cap"], 0.0, "lost", None)])
def test_gpu_families_kept_between_scrapes_are_written_as_afresh(
    scrapes: list[tuple[list[str], float | None, str, float | None]],
) -> None:
    """Each scrape of changing readings (throttle reasons, values with either zero, states, violation
    times) writes what a first scrape of the same readings writes."""
    for throttle, value, state, violation in scrapes:
        sample = GpuSample(
            gpu=0,
            t=1.0,
            throttle=throttle,
            temp_c=value,
            util_gpu_pct=value,
            violations=ClockViolations(reference_us=1, power=violation, thermal=0),  # type: ignore[arg-type]
        )
        info = GpuInfo(index=0, uuid="GPU-0", pci_bus="0000:18:00", name="H100")
        rows = [GpuRow(index=0, labels='gpu="0"', info=info, state=state, fast=sample, slow=sample)]  # type: ignore[arg-type]
        kept = _render_gpu(rows)  # with what the scrapes before kept
        forget_blocks()
        assert kept == _render_gpu(rows)


def _render_gpu(rows: list[GpuRow]) -> str:
    out = Writer()
    for render in (clocks_metrics.render, device_metrics.render):
        render(out, MetricsView(rows))
    return out.text()


def test_kept_gpu_lines_are_one_text_a_place_however_the_values_change() -> None:
    """What is kept between scrapes does not grow with the agent's uptime: a changing reading replaces its
    text (one per family and GPU), and the value texts stay bounded."""
    forget_blocks()
    info = GpuInfo(index=0, uuid="GPU-0", pci_bus="0000:18:00", name="H100")
    sizes = []
    for tick in range(300):
        value = 40.0 + tick / 7
        sample = GpuSample(gpu=0, t=float(tick), temp_c=value, util_gpu_pct=value, power_w=value)
        rows = [GpuRow(index=0, labels='gpu="0"', info=info, state="ok", fast=sample, slow=sample)]
        text = _render_gpu(rows)
        assert f'sentinel_gpu_temperature_celsius{{gpu="0"}} {value!r}\n' in text
        sizes.append(len(exposition._blocks))
    assert sizes[-1] == sizes[1]
    assert len(exposition._value_texts) <= exposition._MAX_VALUE_TEXTS
