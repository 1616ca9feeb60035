"""Structured logging shared by every sentinel process.

JSON lines when stderr is not a terminal (journald and log shippers parse them), a readable console
rendering on a terminal. Every event carries ``component`` (agent, aggregator, cli, ...) and ``host`` so
that lines from many hosts can be merged without losing where they came from.
"""

from __future__ import annotations

import logging
import socket
import sys
from typing import Any, TextIO

import structlog

LEVELS = ("debug", "info", "warning", "error", "critical")


def setup_logging(
    component: str,
    level: str = "info",
    *,
    host: str | None = None,
    stream: TextIO | None = None,
    json: bool | None = None,
) -> structlog.stdlib.BoundLogger:
    """Configure structlog process-wide and return a logger bound to component and host.

    ``json=None`` picks JSON when ``stream`` is not a TTY. Safe to call more than once (tests do).
    """
    out = stream if stream is not None else sys.stderr
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    use_json = (not _isatty(out)) if json is None else json
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=_isatty(out))
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(component=component, host=host or socket.gethostname())
    logger: structlog.stdlib.BoundLogger = structlog.get_logger()
    return logger


def get_logger(**bind: Any) -> structlog.stdlib.BoundLogger:
    """A logger for a module; component and host come from :func:`setup_logging`.

    The logger is structlog's lazy proxy: modules create theirs at import time, before the daemon calls
    :func:`setup_logging`, and each call must still honour the level and format configured then.
    """
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(**bind)
    return logger


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
