"""NVLink error counters through NVML's batched field values, against the fake NVML at the ABI."""

from __future__ import annotations

import math

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from sentinel.agent.nvml import NvmlSource
from sentinel.components.exposition import GpuRow, MetricsView, Writer
from sentinel.components.nvlink import metrics as nvlink_metrics
from sentinel.components.nvlink.nvml import decode_ber
from sentinel.components.nvml_read import GpuLostError, field_number
from sentinel.wire import GpuSample
from tests.agent.fakenvml import FakeGpu, FakeNvml

DL_CRC = pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC
SYMBOL = pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS
EFFECTIVE = pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS
SYMBOL_BER = pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER
EFFECTIVE_BER = pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER
FAILED = pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS


def _ber(mantissa: int, exponent: int) -> int:
    return (mantissa << 8) | exponent


def test_eighteen_hopper_links_in_one_field_values_call_per_gpu(fake_nvml: FakeNvml) -> None:
    gpu = fake_nvml.gpus[0]
    gpu.nvlinks = dict.fromkeys(range(18), True)
    gpu.nvlink_errors = {
        (3, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 40,
        (3, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA): 9,
        (3, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 12,
        (17, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY): 2,
        (17, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA): 5,  # NVML has no data-CRC field for links 12-17
    }
    source = NvmlSource()
    source.open()
    sample = source.read_slow(0, 1.0)
    assert fake_nvml.calls[(0, "nvmlDeviceGetFieldValues")] == 1
    assert fake_nvml.calls[(0, "nvmlDeviceGetNvLinkErrorCounter")] == 0
    assert sample.nvlink is not None and [link.link for link in sample.nvlink] == list(range(18))
    three, last = sample.nvlink[3], sample.nvlink[17]
    assert (three.crc_errors, three.crc_data_errors, three.replay_errors, three.recovery_errors) == (
        40,
        9,
        12,
        0,
    )
    assert (last.recovery_errors, last.crc_data_errors) == (2, None)
    assert three.symbol_errors is None and three.effective_ber is None  # Hopper has no Blackwell fields
    # the per-link fields were asked with the link as their scope id
    _, asked = fake_nvml.field_calls[-1]
    assert (DL_CRC, 17) in asked and (DL_CRC, 18) not in asked


def test_not_supported_is_remembered_per_gpu_and_field(fake_nvml: FakeNvml) -> None:
    source = NvmlSource()
    source.open()
    source.read_slow(0, 1.0)
    first = set(fake_nvml.field_calls[-1][1])
    assert (SYMBOL, 0) in first  # asked once ...
    source.read_slow(0, 2.0)
    second = set(fake_nvml.field_calls[-1][1])
    assert (SYMBOL, 0) not in second and (DL_CRC, 0) in second  # ... then never again on this GPU
    assert (0, "nvlink0.symbol_errors") in source.unsupported()
    source.read_slow(1, 3.0)
    assert (SYMBOL, 0) in set(fake_nvml.field_calls[-1][1])  # another GPU is asked for itself


def test_blackwell_symbol_and_effective_errors_with_their_bit_error_rates(fake_nvml: FakeNvml) -> None:
    gpu = fake_nvml.gpus[1]
    gpu.generation = "blackwell"
    gpu.nvlink_fields = {
        (SYMBOL, 1): 123_456,
        (EFFECTIVE, 1): 7,
        (FAILED, 1): 1,
        (SYMBOL_BER, 1): _ber(3, 9),
        (EFFECTIVE_BER, 1): _ber(1, 15),
    }
    source = NvmlSource()
    source.open()
    sample = source.read_slow(1, 1.0)
    assert sample.nvlink is not None
    link = sample.nvlink[1]
    assert (link.symbol_errors, link.effective_errors, link.recovery_failed) == (123_456, 7, 1)
    assert link.symbol_ber == pytest.approx(3e-9) and link.effective_ber == pytest.approx(1e-15)
    assert link.crc_errors is None and link.replay_errors is None  # removed on Blackwell
    view = MetricsView(
        rows=[GpuRow(index=1, labels='gpu="1"', info=source.open()[1], state="ok", fast=sample, slow=sample)]
    )
    out = Writer()
    nvlink_metrics.render(out, view)
    families = {f.name: f for f in text_string_to_metric_families(out.text())}
    errors = {
        (s.labels["link"], s.labels["type"]): s.value for s in families["sentinel_gpu_nvlink_errors"].samples
    }
    assert errors[("1", "symbol")] == 123_456 and errors[("1", "effective")] == 7
    assert ("1", "crc") not in errors  # not reported is not exported as 0
    ber = {
        (s.labels["link"], s.labels["type"]): s.value
        for s in families["sentinel_gpu_nvlink_bit_error_rate"].samples
    }
    assert ber[("1", "symbol")] == pytest.approx(3e-9)


def test_a_value_answering_gpu_is_lost_marks_the_gpu_lost(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = NvmlSource()
    source.open()
    original = fake_nvml._field
    monkeypatch.setattr(
        fake_nvml, "_field", lambda gpu, field, scope: -15 if field == DL_CRC else original(gpu, field, scope)
    )
    with pytest.raises(GpuLostError):
        source.read_slow(0, 1.0)


def test_a_per_value_error_is_counted_and_the_rest_still_read(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors: list[tuple[str, str]] = []
    source = NvmlSource(on_error=lambda fn, err: errors.append((fn, err)))
    source.open()
    fake_nvml.gpus[0].nvlink_errors = {(1, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 4}
    original = fake_nvml._field
    monkeypatch.setattr(
        fake_nvml,
        "_field",
        lambda gpu, field, scope: -999 if (field, scope) == (DL_CRC, 1) else original(gpu, field, scope),
    )
    sample = source.read_slow(0, 1.0)
    assert sample.nvlink is not None
    assert sample.nvlink[1].crc_errors is None and sample.nvlink[1].replay_errors == 4
    assert errors and errors[0][0] == "nvmlDeviceGetFieldValues"
    assert (0, "nvlink1.crc_errors") not in source.unsupported()  # an error is not NOT_SUPPORTED


def test_ber_decoding() -> None:
    assert decode_ber(_ber(5, 12)) == pytest.approx(5e-12)
    assert decode_ber(0) == 0.0
    assert decode_ber(_ber(15, 255)) == pytest.approx(15e-255)


def test_the_fake_answers_each_value_with_its_own_return_code() -> None:
    """At the ABI, a field-values call succeeds while single values fail: pynvml hands back the array."""
    fake = FakeNvml([FakeGpu(index=0, nvlinks={0: True})])
    fake.lib.nvmlInitWithFlags(0)
    mp = pytest.MonkeyPatch()
    fake.install(mp)
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        values = pynvml.nvmlDeviceGetFieldValues(handle, [(DL_CRC, 0), (DL_CRC, 5), (SYMBOL, 0)])
        assert [int(v.nvmlReturn) for v in values] == [0, pynvml.NVML_ERROR_INVALID_ARGUMENT, 3]
        assert int(values[0].valueType) == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    finally:
        mp.undo()


@given(st.integers(0, 2**32 - 1))
def test_any_ber_code_decodes_to_a_finite_non_negative_rate(raw: int) -> None:
    rate = decode_ber(raw)
    assert math.isfinite(rate) and rate >= 0.0
    assert rate <= 15.0  # the mantissa is 4 bits, the exponent only ever divides


@given(st.integers(-5, 12), st.integers(0, 2**64 - 1), st.floats(allow_nan=True))
def test_any_field_value_type_decodes_or_is_refused_never_guessed(kind: int, raw: int, real: float) -> None:
    value = pynvml.c_nvmlFieldValue_t()
    value.valueType = kind
    if kind == pynvml.NVML_VALUE_TYPE_DOUBLE:
        value.value.dVal = real
    else:
        value.value.ullVal = raw
    number = field_number(value)
    if 0 <= kind <= 6:
        assert number is not None
    else:
        assert number is None


def test_a_new_slow_sample_is_scraped_with_its_own_counters(fake_nvml: FakeNvml) -> None:
    """The NVLink text is kept between scrapes of one slow sample; the next slow read shows its counters."""
    gpu = fake_nvml.gpus[1]
    gpu.nvlink_fields = {(SYMBOL, 1): 5}
    gpu.generation = "blackwell"
    source = NvmlSource()
    info = source.open()[1]

    def scrape(sample: GpuSample) -> dict[tuple[str, str], float]:
        view = MetricsView(
            rows=[GpuRow(index=1, labels='gpu="1"', info=info, state="ok", fast=sample, slow=sample)]
        )
        out = Writer()
        nvlink_metrics.render(out, view)
        families = {f.name: f for f in text_string_to_metric_families(out.text())}
        return {
            (s.labels["link"], s.labels["type"]): s.value
            for s in families["sentinel_gpu_nvlink_errors"].samples
        }

    first = source.read_slow(1, 1.0)
    assert scrape(first)[("1", "symbol")] == 5
    gpu.nvlink_fields = {(SYMBOL, 1): 9}
    assert scrape(first)[("1", "symbol")] == 5  # the same slow sample: the same counters
    assert scrape(source.read_slow(1, 11.0))[("1", "symbol")] == 9


def test_a_host_with_no_gpu_yet_still_gets_the_nvlink_families() -> None:
    from sentinel.components.exposition import MetricsView, Writer
    from sentinel.components.nvlink import metrics

    out = Writer()
    metrics.render(out, MetricsView([]))
    assert "# TYPE sentinel_gpu_nvlink_up gauge" in out.text()
