"""Async-debug readiness from a rank's environment, and through the job mapper."""

from __future__ import annotations

from sentinel.components.nccl_debug.rule import RECOMMENDED, assess, pattern_is_tailed


def states(env: dict[str, str], globs: list[str] | None = None) -> dict[str, tuple[str, bool]]:
    readiness = assess(env, lambda p: pattern_is_tailed(p, globs or []))
    return {s.name: (s.state, s.ok) for s in readiness.settings}


def test_bare_environment_relies_on_defaults() -> None:
    got = states({})
    assert set(got) == set(RECOMMENDED)
    assert got["async_error_handling"] == ("default_on", True)
    assert got["nccl_ras"] == ("default_on", True)
    assert got["flight_recorder"] == ("default_off", False)
    assert not assess({}).ready


def test_a_diagnosable_job() -> None:
    env = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/run/sentinel/pipe_",
        "NCCL_DEBUG": "WARN",
        "NCCL_DEBUG_FILE": "/var/log/nccl/%h.%p.log",
    }
    readiness = assess(env, lambda p: pattern_is_tailed(p, ["/var/log/nccl/*.log"]))
    assert readiness.ready and readiness.missing == []


def test_settings_that_turn_things_off() -> None:
    env = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "0",
        "NCCL_RAS_ENABLE": "0",
        "NCCL_DEBUG": "VERSION",
        "NCCL_DEBUG_FILE": "/tmp/nccl.%h.log",
    }
    got = states(env, ["/var/log/nccl/*"])
    for name in ("async_error_handling", "flight_recorder", "nccl_ras", "nccl_debug", "nccl_debug_file"):
        assert got[name] == ("off", False), name


def test_job_view_shows_what_any_host_lacks() -> None:
    from sentinel.aggregator.engine import Engine
    from sentinel.aggregator.views import job_summary
    from sentinel.wire import Batch, GpuInfo, Hello, ProcInfo

    ready = assess(
        {
            "TORCH_FR_BUFFER_SIZE": "2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/run/p_",
            "NCCL_DEBUG": "WARN",
            "NCCL_DEBUG_FILE": "/var/log/nccl/%h.log",
        },
        lambda p: pattern_is_tailed(p, ["/var/log/nccl/*"]),
    )
    bare = assess({})
    engine = Engine()
    for i, readiness in enumerate((ready, bare)):
        host = engine.hello(
            Hello(host=f"h{i}", boot_id="b", gpus=[GpuInfo(index=0, uuid=f"GPU-{i}", pci_bus="0000:18:00")]),
            0.0,
        )
        procs = [ProcInfo(gpu=0, pid=100 + i, job_id="train", rank=i, debug=readiness)]
        engine.ingest(host, Batch(seq=0, t=1.0, procs=procs), 1.0)
    view = job_summary(engine, engine.fleet.jobs["train"])["debug_readiness"]
    assert view["ready"] is False and view["hosts_reported"] == 2
    assert "flight_recorder" in view["missing"] and view["missing_on"]["flight_recorder"] == ["h1"]
    assert "async_error_handling" not in view["missing"]  # on by default
