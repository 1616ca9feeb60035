"""Load a daemon's TOML configuration, apply ``SENTINEL_*`` environment overrides, validate.

Every key has a default, so an absent file means "all defaults" when the caller allows it. Validation is
msgspec's, with its messages rewritten to name the file, the dotted key and what is wrong — operators read
these in ``journalctl`` and need to know which line to fix, not where in our code it failed.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

T = TypeVar("T", bound=msgspec.Struct)

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")


class ConfigError(Exception):
    """A configuration problem, rendered as ``FILE: KEY: what is wrong`` on one line."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        super().__init__(f"{source}: {key}: {problem}" if key else f"{source}: {problem}")


MAX_CONFIG_BYTES = 1024 * 1024


def read_bounded(path: Path, max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; ``OSError``/``ValueError`` naming what is wrong.

    Opened non-blocking and checked to be a regular file before anything is read: ``/dev/zero`` once grew
    ``config check`` to 4.6 GB and a FIFO blocked it for ever.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(info.st_mode)
                else "a device"
                if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "a directory"
                if stat.S_ISDIR(info.st_mode)
                else "not a regular file"
            )
            raise ValueError(f"is {kind}, not a regular file")
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(65536, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise ValueError(f"larger than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def env_name(prefix: str, path: tuple[str, ...]) -> str:
    """``SENTINEL_AGENT`` + (collect, tick_s) → ``SENTINEL_AGENT_COLLECT__TICK_S``.

    Sections and keys are joined with a double underscore, since keys themselves contain single ones.
    """
    return prefix + "_" + "__".join(part.upper() for part in path)


def iter_leaf_paths(cls: type[msgspec.Struct]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf key of a config struct as (path, msgspec type info)."""
    yield from _walk(msgspec.inspect.type_info(cls), ())


def _walk(info: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(info, msgspec.inspect.StructType):
        for field in info.fields:
            yield from _walk(field.type, (*path, field.encode_name))
    else:
        yield path, info


def _parse_env_value(raw: str) -> Any:
    """Read an environment value as a TOML value (numbers, booleans, arrays); otherwise a plain string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _apply_env(data: dict[str, Any], cls: type[msgspec.Struct], prefix: str, env: Mapping[str, str]) -> None:
    known = {env_name(prefix, path) for path, _ in iter_leaf_paths(cls)}
    for name in sorted(env):
        if name.startswith(prefix + "_") and name not in known:
            # a misspelled override would otherwise be ignored silently, and the default used instead
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(name, None, f"unknown override: no such key{hint}")
    for path, _ in iter_leaf_paths(cls):
        name = env_name(prefix, path)
        if name not in env:
            continue
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(name, ".".join(path[:-1]), "is not a table in the file")
            node = child
        node[path[-1]] = _parse_env_value(env[name])


#: what a struct's ``__post_init__`` raises about one of its keys: ``key[index]: message``
_KEYED = re.compile(r"^(?P<key>[a-z_]+(?:\[\d+\])?): (?P<msg>.+)$", re.S)


def _explain(error: msgspec.ValidationError, source: str) -> ConfigError:
    match = _AT.match(str(error))
    message = match.group("msg") if match else str(error)
    path = (match.group("path") or "") if match else ""
    key = path.lstrip(".") or None
    unknown = _UNKNOWN.match(message)
    if unknown:
        key = f"{key}.{unknown.group('name')}" if key else unknown.group("name")
        return ConfigError(source, key, "unknown key")
    inner = _KEYED.match(message)  # a struct's own check names the key below its section
    if inner:
        key = f"{key}.{inner.group('key')}" if key else inner.group("key")
        message = inner.group("msg")
    message = message.replace("`", "")
    return ConfigError(source, key, message[:1].lower() + message[1:])


def load_config(
    cls: type[T],
    path: Path | None,
    *,
    env_prefix: str,
    env: Mapping[str, str] | None = None,
    missing_ok: bool = True,
) -> T:
    """Read ``path`` (all defaults when it is None or absent and ``missing_ok``), apply env, validate."""
    source = str(path) if path is not None else "<defaults>"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            raw = read_bounded(path)
        except FileNotFoundError:
            if not missing_ok:
                raise ConfigError(source, None, "no such file") from None
        except OSError as exc:
            raise ConfigError(source, None, f"cannot read: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ConfigError(source, None, str(exc)) from None
        else:
            try:
                data = tomllib.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ConfigError(source, None, f"not UTF-8 text (byte {exc.start})") from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(source, None, f"invalid TOML: {exc}") from None
            except RecursionError:
                raise ConfigError(source, None, "invalid TOML: nested too deeply") from None
    env_values = os.environ if env is None else env
    _apply_env(data, cls, env_prefix, env_values)
    try:
        return msgspec.convert(data, cls, strict=True)
    except msgspec.ValidationError as exc:
        raise _explain(exc, source) from None
