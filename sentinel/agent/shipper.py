"""WebSockets to the aggregators (one, or several for high availability): hello, spooled batches in seq
order, acks, commands.

The spool is the source of truth: every batch is on disk until its Ack arrives. On each connection the
shipper sends a Hello, then every spooled batch in seq order (at most ``max_inflight`` unacked at a time),
then new batches as the agent makes them. When the connection drops, whatever was not acked is simply
sent again on the next one (the aggregator drops a resend by (host, seq)). Reconnects back off
exponentially with full jitter, so a restarted aggregator is not hit by every agent at the same instant.

With ``stream.aggregator_urls`` every aggregator gets the same stream over its own connection; each
aggregator's acks are kept apart in the spool, so each is sent exactly what it has not acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from sentinel.agent.metrics import AgentCounters
from sentinel.agent.spool import Spool
from sentinel.agent.websocket import HandshakeError, ProtocolError, WebSocket, connect
from sentinel.config.agent import StreamConfig
from sentinel.config.loader import read_bounded
from sentinel.log import get_logger
from sentinel.wire import MAX_FRAME_BYTES, Ack, Command, CommandResult, Hello, decode_aggregator_frame, encode

log = get_logger(module="agent.shipper")

CommandHandler = Callable[[Command], Awaitable[CommandResult]]


MAX_TOKEN_FILE_BYTES = 8192
CLOSE_HOST_NOT_ALLOWED = 4003  # the aggregator's close code: the token may not speak for this host


class TokenFileError(Exception):
    """The token file cannot give a token: the message names the file and what is wrong."""


def read_token(path: str) -> str | None:
    """The bearer token (first non-comment line of the file); None when no token file is configured.

    Raises :class:`TokenFileError` when the file is missing, unreadable or empty: without a token every
    connection would be refused with 401, so the agent says why instead of looping on refusals.
    """
    if not path:
        return None
    try:
        raw = read_bounded(Path(path), MAX_TOKEN_FILE_BYTES)
    except FileNotFoundError:
        raise TokenFileError(f"token file {path} does not exist") from None
    except OSError as exc:
        raise TokenFileError(f"token file {path} cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TokenFileError(f"token file {path} {exc}") from None
    text = raw.decode("utf-8", errors="replace")
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if line and not line.startswith("#"):
            return line.split()[0]
    raise TokenFileError(f"token file {path} holds no token")


def ssl_context(url: str, ca_file: str, cert_file: str = "", key_file: str = "") -> ssl.SSLContext | None:
    """TLS for a wss:// aggregator: its CA, and this host's client certificate where mutual TLS is used."""
    if not url.startswith("wss://"):
        return None
    context = ssl.create_default_context(cafile=ca_file or None)
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context


class Shipper:
    """Streams the spool to every configured aggregator; run :meth:`run` as a task, :meth:`wake` after each
    new batch.

    One :class:`AggregatorStream` per URL (``stream.aggregator_urls``, else ``stream.aggregator_url``), each
    with its own connection, backoff, in-flight window and spool cursor (the spool keeps per-aggregator
    acks), so losing one aggregator neither slows nor loses anything for the other, and the one that comes
    back is sent what it missed.
    """

    def __init__(
        self,
        config: StreamConfig,
        *,
        spool: Spool,
        hello: Callable[[int], Hello],
        on_command: CommandHandler,
        counters: AgentCounters,
        host: str,
    ) -> None:
        urls = config.urls()
        #: set by the agent once its first tick has run, so the Hello carries the GPU inventory
        self.ready = asyncio.Event()
        self.streams = [
            AggregatorStream(
                config,
                url=url,
                consumer=url if len(urls) > 1 else None,
                spool=spool,
                hello=hello,
                on_command=on_command,
                counters=counters,
                host=host,
                ready=self.ready,
            )
            for url in urls
        ]

    def wake(self) -> None:
        for stream in self.streams:
            stream.wake()

    @property
    def connected(self) -> bool:
        return any(stream.connected for stream in self.streams)

    @property
    def last_error(self) -> str:
        return next((s.last_error for s in self.streams if s.last_error), "")

    @property
    def connections(self) -> int:
        return sum(stream.connections for stream in self.streams)

    def request_reconnect(self) -> None:
        for stream in self.streams:
            stream.request_reconnect()

    async def run(self) -> None:
        await asyncio.gather(*(stream.run() for stream in self.streams))

    async def drain(self, timeout_s: float) -> None:
        await asyncio.gather(*(stream.drain(timeout_s) for stream in self.streams))

    async def close(self) -> None:
        await asyncio.gather(*(stream.close() for stream in self.streams))


