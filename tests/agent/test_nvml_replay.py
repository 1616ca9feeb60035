"""Recorded GPUs: `agent once --nvml-replay` over nvidia-smi -q -x fixtures the project wrote (tests/agent/data/
nvsmi/, one per fault kind plus healthy H100, A100 and GB200 hosts of several driver generations), the
recording at the library boundary (pynvml runs), and the host's verdict for each."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from sentinel.agent.nvml import NvmlSource
from sentinel.agent.nvml.recording import load
from sentinel.agent.nvml.replay import ReplayLibrary, mapping_markdown
from sentinel.cli import main
from sentinel.components.device.smi_check import compare, render
from sentinel.components.nvml_read import GpuUnreachable

DATA = Path(__file__).parent / "data" / "nvsmi"
ROOT = Path(__file__).parents[2]

#: fixture → (fit, the unfit reasons "GPU <index>: <kind> <reason> -> <action>")
EXPECTED: dict[str, tuple[bool, set[str]]] = {
    "healthy-h100.xml": (True, set()),
    "healthy-a100.xml": (True, set()),
    "healthy-gb200.xml": (True, set()),
    "rows-pending-remap.xml": (False, {"GPU 0: faulty row_remap_pending_uncorrectable -> reset_gpu"}),
    "remap-failure.xml": (False, {"GPU 0: faulty row_remap_failure -> rma"}),
    "uncorrectable-ecc.xml": (False, {"GPU 0: faulty ecc_uncorrected_volatile -> reset_gpu"}),
    # slowdown is no unfitness: the reasons are read (below) and the straggler detector names them
    "thermal-slowdown.xml": (True, set()),
    "power-slowdown.xml": (True, set()),
    "pcie-below-max.xml": (False, {"GPU 0: degraded pcie_link_degraded -> drain"}),
    # a few fields "Unknown Error", the others read: no verdict on what cannot be read
    "unknown-error.xml": (True, set()),
    # every reading of GPU 1 "Unknown Error": the driver serves nothing on it (the device rule's why)
    "all-unknown-error.xml": (False, {"GPU 1: faulty gpu_unavailable -> reboot"}),
    "retired-pages.xml": (False, {"GPU 0: degraded retired_pages_pending -> reset_gpu"}),
    "gpu-requires-reset.xml": (False, {"GPU 0: faulty driver_recovery_action -> reset_gpu"}),
    "fabric-in-progress.xml": (False, {"GPU 0: faulty fabric_not_registered -> reset_gpu"}),
    "recovery-action.xml": (False, {"GPU 0: faulty driver_recovery_action -> reset_gpu"}),
}


def _unfit(health: dict[str, Any]) -> set[str]:
    """The reasons without the UUID (stable across fixture edits)."""
    out = set()
    for line in health["reasons"]:
        where, _, what = line.partition(": ")
        out.add(f"{' '.join(where.split()[:2])}: {what}")
    return out


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Every fixture's `agent once --nvml-replay` object (each run once for the module)."""
    sysfs = tmp_path_factory.mktemp("sysfs")
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(DATA.glob("*.xml")):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            code = main(["agent", "once", "--json", "--sysfs-root", str(sysfs), "--nvml-replay", str(path)])
        assert code == 0, path.name
        found[path.name] = json.loads(buffer.getvalue())
    yield found


