"""scripts/gpu-check's comparison: sentinel's `agent once --json` (on the fake NVML) vs an nvidia-smi -q -x
document of the same two GPUs. Not run on a real GPU here: no GPU in CI."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.cli import main
from sentinel.components.device.smi_check import REASON_TAGS, SPECS, VIOLATION_TAGS, compare, render
from tests.agent.fakenvml import FakeNvml

XML = (Path(__file__).parent / "data" / "nvidia_smi_q.xml").read_text()


def _like_the_xml(fake: FakeNvml) -> None:
    """GPU 0 of the XML is power-capped now and has been for 91.4 s."""
    fake.gpus[0].reasons = pynvml.nvmlClocksEventReasonSwPowerCap
    fake.gpus[0].violations[0] = 91_403_239_000


def _once(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    main(["agent", "once", "--json", "--sysfs-root", "/nonexistent"])
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_same_host_same_values(fake_nvml: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    _like_the_xml(fake_nvml)
    rows = compare(_once(capsys), XML)
    fields = {r.field for r in rows}
    assert {"uuid", "pci_bus", "vbios", "driver", "pcie_width", "temp_c", "mem_temp_c", "power_w"} <= fields
    assert {"clock_event.sw_power_cap", "clock_event.gpu_idle", "clock_violation_s.power"} <= fields
    assert [r for r in rows if r.differs] == []
    assert "0 differ" in render(rows)


def test_a_wrong_reading_is_flagged(fake_nvml: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    _like_the_xml(fake_nvml)
    fake_nvml.gpus[1].vbios = "96.00.74.00.01"
    fake_nvml.gpus[1].pcie_width = (8, 16)
    fake_nvml.gpus[0].power_mw = 300_000
    rows = compare(_once(capsys), XML)
    flagged = {(r.gpu, r.field) for r in rows if r.differs}
    assert flagged == {(1, "vbios"), (1, "pcie_width"), (0, "power_w")}
    assert "DIFFERS" in render(rows)


def test_clock_event_reasons_and_violation_time_against_nvidia_smi(
    fake_nvml: FakeNvml, capsys: pytest.CaptureFixture[str]
) -> None:
    _like_the_xml(fake_nvml)
    fake_nvml.gpus[0].reasons |= pynvml.nvmlClocksEventReasonHwThermalSlowdown  # sentinel says so, smi not
    fake_nvml.gpus[0].violations[0] = 200_000_000_000  # 200 s vs nvidia-smi's 91.4 s
    fake_nvml.gpus[0].violations[2] = 3_000_000_000  # 3 s vs 0: within what moves between the two reads
    rows = {(r.gpu, r.field): r for r in compare(_once(capsys), XML)}
    assert rows[(0, "clock_event.hw_thermal_slowdown")].differs
    assert (
        rows[(0, "clock_event.hw_thermal_slowdown")].sentinel,
        rows[(0, "clock_event.hw_thermal_slowdown")].smi,
    ) == ("active", "Not Active")
    assert not rows[(0, "clock_event.sw_power_cap")].differs
    assert (
        rows[(0, "clock_violation_s.power")].differs
        and rows[(0, "clock_violation_s.power")].sentinel == "200.000"
    )
    assert not rows[(0, "clock_violation_s.sync_boost")].differs
    assert (1, "clock_event.sw_power_cap") not in rows  # GPU 1's nvidia-smi section has no such field


_TEXT = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30),  # what XML can carry
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: f"{f} us"),
    st.sampled_from(["N/A", "Active", "Not Active", "[N/A]", "16x", "", "Not Supported"]),
)
_PATHS = (
    [alternative for _, _, path, _, _ in SPECS for alternative in path.split("|")]
    + [f"clocks_event_reasons/clocks_event_reason_{tag}" for tag in REASON_TAGS.values()]
    + [
        f"clocks_event_reasons_counters/clocks_event_reasons_counters_{tag}"
        for tag in VIOLATION_TAGS.values()
    ]
)


def _xml(values: dict[str, str]) -> str:
    gpu = ET.Element("gpu", id="00000000:18:00.0")
    for path, text in values.items():
        node = gpu
        for part in path.split("/"):
            child = node.find(part)
            node = child if child is not None else ET.SubElement(node, part)
        node.text = text
    root = ET.Element("nvidia_smi_log")
    root.append(gpu)
    return ET.tostring(root, encoding="unicode")


@given(
    st.dictionaries(st.sampled_from(_PATHS), _TEXT, max_size=len(_PATHS)),
    st.lists(st.sampled_from(list(REASON_TAGS)), max_size=4),
    st.dictionaries(st.sampled_from(["power", "sync_boost"]), st.integers(0, 2**64), max_size=2),
)
def test_any_nvidia_smi_document_is_compared_without_raising(
    values: dict[str, str], throttle: list[str], violations: dict[str, int]
) -> None:
    """nvidia-smi's output is outside input: garbage numbers, N/A, missing sections never break the check."""
    once = {
        "inventory": [{"index": 0, "pci_bus": "0000:18:00", "uuid": "GPU-0", "driver": "550"}],
        "samples": [{"gpu": 0, "temp_c": 64.0, "throttle": throttle, "violations": violations}],
        "unsupported": [],
    }
    rows = compare(once, _xml(values))
    assert all(isinstance(r.differs, bool) for r in rows)
    assert render(rows).endswith("differ\n")
