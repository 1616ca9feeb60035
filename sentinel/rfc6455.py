"""What both ends of the agents' stream share of RFC 6455: opcodes, close codes, the accept key, the masking
XOR and a whole frame's encoding.

The agent's client (:mod:`sentinel.agent.websocket`) and the aggregator's reader
(:mod:`sentinel.aggregator.wsconn`) each keep their own state machine; the wire format is written once here.
Nothing here imports a third-party library (the agent must not load aiohttp).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Final

OP_CONTINUATION: Final = 0x0
OP_TEXT: Final = 0x1
OP_BINARY: Final = 0x2
OP_CLOSE: Final = 0x8
OP_PING: Final = 0x9
OP_PONG: Final = 0xA

CLOSE_NORMAL: Final = 1000
CLOSE_PROTOCOL: Final = 1002
CLOSE_ABNORMAL: Final = 1006  # never sent: the connection ended without a close frame
CLOSE_INVALID_DATA: Final = 1007
CLOSE_TOO_BIG: Final = 1009

#: the GUID the handshake's accept key is derived with (RFC 6455 1.3)
GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def accept_for(key: str) -> str:
    """``Sec-WebSocket-Accept`` for the client's ``Sec-WebSocket-Key`` ``key`` (not validated here)."""
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + GUID, usedforsecurity=False).digest()).decode(
        "ascii"
    )


def xor_mask(payload: bytes, key: bytes) -> bytes:
    """``payload`` XOR the repeated 4-byte ``key``: masking and unmasking are the same (one big-integer XOR,
    no Python loop over bytes)."""
    n = len(payload)
    if not n:
        return b""
    repeated = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(repeated, "little")).to_bytes(n, "little")


def frame(
    opcode: int, payload: bytes, key: bytes | None = None, masker: Callable[[bytes, bytes], bytes] = xor_mask
) -> bytes:
    """One final frame: unmasked (a server's) when ``key`` is None, else masked with it (a client's) by
    ``masker``."""
    n = len(payload)
    bit = 0x80 if key is not None else 0
    if n < 126:
        head = bytes((0x80 | opcode, bit | n))
    elif n < 1 << 16:
        head = bytes((0x80 | opcode, bit | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, bit | 127)) + n.to_bytes(8, "big")
    return head + payload if key is None else head + key + masker(payload, key)
