"""Find and read every rank's Flight Recorder dump under a directory.

PyTorch names dumps ``<prefix><global rank>`` (pickle) or ``<prefix><rank>.json`` (``_dump_fr_trace_json``);
operators may gzip them and collect them in per-host subfolders. The format is recognised from the content
(gzip magic, pickle protocol byte, ``{``), not from the name. Every size is bounded before it is read.

A dump's top level holds ``version`` ("2.x"), ``entries`` (the ring buffer), and, depending on the version,
``pg_config`` (group name → name/desc/ranks as a string), ``pg_status`` (rank-local pg_id → last
enqueued/started/completed collective; strings in JSON dumps) and ``comm_lib_version``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import zlib
from collections.abc import Callable, Container, Iterable, Iterator

from sentinel.fr.errors import FrFormatError, brief
from sentinel.fr.ops import (
    COALESCED,
    P2P,
    UNRECORDED_P2P_BACKENDS,
    backend,
    entry_completed,
    op_name,
    reads_as_p2p,
)
from sentinel.fr.recent import (
    ByteView,
    Recent,
    continues_skipped,
    decode_recent,
    newest_of_decoded,
)
from sentinel.fr.recent_json import decode_recent_json
from sentinel.fr.records import TYPE_CHECKING, NamedTuple
from sentinel.fr.safepickle import PICKLE_PROTO, loads_plain

if TYPE_CHECKING:
    from typing import Any

    from sentinel.fr.readahead import ReadAhead

#: Largest dump file accepted, after decompression (far above a full 2,000-entry dump with stack frames).
MAX_DUMP_BYTES = 256 * 1024 * 1024
#: Largest number of dump files read from one directory.
MAX_FILES = 1 << 17
#: Largest number of ring-buffer entries accepted in one dump.
MAX_ENTRIES = 1 << 20
#: Deepest folder level searched below the dump directory (per-host subfolders and a little more).
MAX_DEPTH = 4

#: A path as this module takes it: text or a path object (:mod:`pathlib` is never imported here: with what it
#: imports, urllib.parse, fnmatch, ipaddress, it is a measurable share of a small ``fr analyze``).
PathLike = str | os.PathLike[str]

_NAME_RE = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)(?P<json>\.json)?(?P<gz>\.gz)?$")
_GZIP_MAGIC = b"\x1f\x8b"


class DumpFile(NamedTuple):
    """A file whose name says it is rank ``rank``'s dump (``path``: as :func:`discover` spells it)."""

    path: str
    rank: int
    prefix: str


class RawDump:
    """The top level of one dump, checked for shape; entries are still the decoded dicts.

    A plain class, like every record on the ``fr analyze`` path (:mod:`sentinel.fr.summary`): the command
    must not pay for importing msgspec (a fifth of analyzing a small set)."""

    __slots__ = (
        "entries",
        "fields_only",
        "is_json",
        "pg_config",
        "pg_names",
        "pg_status",
        "rank",
        "skipped_p2p",
        "source",
        "total_entries",
        "version",
    )

    def __init__(
        self,
        source: str,
        rank: int,
        version: str,
        entries: list[Any],
        *,
        pg_config: dict[str, Any] | None = None,
        pg_status: dict[str, Any] | None = None,
        is_json: bool = False,
    ) -> None:
        self.source = source
        self.rank = rank
        self.version = version
        self.entries = entries
        self.pg_config: dict[str, Any] = {} if pg_config is None else pg_config
        self.pg_status: dict[str, Any] = {} if pg_status is None else pg_status
        self.is_json = is_json
        self.total_entries = -1  # entries in the file when only the newest were decoded, else -1
        # pg_id -> [name, desc] of groups seen only in the skipped entries
        self.pg_names: dict[int, list[str]] = {}
        # only the newest entries were decoded, and completed send/recv entries were among those skipped:
        # the analysis of a set in which a rank waits needs them (sentinel.fr.dumpset.summarize_dir)
        self.skipped_p2p = False
        # the entries may hold only the keys the analysis reads, in another order than the file's
        # (sentinel.fr.jsonfields): a dump refused so is read again without (which entry and field an
        # error names first follows the order of the file's keys)
        self.fields_only = False

    @property
    def n_entries(self) -> int:
        return self.total_entries if self.total_entries >= 0 else len(self.entries)


