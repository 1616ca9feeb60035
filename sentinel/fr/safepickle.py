"""Decode PyTorch Flight Recorder pickles without executing anything.

Dumps are plain data, but :func:`pickle.load` of an untrusted file runs arbitrary code. This module uses
the C unpickler (fast enough for millions of opcodes, with its own stack) with every way to code closed:
``find_class`` refuses every global, ``persistent_load`` every persistent id, and the copyreg extension
cache must be empty, so REDUCE, BUILD and the object opcodes can only fail with :class:`FrFormatError`.
"""

from __future__ import annotations

import copyreg
import pickle

from sentinel.fr.errors import FrFormatError
from sentinel.fr.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, NoReturn

#: First byte of every pickle of protocol >= 2 (PyTorch writes protocol 2).
PICKLE_PROTO = 0x80


class _RefusedGlobal(Exception):
    """Raised from inside the unpickler; converted to FrFormatError by :func:`loads_plain`."""


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that cannot resolve any global or persistent id."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise _RefusedGlobal(f"refused global {module[:60]}.{name[:60]}")

    def persistent_load(self, pid: Any) -> NoReturn:
        raise _RefusedGlobal("refused persistent id")


class MemoryReader:
    """The file interface the C unpickler reads through, over bytes already in memory.

    ``peek`` hands the unpickler everything that is left, as a view (no copy), so it decodes from one
    buffer as :func:`pickle.loads` does. An :class:`io.BufferedReader` hands it at most what its buffer
    holds, so a long string (the world group's member list in ``pg_config`` of a large job) is read
    through a second copy. Every
    method stays within the bytes given (a truncated pickle reads short, and the unpickler refuses it).
    """

    __slots__ = ("_data", "_pos", "_view")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._view = memoryview(data)
        self._pos = 0

    def peek(self, _size: int = 0) -> memoryview:
        return self._view[self._pos :]

    def read(self, size: int = -1) -> memoryview:
        start = self._pos
        end = len(self._data) if size < 0 else min(len(self._data), start + size)
        self._pos = end
        return self._view[start:end]

    def readinto(self, buffer: Any) -> int:
        chunk = self.read(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[: len(chunk)] = chunk
        return len(chunk)

    def readline(self) -> memoryview:
        newline = self._data.find(b"\n", self._pos)
        return self.read(-1 if newline < 0 else newline + 1 - self._pos)


class PartsReader:
    """:class:`MemoryReader` over several byte ranges read in a row, as if joined, without the copy that
    would join them: the newest-entries decode (:mod:`sentinel.fr.recent`) frames parts of a
    dump's front and back with a few opcodes of its own, which a ``b"".join`` would copy (and
    allocate) per dump. Each part is ``(data, start, end)``.

    ``peek`` hands the unpickler what is left of the current part (a view, no copy); it asks again, or
    reads, when that is not enough. A read across parts joins only the bytes it returns. Every method
    stays within the ranges given.
    """

    __slots__ = ("_i", "_parts", "_pos")

    def __init__(self, parts: list[tuple[bytes, int, int]]) -> None:
        self._parts = [(data, start, end) for data, start, end in parts if end > start]
        self._i = 0
        self._pos = self._parts[0][1] if self._parts else 0

    def _current(self) -> tuple[bytes, int, int] | None:
        """The part being read, with the read position moved past parts already read; None at the end."""
        while self._i < len(self._parts):
            data, _, end = self._parts[self._i]
            if self._pos < end:
                return data, self._pos, end
            self._i += 1
            if self._i < len(self._parts):
                self._pos = self._parts[self._i][1]
        return None

    def peek(self, _size: int = 0) -> memoryview:
        cur = self._current()
        return memoryview(cur[0])[cur[1] : cur[2]] if cur is not None else memoryview(b"")

    def read(self, size: int = -1) -> memoryview:
        cur = self._current()
        if cur is not None and 0 <= size <= cur[2] - cur[1]:  # within one part (the usual case)
            self._pos += size
            return memoryview(cur[0])[cur[1] : cur[1] + size]
        pieces = []
        left = size
        while (size < 0 or left > 0) and (cur := self._current()) is not None:
            data, pos, end = cur
            take = end - pos if size < 0 else min(left, end - pos)
            pieces.append(memoryview(data)[pos : pos + take])
            self._pos += take
            left -= take
        return memoryview(b"".join(pieces))

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        chunk = self.read(len(target))
        target[: len(chunk)] = chunk
        return len(chunk)

    def readline(self) -> memoryview:
        pieces = []
        while (cur := self._current()) is not None:
            data, pos, end = cur
            newline = data.find(b"\n", pos, end)
            stop = end if newline < 0 else newline + 1
            pieces.append(memoryview(data)[pos:stop])
            self._pos = stop
            if newline >= 0:
                break
        return pieces[0] if len(pieces) == 1 else memoryview(b"".join(pieces))


def plain_unpickler(data: bytes | list[tuple[bytes, int, int]]) -> _PlainUnpickler:
    """A no-globals unpickler reading ``data`` through a :class:`MemoryReader`, or the byte ranges of a
    list through a :class:`PartsReader`."""
    # the C unpickler takes any buffer; typeshed only says bytes
    reader: Any = PartsReader(data) if isinstance(data, list) else MemoryReader(data)
    return _PlainUnpickler(reader)


def loads_plain(data: bytes, *, source: str = "<bytes>") -> Any:
    """Decode a pickle that may only contain plain data; raise FrFormatError for anything else."""
    if not data or data[0] != PICKLE_PROTO:
        raise FrFormatError(f"{source}: not a pickle of protocol 2 or later")
    if copyreg._extension_cache:  # type: ignore[attr-defined]
        raise FrFormatError(f"{source}: refused: the copyreg extension cache of this process is not empty")
    reader: Any = MemoryReader(data)
    try:
        obj = _PlainUnpickler(reader).load()
    except _RefusedGlobal as exc:
        raise FrFormatError(f"{source}: {exc} (dumps hold plain data only; nothing was executed)") from None
    except RecursionError:
        raise FrFormatError(f"{source}: pickle nests too deeply") from None
    except MemoryError:
        raise FrFormatError(f"{source}: pickle expands beyond available memory") from None
    except Exception as exc:  # every decoder failure is a format error
        raise FrFormatError(f"{source}: corrupt pickle: {type(exc).__name__}: {str(exc)[:120]}") from None
    if reader.read(1):
        raise FrFormatError(f"{source}: trailing bytes after the pickle STOP opcode")
    return obj