class AggregatorStream:
    """One aggregator's WebSocket: hello, its unacked spooled batches in seq order, acks, commands."""

    def __init__(
        self,
        config: StreamConfig,
        *,
        url: str,
        consumer: str | None,
        spool: Spool,
        hello: Callable[[int], Hello],
        on_command: CommandHandler,
        counters: AgentCounters,
        host: str,
        ready: asyncio.Event,
    ) -> None:
        self.config = config
        self.url = url
        self.consumer = consumer  # the spool's name for this aggregator's acks (None: the only one)
        self.spool = spool
        self.hello = hello
        self.on_command = on_command
        self.counters = counters
        self.host = host
        self._wake = asyncio.Event()
        self.ready = ready
        self.acked = 0
        self._stopping = False
        self._ws: WebSocket | None = None
        self._inflight: set[int] = set()
        self._command_tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        self.last_error = ""

    def wake(self) -> None:
        self._wake.set()

    @property
    def connected(self) -> bool:
        return self._ws is not None and not self._ws.closed

    def request_reconnect(self) -> None:
        """Close the current connection so the next one sends a fresh Hello (the inventory changed)."""
        if self._ws is not None and not self._ws.closed:
            task = asyncio.create_task(self._close_ws(self._ws))
            self._command_tasks.add(task)
            task.add_done_callback(self._command_tasks.discard)

    @staticmethod
    async def _close_ws(ws: WebSocket) -> None:
        await ws.close()

    async def run(self) -> None:
        await self.ready.wait()
        delay = self.config.backoff_initial_s
        while not self._stopping:
            acked_before = self.acked
            try:
                await self._connection()
            except asyncio.CancelledError:
                raise
            except TokenFileError as exc:
                self._refused("token_file", str(exc))
            except HandshakeError as exc:
                if exc.status in (401, 403):
                    self._refused(
                        "unauthorized",
                        f"the aggregator refused the token in {self.config.token_file} "
                        f"(HTTP {exc.status}); check that file against the aggregator's tokens file",
                    )
                else:
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.warning("aggregator_connection_failed", url=self.url, error=self.last_error)
            except (ProtocolError, OSError, TimeoutError, msgspec.DecodeError, ValueError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("aggregator_connection_failed", url=self.url, error=self.last_error)
            except Exception as exc:  # a bug here must not end streaming for the agent's lifetime
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.error("shipper_failed", url=self.url, error=self.last_error)
            finally:
                self._ws = None
                self._set_connected(False)
                self._inflight.clear()
            if self._stopping:
                break
            if self.acked > acked_before:
                delay = self.config.backoff_initial_s
            sleep = random.uniform(0, delay)
            delay = min(delay * 2, self.config.backoff_max_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait_stop(), sleep)

    def _set_connected(self, up: bool) -> None:
        counters = self.counters
        counters.aggregators[self.url] = up
        counters.connected = any(counters.aggregators.values())

    def _refused(self, reason: str, problem: str) -> None:
        """The aggregator will not take this agent's stream: say which file and host, count it for an alert."""
        self.last_error = problem
        self.counters.stream_refused[reason] += 1
        log.error(
            "aggregator_refused_agent",
            reason=reason,
            host=self.host,
            token_file=self.config.token_file,
            url=self.url,
            problem=problem,
        )

    async def _wait_stop(self) -> None:
        while not self._stopping:
            self._wake.clear()
            await self._wake.wait()

    async def _connection(self) -> None:
        headers = {}
        token = read_token(self.config.token_file)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        ws = await asyncio.wait_for(
            connect(
                self.url,
                headers=headers,
                ssl_context=ssl_context(
                    self.url,
                    self.config.ca_file,
                    self.config.tls_cert_file,
                    self.config.tls_key_file,
                ),
                max_msg_size=MAX_FRAME_BYTES,
                heartbeat_s=30.0,
            ),
            self.config.connect_timeout_s,
        )
        self._ws = ws
        self.connections += 1
        try:
            pending = self.spool.seqs(self.consumer)
            await ws.send_bytes(encode(self.hello(pending[0] if pending else -1)))
            self._set_connected(True)
            log.info("aggregator_connected", url=self.url, spooled=len(pending))
            reader = asyncio.create_task(self._read(ws))
            writer = asyncio.create_task(self._write(ws))
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            for task in (reader, writer):
                if not task.done():
                    task.cancel()
            for task in (reader, writer):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            await ws.close()

    async def _write(self, ws: WebSocket) -> None:
        sent_upto = -1
        while not ws.closed:
            self._wake.clear()
            for seq in self.spool.seqs_after(sent_upto, self.consumer):
                if len(self._inflight) >= self.config.max_inflight:
                    break
                data = self.spool.read(seq)
                sent_upto = seq
                if data is None:
                    continue
                await ws.send_bytes(data)
                self._inflight.add(seq)
                self.counters.batches_sent += 1
            if self._stopping and not self._inflight and not self.spool.seqs_after(sent_upto, self.consumer):
                return
            await self._wake.wait()

    async def _read(self, ws: WebSocket) -> None:
        while (message := await ws.receive()) is not None:
            try:
                frame = decode_aggregator_frame(message)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("aggregator_frame_invalid", url=self.url, error=str(exc))
                continue
            if isinstance(frame, Ack):
                self._inflight.discard(frame.seq)
                if self.spool.ack(frame.seq, self.consumer):
                    self.acked += 1
                    self.counters.batches_acked += 1
                self.counters.spool_bytes = self.spool.size_bytes
                self.counters.spool_write_errors = self.spool.write_errors
                self._wake.set()
            else:
                task = asyncio.create_task(self._command(ws, frame))
                self._command_tasks.add(task)
                task.add_done_callback(self._command_tasks.discard)
        if ws.close_code == CLOSE_HOST_NOT_ALLOWED:
            self._refused(
                "host_not_allowed",
                f"the token in {self.config.token_file} may not speak for host {self.host!r} "
                "(its line in the aggregator's tokens file names other hosts)",
            )
            return
        log.warning("aggregator_closed", url=self.url, code=ws.close_code)

    async def _command(self, ws: WebSocket, command: Command) -> None:
        try:
            result = await self.on_command(command)
        except Exception as exc:
            result = CommandResult(id=command.id, ok=False, error=f"{type(exc).__name__}: {exc}")
        data = encode(result)
        if len(data) > MAX_FRAME_BYTES:
            data = encode(
                CommandResult(id=command.id, ok=False, error=f"result of {len(data)} bytes too large")
            )
        try:
            await ws.send_bytes(data)
        except (ConnectionError, OSError, RuntimeError) as exc:
            log.warning("command_result_not_sent", command=command.name, error=str(exc))

    async def drain(self, timeout_s: float) -> None:
        """On shutdown: give the connection ``timeout_s`` to send and get acks for what is spooled."""
        self._stopping = True
        self._wake.set()
        if not self.connected:
            return
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (
            self.connected and self.spool.seqs(self.consumer) and asyncio.get_running_loop().time() < deadline
        ):
            self._wake.set()
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._ws is not None:
            await self._ws.close()
