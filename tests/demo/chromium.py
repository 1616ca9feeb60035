"""Headless Chromium for the status page tests: load a URL, let its JavaScript run, return the DOM."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--window-size=1400,1000",
)


async def dump_dom(
    binary: str, url: str, profile: Path, *, budget_ms: int = 5000, timeout_s: float = 60.0
) -> str:
    """The page's DOM after ``budget_ms`` of virtual time (timers and fetches run; no real waiting)."""
    proc = await asyncio.create_subprocess_exec(
        binary,
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        "--dump-dom",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise AssertionError(f"chromium did not finish loading {url} within {timeout_s}s") from None
    if proc.returncode != 0:
        raise AssertionError(f"chromium exited {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
    return out.decode("utf-8", errors="replace")
