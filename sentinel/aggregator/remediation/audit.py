"""The remediation audit log: one JSON line per action, dry run and refusal, appended and size-bounded.

Each record is one small ``O_APPEND`` write (to the page cache: microseconds, so it is done on the loop, and
lines from two processes never interleave); rotated to ``<file>.1`` past its size
so that a flood of refusals cannot fill the disk. A log that cannot be written is counted and logged, and
remediation carries on — the metric and the verdict still record the action.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


class AuditLog:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.errors = 0
        self.last_error = ""
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> bool:
        line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    if self.path.stat().st_size + len(line) > self.max_bytes:
                        os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                except FileNotFoundError:
                    pass
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError as exc:
                self.errors += 1
                self.last_error = f"{self.path}: {exc.strerror or exc}"
                return False
        return True

    def read(self) -> list[dict[str, Any]]:
        """Every record of the current file (tests, ``sentinel`` tooling)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]