def test_every_fixture_has_its_expected_verdict() -> None:
    assert set(EXPECTED) == {p.name for p in DATA.glob("*.xml")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_verdict(name: str, outputs: dict[str, dict[str, Any]]) -> None:
    fit, reasons = EXPECTED[name]
    out = outputs[name]
    health = out["health"]
    assert health["cannot_tell"] is None
    assert health["fit"] is fit
    assert _unfit(health) == reasons
    assert [g["index"] for g in health["gpus"]] == [i["index"] for i in out["inventory"]]
    assert [g["uuid"] for g in health["gpus"]] == [i["uuid"] for i in out["inventory"]]
    unreachable = {1} if name == "all-unknown-error.xml" else set()
    assert {g["index"] for g in health["gpus"] if g["state"] != "ok"} == unreachable
    assert all(g["state"] == "unavailable" for g in health["gpus"] if g["index"] in unreachable)


def test_retired_pages_pending_is_unfit(outputs: dict[str, dict[str, Any]]) -> None:
    health = outputs["retired-pages.xml"]["health"]
    assert _unfit(health) == {"GPU 0: degraded retired_pages_pending -> reset_gpu"}


def test_retired_pages_are_read_from_an_older_driver(outputs: dict[str, dict[str, Any]]) -> None:
    """V100 on R470: single/double-bit ECC per location, retired pages, no row remapper, no fabric."""
    out = outputs["retired-pages.xml"]
    sample = out["samples"][0]
    assert sample["retired"] == {"single_bit": 1, "double_bit": 2, "pending": True}
    assert sample["ecc"] == {
        "volatile_corrected": 0,
        "volatile_uncorrected": 0,
        "aggregate_corrected": 9,
        "aggregate_uncorrected": 2,
        "dram_uncorrected": 2,
    }
    assert "remap" not in sample and "fabric" not in sample
    assert {"0:remapped_rows", "0:fabric", "0:ecc_sram", "0:recovery_action"} <= set(out["unsupported"])


def test_generations_readings(outputs: dict[str, dict[str, Any]]) -> None:
    """What each driver generation's element names answer, as the agent reports it."""
    thermal = outputs["thermal-slowdown.xml"]["samples"][0]  # R470: clocks_throttle_reasons, power_readings
    assert thermal["throttle"] == ["sw_thermal_slowdown", "hw_thermal_slowdown"]
    assert (thermal["temp_c"], thermal["sm_clock_mhz"], thermal["power_limit_w"]) == (91.0, 1095.0, 400.0)
    power = outputs["power-slowdown.xml"]["samples"][0]  # R550: clocks_event_reasons and their counters
    assert power["throttle"] == ["sw_power_cap", "hw_power_brake_slowdown"]
    assert power["violations"]["power"] == 913_402_239_000
    assert power["violations"]["reference_us"] == 1_796_119_200_000_000  # the recording's own time
    gb200 = outputs["healthy-gb200.xml"]  # R570: average_power_draw, fabric with clique and cluster
    assert [g["pci_bus"] for g in gb200["inventory"]] == [
        "0008:01:00",
        "0009:01:00",
        "0018:01:00",
        "0019:01:00",
    ]
    assert gb200["samples"][0]["fabric"] == {
        "state": "completed",
        "clique_id": 32766,
        "cluster_uuid": "c7a4f1d2-5b3e-4c69-9e0d-2f8b61a4d5e3",
        "health_mask": 0b10101010,  # every 2-bit health field reads FALSE (2): nothing degraded
    }
    assert gb200["samples"][0]["power_w"] == 612.34
    assert gb200["samples"][0]["pids"] == [7000]
    h100 = outputs["healthy-h100.xml"]["samples"][1]
    assert (h100["mem_used_bytes"], h100["mem_total_bytes"]) == (61169 * 2**20, 81559 * 2**20)
    assert h100["remap"] == {
        "hist_max": 2560,
        "hist_high": 0,
        "hist_partial": 0,
        "hist_low": 0,
        "hist_none": 0,
    }
    assert h100["recovery_action"] == "none" and h100["mem_temp_c"] == 45.0
    assert outputs["remap-failure.xml"]["samples"][0]["remap"]["failure"] is True


def test_error_strings_are_the_errors_a_driver_returns(outputs: dict[str, dict[str, Any]]) -> None:
    unknown = outputs["unknown-error.xml"]
    assert "nvml: nvmlDeviceGetRemappedRows: unknown" in unknown["errors"]
    assert "nvml: nvmlDeviceGetTemperature: unknown" in unknown["errors"]
    assert "temp_c" not in unknown["samples"][0] and "remap" not in unknown["samples"][0]
    reset = outputs["gpu-requires-reset.xml"]
    assert "nvml: nvmlDeviceGetTemperature: resetrequired" in reset["errors"]
    assert reset["samples"][0]["recovery_action"] == "gpu_reset"


@pytest.fixture
def a100_r470() -> Iterator[ReplayLibrary]:
    library = ReplayLibrary(load(DATA / "healthy-a100.xml"))
    with library.installed():
        pynvml.nvmlInit()
        yield library
        pynvml.nvmlShutdown()


def test_the_library_boundary_answers_as_the_driver_would(a100_r470: ReplayLibrary) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlSystemGetDriverVersion() == "470.239.06"
    assert pynvml.nvmlDeviceGetPciInfo(h).busId == "00000000:0F:00.0"
    assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(h) == 16
    # an R470 library has no clock-event-reasons call: FUNCTION_NOT_FOUND, the throttle call answers
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0
    # absent from the recording (fabric before R535) and N/A (retired pages on Ampere): NOT_SUPPORTED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuFabricInfo(h, pynvml.byref(pynvml.c_nvmlGpuFabricInfo_t()))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPages(h, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(pynvml.c_void_p(0x1234))


def test_error_strings_at_the_boundary() -> None:
    library = ReplayLibrary(load(DATA / "gpu-requires-reset.xml"))
    with library.installed():
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_ResetRequired):
            pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        with pytest.raises(pynvml.NVMLError_ResetRequired):
            pynvml.nvmlDeviceGetRemappedRows(h)
        assert pynvml.nvmlDeviceGetUUID(h) == "GPU-7e090000-7d3e-4f50-8a61-7e090000c0ffee"
    library = ReplayLibrary(load(DATA / "unknown-error.xml"))
    with library.installed():
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_Unknown):
            pynvml.nvmlDeviceGetUtilizationRates(h)


