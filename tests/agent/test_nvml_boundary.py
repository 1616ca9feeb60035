"""What a real fleet does to NVML that the fake never did before, at the library boundary: GPUs unbound and
rebound while the agent runs (stale handles), a driver reload, nvmlInit with zero GPUs, no library at all,
and functions missing from an older library or nvidia-ml-py. The real agent runs inline on each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pynvml
import pytest

from sentinel.agent.agent import Agent
from sentinel.agent.nvml import NvmlSource
from sentinel.cli import main
from sentinel.config.agent import AgentConfig
from tests.agent.conftest import make_config
from tests.agent.fakenvml import GPU_IS_LOST, FakeGpu, FakeNvml

UNINITIALIZED = 1
INVALID_ARGUMENT = 2
UNKNOWN = 999


def _config(tmp_path: Path, expected: int = 0) -> AgentConfig:
    return make_config(
        tmp_path,
        agent={"state_dir": ""},
        collect={
            "tick_s": 1.0,
            "slow_tick_s": 1.0,
            "expected_gpus": expected,
            "nvml_events": False,
            "disabled": ["kmsg", "logs", "jobs", "nccl_ras", "probe", "fr_dumps", "ib"],
        },
        metrics={"listen_host": "127.0.0.1"},  # the health rules run (nothing listens: inline)
    )


class Host:
    """An inline agent over the fake NVML, stepped one slow tick at a time."""

    def __init__(self, tmp_path: Path, expected: int = 0) -> None:
        self.now = 100.0
        self.errors: list[tuple[str, str]] = []
        self.source = NvmlSource(on_error=lambda fn, err: self.errors.append((fn, err)))
        self.agent = Agent(_config(tmp_path, expected), self.source, clock=lambda: self.now, inline=True)

    def tick(self) -> dict[str, Any]:
        self.now += 1.0
        self.agent.step_inline(self.now)
        return self.agent.health_report()


def _reasons(report: dict[str, Any]) -> dict[int, list[str]]:
    return {g["index"]: [r["reason"] for r in g["reasons"]] for g in report["gpus"]}


def _states(host: Host) -> dict[int, str]:
    return {i: v.state for i, v in host.agent.gpus.items()}


@pytest.mark.parametrize("stale", [INVALID_ARGUMENT, GPU_IS_LOST], ids=["invalid-argument", "gpu-is-lost"])
def test_a_gpu_unbound_and_rebound_is_read_on_its_new_handle(
    fake_nvml: FakeNvml, tmp_path: Path, stale: int
) -> None:
    host = Host(tmp_path)
    assert host.tick()["fit"] is True
    fake_nvml.unbind(1)
    for _ in range(5):  # gpu_lost waits a few seconds for the Xid that would explain it
        unbound = host.tick()
    assert _states(host) == {0: "ok", 1: "lost"}
    assert _reasons(unbound) == {0: [], 1: ["gpu_lost"]}
    fake_nvml.rebind(1, stale_error=stale)
    fake_nvml.gpus[1].temp = 55
    back = host.tick()
    assert _states(host) == {0: "ok", 1: "ok"}
    assert back["fit"] is True and _reasons(back) == {0: [], 1: []}  # no stale verdict
    sample = host.agent.gpus[1].slow
    assert sample is not None and sample.temp_c == 55.0 and sample.remap is not None  # a full reading
    assert host.tick()["fit"] is True  # and it stays read on the new handle
    assert host.agent.gpu_collector is not None and host.agent.gpu_collector.opens == 1  # no re-init needed


def test_a_stale_handle_answering_uninitialized_reopens_nvml(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.tick()
    fake_nvml.gpus[0].remap = (0, 1, 1, 0)  # a pending remap: unfit
    assert _reasons(host.tick())[0] == ["row_remap_pending_uncorrectable"]
    fake_nvml.rebind(0, stale_error=UNINITIALIZED)  # the driver reloaded: every old handle is gone
    fake_nvml.gpus[0].remap = (0, 1, 0, 0)  # the reset remapped the row
    down = host.tick()
    assert down["fit"] is None and "not open" in down["cannot_tell"]
    for _ in range(3):  # the re-open waits its backoff (one slow tick)
        report = host.tick()
    assert report["fit"] is True and _reasons(report) == {0: [], 1: []}
    assert host.agent.gpu_collector is not None and host.agent.gpu_collector.opens == 2


def test_another_gpu_at_the_index_reopens_the_inventory(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    host = Host(tmp_path)
    host.tick()
    fake_nvml.rebind(1, uuid="GPU-99999999-0000-0000-0000-000000000000")
    assert host.tick()["fit"] is None
    for _ in range(3):
        report = host.tick()
    assert [g["uuid"] for g in report["gpus"]][1] == "GPU-99999999-0000-0000-0000-000000000000"
    assert report["fit"] is True


def test_nvml_with_zero_gpus_is_never_fit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeNvml([]).install(monkeypatch)
    unknown = Host(tmp_path / "a").tick()
    assert unknown["fit"] is None and "sees no GPU" in unknown["cannot_tell"]
    missing = Host(tmp_path / "b", expected=8).tick()
    assert missing["fit"] is False
    assert [(r["reason"], r["action"]) for r in missing["host_reasons"]] == [("gpus_missing", "reboot")]


def test_nvml_with_fewer_gpus_than_expected_is_unfit(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    report = Host(tmp_path, expected=4).tick()
    assert report["fit"] is False
    assert report["host_reasons"][0]["evidence"] == "NVML sees 2 of the 4 GPUs this host is expected to have"


def test_no_nvml_library_is_cannot_tell_never_a_crash(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_library(name: str, *args: Any, **kwargs: Any) -> Any:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    report = Host(tmp_path).tick()
    assert report["fit"] is None and "librarynotfound" in report["cannot_tell"]
    capsys.readouterr()
    assert main(["agent", "once", "--json", "--sysfs-root", str(tmp_path)]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["inventory"] == [] and any("NVMLError_LibraryNotFound" in e for e in out["errors"])


_ESSENTIAL = {"nvmlInitWithFlags", "nvmlShutdown", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"}
_FUNCTIONS = sorted(set(vars(FakeNvml([FakeGpu(index=0)]).lib)) - _ESSENTIAL)


@pytest.mark.parametrize("function", _FUNCTIONS)
def test_a_function_missing_from_an_older_library_is_not_supported(
    fake_nvml: FakeNvml, function: str
) -> None:
    fake_nvml.without(function)
    source = NvmlSource()
    inventory = source.open()
    try:
        assert [g.index for g in inventory] == [0, 1]
        samples = [source.read_slow(g.index, 1.0) for g in inventory]
    finally:
        source.close()
    assert [s.gpu for s in samples] == [0, 1]
    if function != "nvmlDeviceGetTemperature":
        assert all(s.temp_c == 64.0 for s in samples)  # the rest of the reading is there
    if function != "nvmlDeviceGetRemappedRows":
        assert all(s.remap is not None for s in samples)


def test_a_function_missing_from_an_older_nvidia_ml_py_is_not_supported(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("nvmlDeviceGetRemappedRows", "c_nvmlGpuFabricInfo_t"):
        monkeypatch.delattr(pynvml, name)
    fake_nvml.gpus[0].fabric = (3, 0, 7)
    fake_nvml.gpus[0].reasons = pynvml.nvmlClocksThrottleReasonSwPowerCap
    errors: list[tuple[str, str]] = []
    source = NvmlSource(on_error=lambda fn, err: errors.append((fn, err)))
    source.open()
    try:
        sample = source.read_slow(0, 1.0)
    finally:
        source.close()
    assert sample.remap is None and sample.fabric is None
    assert sample.throttle == ["sw_power_cap"]
    assert sample.temp_c == 64.0 and sample.ecc is not None
    assert ("pynvml.nvmlDeviceGetRemappedRows", "exception") in errors
    assert (0, "fabric") in source.unsupported()


def test_a_gpu_answering_unknown_error_to_every_call_is_unavailable_until_it_answers(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    """NVML_ERROR_UNKNOWN on every call of a GPU (nvidia-smi's "Unknown Error" everywhere) is the GPU's state:
    unavailable, reboot; once it answers again, ok with no stale verdict."""
    host = Host(tmp_path)
    assert host.tick()["fit"] is True
    fake_nvml.gpus[1].failing = UNKNOWN
    report = host.tick()
    assert _states(host) == {0: "ok", 1: "unavailable"}
    assert _reasons(report) == {0: [], 1: ["gpu_unavailable"]}
    assert report["fit"] is False
    assert ("nvmlDeviceGetUtilizationRates", "unknown") in host.errors
    again = host.tick()
    assert _reasons(again) == {0: [], 1: ["gpu_unavailable"]}
    fake_nvml.gpus[1].failing = 0
    back = host.tick()
    assert _states(host) == {0: "ok", 1: "ok"} and back["fit"] is True
