"""A rank's environment → :class:`DebugReadiness`: the settings that make a stall diagnosable.

Each entry of :data:`RECOMMENDED` says what to set and why; docs/network.md renders the same table. The
defaults assumed for unset variables are those of PyTorch >= 2.2 and NCCL >= 2.24.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping

from sentinel.components.nccl_debug.record import DebugReadiness, DebugSetting, SettingState

#: setting → (environment, recommended, why)
RECOMMENDED: dict[str, tuple[str, str, str]] = {
    "async_error_handling": (
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "3 (the default since PyTorch 2.2; 0 turns it off)",
        "a collective that times out aborts the communicator and raises, instead of hanging the rank for "
        "ever: the stall becomes an error the launcher and sentinel see",
    ),
    "flight_recorder": (
        "TORCH_FR_BUFFER_SIZE (or TORCH_NCCL_TRACE_BUFFER_SIZE)",
        "2000",
        "the Flight Recorder keeps the last N collectives per rank; without it there is nothing to dump and "
        "sentinel's probe has no live collective progress to name the rank that never entered",
    ),
    "dump_on_timeout": (
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "1",
        "every rank writes its Flight Recorder when the watchdog fires, so the post-mortem has the whole job",
    ),
    "debug_info_pipe": (
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
        "a path prefix the agent knows (probe.fr_pipe_prefix)",
        "lets the agent ask a live, stuck rank for its Flight Recorder (fr_dump) without killing it",
    ),
    "nccl_debug": (
        "NCCL_DEBUG",
        "WARN (INFO while debugging)",
        "NCCL prints its NET/IB and CUDA failures (NCCL WARN) only when asked; these lines name the transport "
        "and the peer of a network stall",
    ),
    "nccl_debug_file": (
        "NCCL_DEBUG_FILE",
        "a file the agent tails (a logs.globs pattern), e.g. /var/log/nccl/%h.%p.log",
        "NCCL's lines reach sentinel only through a file it tails; stdout of a job is usually out of reach",
    ),
    "nccl_ras": (
        "NCCL_RAS_ENABLE",
        "1 (the default since NCCL 2.24)",
        "NCCL's RAS service tells the agent which ranks of a communicator are missing, dead or behind, "
        "without any change to the job",
    ),
}

_TRUE = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE = frozenset({"0", "false", "no", "off", "n", "f"})
MAX_VALUE = 200


def _int(value: str | None) -> int | None:
    try:
        return int(value.strip()) if value is not None else None
    except ValueError:
        return None


def _setting(name: str, state: SettingState, value: str | None) -> DebugSetting:
    return DebugSetting(
        name=name, state=state, ok=state in ("on", "default_on"), value=(value or "")[:MAX_VALUE]
    )


def pattern_is_tailed(pattern: str, globs: list[str]) -> bool:
    """Whether files NCCL writes for ``pattern`` (``%h`` host, ``%p`` pid) match one of the agent's globs."""
    sample = pattern.replace("%h", "host").replace("%p", "12345")
    return any(fnmatch.fnmatchcase(sample, glob) or fnmatch.fnmatchcase(pattern, glob) for glob in globs)


def assess(env: Mapping[str, str], tailed: Callable[[str], bool] = lambda _p: False) -> DebugReadiness:
    """The readiness of one rank from its environment; ``tailed(path)`` says whether the agent reads a file."""
    out: list[DebugSetting] = []
    raw = env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    mode = _int(raw)
    if raw is None:
        out.append(_setting("async_error_handling", "default_on", raw))
    else:
        out.append(_setting("async_error_handling", "on" if mode is not None and mode > 0 else "off", raw))
    raw = env.get("TORCH_FR_BUFFER_SIZE", env.get("TORCH_NCCL_TRACE_BUFFER_SIZE"))
    size = _int(raw)
    if raw is None:
        out.append(_setting("flight_recorder", "default_off", raw))
    else:
        out.append(_setting("flight_recorder", "on" if size is not None and size > 0 else "off", raw))
    raw = env.get("TORCH_NCCL_DUMP_ON_TIMEOUT")
    if raw is None:
        out.append(_setting("dump_on_timeout", "default_off", raw))
    else:
        out.append(_setting("dump_on_timeout", "on" if raw.strip().lower() in _TRUE else "off", raw))
    raw = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    out.append(_setting("debug_info_pipe", "on" if raw else "default_off", raw))
    raw = env.get("NCCL_DEBUG")
    level = (raw or "").strip().upper()
    if raw is None:
        out.append(_setting("nccl_debug", "default_off", raw))
    else:
        out.append(_setting("nccl_debug", "on" if level in ("WARN", "INFO", "TRACE") else "off", raw))
    raw = env.get("NCCL_DEBUG_FILE")
    if raw is None:
        out.append(_setting("nccl_debug_file", "default_off", raw))
    else:
        out.append(_setting("nccl_debug_file", "on" if tailed(raw) else "off", raw))
    raw = env.get("NCCL_RAS_ENABLE")
    if raw is None:
        out.append(_setting("nccl_ras", "default_on", raw))
    else:
        out.append(_setting("nccl_ras", "off" if raw.strip().lower() in _FALSE else "on", raw))
    return DebugReadiness(settings=out)