def test_the_library_is_restored_after_the_replay() -> None:
    before = pynvml.nvmlLib
    with ReplayLibrary(load(DATA / "healthy-h100.xml")).installed():
        assert pynvml.nvmlLib is not before
    assert pynvml.nvmlLib is before


def test_docs_carry_the_mapping_table() -> None:
    doc = (ROOT / "docs" / "agent.md").read_text()
    begin = "<!-- generated from sentinel.agent.nvml.replay.MAPPING: do not edit by hand -->\n"
    table = doc.split(begin, 1)[1].split("<!-- end of generated table -->", 1)[0]
    assert table == mapping_markdown()


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.xml")))
def test_gpu_check_comparison_on_each_fixture(name: str, outputs: dict[str, dict[str, Any]]) -> None:
    """scripts/gpu-check's comparison with the recording on both sides: two readings of one XML (the
    replay's mapping and the check's own paths) agree on every field both report."""
    rows = compare(outputs[name], (DATA / name).read_text())
    assert [r for r in rows if r.differs] == []
    fields = {r.field for r in rows}
    assert {"uuid", "pci_bus", "vbios", "driver", "pcie_width", "sm_clock_max_mhz"} <= fields
    assert "power_w" in fields or name in (
        "unknown-error.xml",
        "gpu-requires-reset.xml",
        "all-unknown-error.xml",
    )
    assert render(rows).endswith(" 0 differ\n")


def test_gpu_check_flags_a_reading_that_differs(outputs: dict[str, dict[str, Any]]) -> None:
    once = json.loads(json.dumps(outputs["healthy-h100.xml"]))
    once["samples"][1]["pcie_link"]["width"] = 8
    once["inventory"][0]["vbios"] = "96.00.00.00.00"
    rows = compare(once, (DATA / "healthy-h100.xml").read_text())
    assert {(r.gpu, r.field) for r in rows if r.differs} == {(1, "pcie_width"), (0, "vbios")}


def test_gpu_check_script_replays_a_fixture() -> None:
    script = ROOT / "scripts" / "gpu-check"
    done = subprocess.run(
        [str(script), "--replay", str(DATA / "power-slowdown.xml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "clock_event.sw_power_cap" in done.stdout
    assert done.stdout.rstrip().endswith("0 differ")
    refused = subprocess.run(
        [str(script), "--replay", "/nonexistent/recording.xml"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert refused.returncode == 2
    assert "/nonexistent/recording.xml: cannot read" in refused.stderr


def test_the_agent_reads_the_recording_through_its_own_source() -> None:
    """NvmlSource over the recording: the inventory is the XML's GPUs in order, as NVML numbers them."""
    with ReplayLibrary(load(DATA / "healthy-gb200.xml")).installed():
        source = NvmlSource()
        inventory = source.open()
        try:
            assert [g.uuid for g in inventory] == [
                f"GPU-6b20{i:04x}-7d3e-4f50-8a61-6b20{i:04x}c0ffee" for i in range(4)
            ]
            assert {g.name for g in inventory} == {"NVIDIA GB200"}
            assert inventory[0].memory_total_bytes == 189471 * 2**20
            sample = source.read_slow(3, 0.0)
            assert sample.pcie_link is not None and sample.pcie_link.width_max == 16
        finally:
            source.close()


def test_a_gpu_answering_unknown_error_to_every_call_is_unreachable() -> None:
    """Every call failing (none answered) is the GPU's state, not a read with gaps; a recording where some
    calls still answer is no such thing (unknown-error.xml)."""
    with ReplayLibrary(load(DATA / "all-unknown-error.xml")).installed():
        source = NvmlSource()
        source.open()
        try:
            assert source.read_slow(0, 0.0).temp_c is not None  # its healthy neighbour
            with pytest.raises(GpuUnreachable, match="nvmlDeviceGetUtilizationRates: Unknown Error"):
                source.read_fast(1, 0.0)
            with pytest.raises(GpuUnreachable):
                source.read_slow(1, 1.0)
        finally:
            source.close()
    with ReplayLibrary(load(DATA / "unknown-error.xml")).installed():
        source = NvmlSource()
        source.open()
        try:
            assert source.read_slow(0, 0.0).temp_c is None  # left empty, the GPU still answers the rest
        finally:
            source.close()