def as_pathlib_text(text: str) -> str:
    """``text`` spelled as ``str(pathlib.PurePosixPath(text))`` spells it (every message names files so):
    no empty or ``.`` components, no trailing slash, a leading ``//`` kept (POSIX leaves its meaning open)."""
    root = ""
    if text.startswith("/"):
        rest = text.lstrip("/")
        root = "//" if len(text) - len(rest) == 2 else "/"
        text = rest
    parts = [part for part in text.split("/") if part and part != "."]
    return root + "/".join(parts) if root or parts else "."


def _fspath(path: PathLike) -> str:
    """The text of a path object (already in its own spelling), or text spelled as a path object's."""
    return as_pathlib_text(path) if isinstance(path, str) else os.fspath(path)


def _join(folder: str, name: str) -> str:
    """``folder / name`` as pathlib spells it (``os.scandir(".")`` says ``./name``)."""
    if folder == ".":
        return name
    return folder + name if folder.endswith("/") else f"{folder}/{name}"


def _is_dir(path: str) -> bool:
    """:meth:`pathlib.Path.is_dir`: False where the path does not lead to a directory, an error for any
    other reason it cannot be looked at (permission denied)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            raise
        return False
    except ValueError:
        return False


def discover(root: PathLike) -> list[DumpFile]:
    """Every file under ``root`` named like a dump, sorted by rank; FrFormatError when there is none.

    Files are grouped by name prefix (``nccl_trace_rank_``, ``comm_lib_trace_rank_``, ...); the prefix
    naming the most ranks is the dump set and other files ending in a number are ignored. A rank that
    appears twice in that set (pickle and JSON side by side, two copies of a job) is an error: the caller
    must pick one folder.
    """
    root = _fspath(root)
    if not _is_dir(root):
        raise FrFormatError(f"{root}: not a directory")
    by_prefix: dict[str, list[DumpFile]] = {}
    count = 0
    for path in _walk(root):
        match = _NAME_RE.match(path.rpartition("/")[2])
        if match is None:
            continue
        rank = int(match["rank"])
        if rank > 1 << 24:
            continue
        by_prefix.setdefault(match["prefix"], []).append(
            DumpFile(path=path, rank=rank, prefix=match["prefix"])
        )
        count += 1
        if count > MAX_FILES:
            raise FrFormatError(f"{root}: more than {MAX_FILES} files named like dumps")
    if not by_prefix:
        raise FrFormatError(f"{root}: no flight recorder dumps (files named <prefix><rank>[.json][.gz])")
    best = max(by_prefix.values(), key=lambda files: (len({f.rank for f in files}), len(files)))
    found: dict[int, DumpFile] = {}
    for dump in best:
        other = found.get(dump.rank)
        if other is not None:
            raise FrFormatError(
                f"{root}: rank {dump.rank} has two dumps ({_relative(other.path, root)} and "
                f"{_relative(dump.path, root)}); point at one folder per dump set"
            )
        found[dump.rank] = dump
    return [found[r] for r in sorted(found)]


def _relative(path: str, root: str) -> str:
    """``path`` (found under ``root`` by :func:`_walk`) relative to ``root``."""
    return path if root == "." else path[len(root) if root.endswith("/") else len(root) + 1 :]


def _walk(root: str) -> Iterator[str]:
    """Regular files under ``root`` (sorted, hidden names skipped). A symlink (file or folder), FIFO,
    socket or device named like a dump — or a symlinked folder — is refused with FrFormatError: a link
    to ``/etc/shadow`` must not be read by a root daemon, and a FIFO must not be silently skipped and
    then reported as a rank that left no dump."""
    stack = [root]
    depth = {root: 0}
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                items = sorted(it, key=lambda d: d.name)
        except OSError as exc:
            raise FrFormatError(f"{folder}: cannot list: {exc.strerror or exc}") from None
        subdirs = []
        for item in items:
            if item.name.startswith("."):
                continue
            path = _join(folder, item.name)
            # the kind from the directory entry itself (d_type): no lstat per file, which was a third of
            # listing 16,384 dumps (DirEntry falls back to lstat where the file system gives no type)
            try:
                if item.is_dir(follow_symlinks=False):
                    if depth[folder] < MAX_DEPTH:
                        depth[path] = depth[folder] + 1
                        subdirs.append(path)
                    continue
                if item.is_file(follow_symlinks=False):
                    yield path
                    continue
                link = item.is_symlink()
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished while listing
            if link:
                if _NAME_RE.match(item.name) or os.path.isdir(path):
                    raise FrFormatError(f"{path}: is a symbolic link: refused (links are never followed)")
                continue
            if _NAME_RE.match(item.name):
                kind = (
                    "a FIFO"
                    if stat.S_ISFIFO(st.st_mode)
                    else "a socket"
                    if stat.S_ISSOCK(st.st_mode)
                    else "a device"
                )
                raise FrFormatError(f"{path}: is {kind}, not a dump file: refused")
        stack.extend(reversed(subdirs))


def open_regular(path: PathLike, limit: int = MAX_DUMP_BYTES) -> tuple[int, int]:
    """(file descriptor, size) of a regular file of at most ``limit`` bytes; the caller closes it.

    Opened without following a symlink and without blocking (a FIFO swapped in after the listing must
    not hang us), and refused unless it is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FrFormatError(f"{path}: is a symbolic link: refused (links are never followed)") from None
        raise FrFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FrFormatError(f"{path}: not a regular file: refused")
        if st.st_size > limit:
            raise FrFormatError(f"{path}: larger than {limit} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_bytes(path: PathLike, limit: int = MAX_DUMP_BYTES) -> bytes:
    """The file's bytes, gunzipped when gzip, refusing anything larger than ``limit`` once expanded."""
    fd, size = open_regular(path, limit)
    try:
        return _read_open(fd, size, path, limit)
    finally:
        os.close(fd)


def _read_open(fd: int, size: int, path: PathLike, limit: int) -> bytes:
    try:
        with os.fdopen(fd, "rb", closefd=False) as fh:
            fh.seek(0)
            # ask for the size the file has (+1 to see growth): a read of ``limit`` would allocate
            # ``limit`` bytes first, fresh pages for every dump (half the system time at 16,384 dumps)
            data = fh.read(size + 1)
            if len(data) > size:  # grew while read: read on, still bounded
                data += fh.read(limit + 1 - len(data))
    except OSError as exc:
        raise FrFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise FrFormatError(f"{path}: larger than {limit} bytes")
    if data[:2] == _GZIP_MAGIC:
        return gunzip_bounded(data, limit, source=str(path))
    return data


def gunzip_bounded(data: bytes, limit: int, *, source: str) -> bytes:
    """Decompress gzip data, refusing output beyond ``limit`` bytes (gzip bombs)."""
    out = bytearray()
    rest = data
    while rest:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise FrFormatError(f"{source}: corrupt gzip: {exc}") from None
        if len(out) > limit or inflater.unconsumed_tail:
            raise FrFormatError(f"{source}: expands beyond {limit} bytes")
        if not inflater.eof:
            raise FrFormatError(f"{source}: truncated gzip")
        rest = inflater.unused_data
    return bytes(out)


def decode(data: bytes, *, source: str) -> tuple[Any, bool]:
    """Decode dump bytes (pickle or JSON) into plain data; returns (object, is_json)."""
    if not data:
        raise FrFormatError(f"{source}: empty file")
    if data[0] == PICKLE_PROTO:
        return loads_plain(data, source=source), False
    head = data[:64].lstrip()
    if head[:1] == b"{":
        try:
            return json.loads(data), True
        except (ValueError, RecursionError) as exc:
            raise FrFormatError(f"{source}: corrupt JSON: {str(exc)[:120]}") from None
    raise FrFormatError(f"{source}: neither a pickle nor a JSON flight recorder dump")


def parse_dump(obj: Any, *, rank: int, source: str, is_json: bool) -> RawDump:
    """Check the top-level shape of a decoded dump and return it as a :class:`RawDump`."""
    if not isinstance(obj, dict):
        raise FrFormatError(f"{source}: top level is {type(obj).__name__}, expected a dict")
    version = obj.get("version")
    if not isinstance(version, str) or not re.fullmatch(r"2\.\d{1,4}", version):
        raise FrFormatError(f"{source}: field 'version' is {brief(version, 40)}, expected '2.x'")
    entries = obj.get("entries", [])
    if not isinstance(entries, list):
        raise FrFormatError(f"{source}: field 'entries' is {type(entries).__name__}, expected a list")
    if len(entries) > MAX_ENTRIES:
        raise FrFormatError(f"{source}: {len(entries)} entries, more than {MAX_ENTRIES}")
    pg_config = obj.get("pg_config") or {}
    if not isinstance(pg_config, dict):
        raise FrFormatError(f"{source}: field 'pg_config' is {type(pg_config).__name__}, expected a dict")
    pg_status = obj.get("pg_status") or {}
    if not isinstance(pg_status, dict):
        raise FrFormatError(f"{source}: field 'pg_status' is {type(pg_status).__name__}, expected a dict")
    return RawDump(
        source=source,
        rank=rank,
        version=version,
        entries=entries,
        pg_config=pg_config,
        pg_status=pg_status,
        is_json=is_json,
    )


def load_dump(
    path: PathLike,
    rank: int | None = None,
    recent: int | None = None,
    *,
    read_ahead: ReadAhead | None = None,
    fields_only: bool = True,
) -> RawDump:
    """Read, decode and shape-check one dump file. ``rank`` defaults to the number ending its name.

    With ``recent``, a large pickle may be decoded only for its newest ``recent`` entries (see
    :mod:`sentinel.fr.recent`), when they contain every collective a group still waits in.
    ``read_ahead``: the decoding process's :class:`~sentinel.fr.readahead.ReadAhead`, told whether this
    dump was in the page cache and what of it was read. ``fields_only``: the newest entries of a JSON dump
    may be decoded into the keys the analysis reads only (:attr:`RawDump.fields_only`).
    """
    path = _fspath(path)
    if rank is None:
        match = _NAME_RE.match(path.rpartition("/")[2])
        if match is None:
            raise FrFormatError(f"{path}: file name does not end in a rank number")
        rank = int(match["rank"])
    fd, size = open_regular(path)
    tried = False  # the newest entries were looked for at the file's two ends already
    try:
        if recent is not None and size >= ByteView.CHUNK:
            _no_read_ahead(fd)  # before the first read, which would start the read-ahead
            try:
                magic = os.pread(fd, 2, 0) if read_ahead is None else read_ahead.first_bytes(fd, 2)
            except OSError as exc:
                raise FrFormatError(f"{path}: cannot read: {exc.strerror or exc}") from None
            is_json = magic[:1] == b"{"
            if is_json or magic[:1] == bytes([PICKLE_PROTO]):  # read at both ends, the middle if needed
                tried = True
                view = ByteView(fd=fd, size=size, back=ByteView.JSON_BACK if is_json else ByteView.CHUNK // 2)
                found = (
                    decode_recent_json(view, recent, fields_only=fields_only)
                    if is_json
                    else decode_recent(view, recent)
                )
                dump = _recent_dump(found, path, rank, is_json, fields_only=is_json and fields_only)
                if dump is not None:
                    if read_ahead is not None:
                        read_ahead.decoded(len(view.front), len(view.back))
                    return dump
        elif read_ahead is not None:
            with contextlib.suppress(OSError):  # the read below names what is wrong
                read_ahead.first_bytes(fd, 2)
        data = _read_open(fd, size, path, MAX_DUMP_BYTES)
        if read_ahead is not None and size >= ByteView.CHUNK:
            read_ahead.decoded(size, 0)  # a large dump read whole (JSON, gzip, in doubt): so is the next
    finally:
        os.close(fd)
    if recent is not None and not tried:
        # a file read whole (smaller than a read of its two ends, or gzipped: the expanded bytes)
        is_json = data[:1] == b"{"
        found = (
            decode_recent_json(data, recent, fields_only=fields_only)
            if is_json
            else decode_recent(data, recent)
        )
        dump = _recent_dump(found, path, rank, is_json, fields_only=is_json and fields_only)
        if dump is not None:
            return dump
    obj, is_json = decode(data, source=str(path))
    dump = parse_dump(obj, rank=rank, source=str(path), is_json=is_json)
    if recent is not None:  # reduced from its newest entries when they are enough, as decoded in part
        newest = _recent_dump(newest_of_decoded(obj, recent), path, rank, is_json)
        if newest is not None:
            return newest
    return dump


def _no_read_ahead(fd: int) -> None:
    """Tell the kernel this file may be read at its ends only: the disk's read-ahead
    would read the whole file at the first read (a large set does not stay in the page cache: the middle of every dump was read for nothing). A whole-file read still
    reads what it asks for."""
    with contextlib.suppress(AttributeError, OSError):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


def _recent_dump(
    found: Recent | None, path: str, rank: int, is_json: bool, *, fields_only: bool = False
) -> RawDump | None:
    """The dump of the newest entries, when :func:`decode_recent` found them and they are enough."""
    if found is None:
        return None
    top, total, names, skipped_done, skipped = found
    dump = parse_dump(top, rank=rank, source=str(path), is_json=is_json)
    dump.fields_only = fields_only
    dump.total_entries = total
    dump.pg_names = names
    return dump if _recent_is_enough(dump, skipped_done, skipped) else None


def _recent_is_enough(
    dump: RawDump, skipped_done: Callable[[], bool], skipped: list[Any] | None = None
) -> bool:
    """Whether the newest entries hold, for every group still waiting per pg_status, the collective it
    waits in, and nothing can be pending before them: no send/recv (:func:`_p2p_before`) and nothing of a
    group whose pg_status may count send/recv too (:func:`_counts_p2p`: its waits are read from its
    entries, :func:`sentinel.fr.group_tables.apply_status`); where either may be, ``skipped_done`` must show
    every skipped entry retired (the dump is then marked ``skipped_p2p``); else the analysis needs the
    whole buffer. Any doubt (a value the full decode would refuse) means the whole buffer: the full decode
    names what is wrong. Nor may a group's first collective here continue one begun before them
    (:func:`_column_split`; with the ``skipped`` entries decoded, also by their seqs:
    :func:`~sentinel.fr.recent.continues_skipped`)."""
    try:  # each group's oldest entry (filled newest first, the oldest stays)
        oldest = {e.get("pg_id"): e for e in reversed(dump.entries)}
    except (AttributeError, TypeError):  # an entry that is not a dict, or an unhashable pg_id
        return False
    newest: dict[Any, Any] = {}  # and its newest: from the end, only as far as every group has one
    for e in reversed(dump.entries):
        newest.setdefault(e.get("pg_id"), e)
        if len(newest) == len(oldest):
            break
    before = _p2p_before(oldest.values())
    mixed = _counts_p2p(newest.values())
    if before is None or mixed is None or _column_split(dump.entries, oldest) is not False:
        return False
    if skipped is not None and continues_skipped(skipped, oldest):
        return False
    waits = _waits_in_newest(dump, mixed, newest.keys())
    if waits is None:
        return False
    if not before and not waits:
        return True
    dump.skipped_p2p = skipped_done()  # (the scan last: it reads the middle of the file)
    return dump.skipped_p2p


def _counts_p2p(newest: Iterable[Any]) -> set[Any] | None:
    """The pg_ids of the groups whose newest entry counts a send/recv so far (``p2p_seq_id`` above 0, the
    entry itself included; None: in doubt): ProcessGroupNCCL's pg_status of such a group holds the seq of
    its last *work*, of either counter (torch 2.5 initWork: ``isP2P ? seqP2P_ : seqCollective_``), so it
    says nothing about its collectives (backends that record no send/recv: theirs counts ops, mapped)."""
    mixed = set()
    for e in newest:
        name, count = e.get("profiling_name"), e.get("p2p_seq_id", 0)
        if type(name) is not str or type(count) is not int:
            return None
        if count > 0 and backend(name) not in UNRECORDED_P2P_BACKENDS:
            mixed.add(e.get("pg_id"))
    return mixed


def _waits_in_newest(dump: RawDump, mixed: set[Any], seen: Container[Any]) -> bool | None:
    """Whether the newest entries are enough only if no skipped entry is pending (True), are enough
    (False), or are not (None), by pg_status: every collective a group still waits in per pg_status must
    be among them. A group of ``mixed`` (its status may count send/recv: :func:`_counts_p2p`) or one with
    no entry among them (not in ``seen``, the newest entries' pg_ids: what its status counts is unknown,
    and a completed recv #120 after a pending all_reduce #7 reads "done") may wait in any skipped entry
    its status does not show: True."""
    wanted: set[tuple[int, int]] = set()
    unread = False
    for pg_id, status in dump.pg_status.items():
        if not isinstance(status, dict):
            return None
        try:
            enq = int(status.get("last_enqueued_collective", -1))
            done = int(status.get("last_completed_collective", -1))
            key = (int(pg_id), done + 1)
        except (TypeError, ValueError, OverflowError):  # (int() of an infinite float overflows)
            return None  # the full decode names what is wrong
        if key[0] in mixed:
            unread = True
            continue
        if key[0] not in seen:
            unread = True
        if enq > done:
            wanted.add(key)
    if not wanted:  # a dump where no group waits needs none of its entries' ids
        return unread
    try:
        found = {(e.get("pg_id"), e.get("collective_seq_id")) for e in dump.entries if type(e) is dict}
    except TypeError:  # an unhashable pg_id or seq
        return None
    return unread if wanted <= found else None


def _column_split(entries: list[Any], oldest: dict[Any, Any]) -> bool | None:
    """Whether a group's first collective among these entries may continue one begun before them
    (None: in doubt, as for True).

    The reduction folds the entries of one coalesced op into one column (same ``collective_seq_id``:
    a ``nccl:coalesced`` closer, and the members of a slow-path coalesced collective, which never
    complete) — the full decode with the members before, the newest entries without them: a column of
    the closer alone, a false mismatch against a peer whose newest entries hold the whole op. torch 2.5
    writes a send/recv batch's closer with ``is_p2p`` False and the last collective's seq, and a dump may
    carry no ``is_p2p``: behind no member of its batch (first among the newest entries) it is read as a
    collective, folded by the full decode into the collective before it. So a group whose first entry
    read as a collective here is a ``coalesced`` entry, or one not completed, is decoded in full. Read
    as the reduction reads it (:func:`sentinel.fr.summary._summarize`): a send/recv by name or by
    ``is_p2p`` True, or a closer of the ``p2p_seq_id`` of the send/recv right before it in its group
    (:func:`~sentinel.fr.ops.reads_as_p2p`), is not a collective.
    ``oldest``: each group's oldest entry here (by ``pg_id``), which decides alone unless it is a
    send/recv (then that group's entries are followed to its first collective)."""
    p2p_groups = set()
    for pg_id, e in oldest.items():
        name = e.get("profiling_name")
        if type(name) is not str:
            return None
        op = op_name(name)
        if op in P2P or e.get("is_p2p") is True:
            p2p_groups.add(pg_id)
        elif op == COALESCED or not entry_completed(e):
            return True
    if not p2p_groups:  # (the usual case: no pass over the entries)
        return False
    # group -> p2p_seq_id of its previous entry when that is a send/recv (the member a closer follows)
    follows: dict[Any, int | None] = {}
    for e in entries:
        pg_id = e.get("pg_id")
        if pg_id not in p2p_groups:
            continue
        name = e.get("profiling_name")
        seq = e.get("p2p_seq_id", -1)
        if type(name) is not str or type(seq) is not int:
            return None
        op = op_name(name)
        closes = op == COALESCED
        if not reads_as_p2p(op, e.get("is_p2p"), seq, follows.get(pg_id)):
            if closes or not entry_completed(e):
                return True
            p2p_groups.discard(pg_id)
            if not p2p_groups:
                return False
            continue
        follows[pg_id] = None if closes else seq
    return False


def _p2p_before(oldest: Iterable[Any]) -> bool | None:
    """Whether a send/recv may be pending among the entries before the newest ones, where pg_status does
    not show it (None: in doubt); ``oldest``: each group's oldest entry among the newest.

    ProcessGroupNCCL's pg_status holds the seq of what it enqueued and completed last — a collective's or a
    send/recv's, whichever came last — so an ``isend`` still pending behind later collectives of its group
    leaves the group "done", and only its entry says the rank is blocked in it. Every entry carries its
    group's send/recv count so far (``p2p_seq_id``, itself included): a group whose oldest entry here
    counts one before it may have one pending further back. Backends that record no send/recv (gloo:
    :data:`~sentinel.fr.ops.UNRECORDED_P2P_BACKENDS`) cannot; an entry that is not a dict, or a count that
    is not an integer, is a doubt. One look per group (its oldest entry)."""
    before = False
    for e in oldest:
        name = e.get("profiling_name")
        if type(name) is not str:
            return None
        if backend(name) in UNRECORDED_P2P_BACKENDS:
            continue
        count = e.get("p2p_seq_id", 0)
        if type(count) is not int:
            return None
        before = before or count - (op_name(name) in P2P) > 0
    return before
