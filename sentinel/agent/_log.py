"""Module loggers that honour :func:`sentinel.log.setup_logging` even when created at import time.

``sentinel.log.get_logger(**bind)`` binds immediately, which freezes structlog's configuration of that
moment; agent modules are imported before the daemon calls ``setup_logging``, so their loggers would ignore
the configured level and JSON output. This proxy asks ``get_logger`` on each call instead (logging is rare
on the agent's paths, so the extra lookup does not matter).
"""

from __future__ import annotations

from typing import Any

from sentinel.log import get_logger


class LazyLogger:
    def __init__(self, **bind: Any) -> None:
        self._bind = bind

    def __getattr__(self, name: str) -> Any:
        return getattr(get_logger(**self._bind), name)


def module_logger(module: str) -> LazyLogger:
    return LazyLogger(module=module)
