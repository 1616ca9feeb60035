"""A small RAS service for tests: speaks NCCL's client protocol on 127.0.0.1 (port 0) and answers STATUS
with a canned text (real RAS output from tests/data/nccl_ras)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field


@dataclass
class FakeRas:
    answer: str = ""
    protocol_reply: bytes = b"SERVER PROTOCOL 2\n"
    stall_status: bool = False  # accept the query, never answer (a wedged RAS thread)
    commands: list[str] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                command = line.decode().strip()
                self.commands.append(command)
                upper = command.upper()
                if upper.startswith("CLIENT PROTOCOL"):
                    writer.write(self.protocol_reply)
                elif upper.startswith("TIMEOUT"):
                    writer.write(b"OK\n")
                elif upper.endswith("STATUS"):
                    if self.stall_status:
                        await asyncio.sleep(3600)
                    writer.write(self.answer.encode())
                    await writer.drain()
                    break
                else:
                    writer.write(f"ERROR: Unknown command {command}\n".encode())
                await writer.drain()
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            writer.close()
