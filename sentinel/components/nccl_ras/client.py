"""The NCCL RAS text protocol, as NCCL's own ``ncclras`` client speaks it (``src/ras/client.cc``).

    → CLIENT PROTOCOL 2            ← SERVER PROTOCOL <n>
    → TIMEOUT <s>                  ← OK
    → VERBOSE STATUS               ← the status text, then the server closes the connection

Everything is asyncio with deadlines (connect, each reply, the whole answer) and a byte bound, so a job
whose RAS thread is wedged cannot stall the agent's loop: the query fails with :class:`RasError`, the
agent counts it, and the next query comes later. A refused connection (no NCCL >= 2.24 job with RAS
listening) is :class:`RasNotListening`, which the collector treats as "off" rather than as an error.
"""

from __future__ import annotations

import asyncio
import contextlib

PROTOCOL = 2
DEFAULT_PORT = 28028
MAX_ANSWER_BYTES = 1024 * 1024


class RasError(Exception):
    """The RAS service answered badly, too slowly, or too much."""


class RasNotListening(RasError):
    """Nothing listens on the RAS address (no NCCL job with RAS on this host right now)."""


async def _line(reader: asyncio.StreamReader, deadline_s: float) -> str:
    try:
        data = await asyncio.wait_for(reader.readline(), deadline_s)
    except (TimeoutError, asyncio.LimitOverrunError, ValueError) as exc:
        detail = f"no reply line within {deadline_s:g}s" if isinstance(exc, TimeoutError) else str(exc)
        raise RasError(detail) from exc
    if not data:
        raise RasError("the RAS service closed the connection")
    return data.decode("ascii", "replace").strip()


async def query_status(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    timeout_s: float = 5.0,
    collective_timeout_s: int = 3,
    verbose: bool = True,
    max_bytes: int = MAX_ANSWER_BYTES,
) -> str:
    """The raw status text. ``collective_timeout_s`` is RAS's own per-leg timeout (its ``TIMEOUT`` command),
    kept below ``timeout_s`` so RAS answers "missing data" before we give up on it."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=4096), timeout_s)
    except ConnectionRefusedError as exc:
        raise RasNotListening(f"{host}:{port}: connection refused") from exc
    except TimeoutError as exc:
        raise RasError(f"{host}:{port}: connect timed out after {timeout_s:g}s") from exc
    except OSError as exc:
        raise RasError(f"{host}:{port}: {exc.strerror or exc}") from exc
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        writer.write(f"CLIENT PROTOCOL {PROTOCOL}\n".encode())
        reply = await _line(reader, max(0.01, deadline - loop.time()))
        if not reply.upper().startswith("SERVER PROTOCOL "):
            raise RasError(f"unexpected reply to CLIENT PROTOCOL: {reply[:80]!r}")
        writer.write(f"TIMEOUT {int(collective_timeout_s)}\n".encode())
        reply = await _line(reader, max(0.01, deadline - loop.time()))
        if reply.upper() != "OK":
            raise RasError(f"unexpected reply to TIMEOUT: {reply[:80]!r}")
        writer.write(b"VERBOSE STATUS\n" if verbose else b"STATUS\n")
        chunks: list[bytes] = []
        size = 0
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise RasError(f"status not complete within {timeout_s:g}s ({size} bytes so far)")
            try:
                chunk = await asyncio.wait_for(reader.read(65536), remaining)
            except TimeoutError as exc:
                raise RasError(f"status not complete within {timeout_s:g}s ({size} bytes so far)") from exc
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise RasError(f"status larger than {max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError as exc:
        raise RasError(f"{host}:{port}: {exc.strerror or exc}") from exc
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
