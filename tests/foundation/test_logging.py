"""Logging: JSON lines off a terminal, readable text on one; component and host on every event."""

from __future__ import annotations

import io
import json

import pytest

from sentinel.log import get_logger, setup_logging


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_json_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    setup_logging("agent", "info", host="gpu-7", stream=out)
    get_logger(gpu=3).warning("nvml_call_timed_out", function="nvmlDeviceGetPowerUsage")
    get_logger().debug("hidden")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["event"] == "nvml_call_timed_out"
    assert event["component"] == "agent"
    assert event["host"] == "gpu-7"
    assert event["gpu"] == 3
    assert event["level"] == "warning"
    assert "timestamp" in event


def test_console_when_a_terminal() -> None:
    out = _Tty()
    setup_logging("aggregator", "debug", host="agg-1", stream=out)
    get_logger().debug("started", port=9400)
    text = out.getvalue()
    assert "started" in text
    assert "component" in text and "aggregator" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_level_filters() -> None:
    out = io.StringIO()
    setup_logging("agent", "error", host="h", stream=out)
    get_logger().warning("dropped")
    get_logger().error("kept")
    assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["kept"]


def test_bad_level_rejected() -> None:
    with pytest.raises(ValueError, match="log level"):
        setup_logging("agent", "loud")


def test_logger_created_before_setup_honours_later_setup() -> None:
    early = get_logger(module="early")  # as a module does at import time
    out = io.StringIO()
    setup_logging("agent", "warning", host="h", stream=out)
    early.info("hidden")
    early.warning("shown")
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["shown"]
    assert events[0]["module"] == "early"
    assert events[0]["component"] == "agent"
