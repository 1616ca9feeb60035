"""Read-ahead: once a dump came from disk, the next dumps' parts that decoding reads are asked for ahead of
time, and a set in the page cache is never hinted. Observed through the real page cache: a file is evicted
with ``posix_fadvise(DONTNEED)`` and whether its pages are cached is read back with ``RWF_NOWAIT``."""

from __future__ import annotations

import ctypes
import gzip
import json
import mmap
import os
import time
from pathlib import Path

import pytest

from bench.fr import evict
from sentinel.fr.dumpset import analyze_dir
from sentinel.fr.loader import load_dump
from sentinel.fr.readahead import ReadAhead
from sentinel.fr.safepickle import loads_plain

SOURCE = Path(__file__).resolve().parent.parent / "data/fr/wrapped_hang_n8/pickle"
#: How long the kernel may take to read hinted pages (it starts at once; this only bounds a failure).
HINTED_WITHIN_S = 20.0


def _cached(path: Path, offset: int) -> bool:
    """Whether the page holding byte ``offset`` of ``path`` is in the page cache: ``mincore`` of a mapping
    never touched (a read, even one with ``RWF_NOWAIT``, would start reading a page it misses)."""
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        start = offset - offset % page
        addr = _libc.mmap(None, page, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            vec = (ctypes.c_ubyte * 1)()
            if _libc.mincore(ctypes.c_void_p(addr), page, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return bool(vec[0] & 1)
        finally:
            _libc.munmap(ctypes.c_void_p(addr), page)
    finally:
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]


def _wrapped_set(folder: Path) -> list[Path]:
    """The real wrapped 2,000-entry dumps (~370 KB each: decoded at both ends), unzipped."""
    folder.mkdir()
    out = []
    for src in sorted(SOURCE.iterdir()):
        path = folder / src.name.removesuffix(".gz")
        path.write_bytes(gzip.decompress(src.read_bytes()))
        out.append(path)
    return out


def _evicted(folder: Path) -> None:
    """Evict every file of ``folder``, or skip where this file system cannot (tmpfs keeps files in memory)."""
    if not hasattr(os, "RWF_NOWAIT") or not hasattr(os, "posix_fadvise"):
        pytest.skip("needs RWF_NOWAIT and posix_fadvise (Linux)")
    evict(folder)
    if _cached(next(folder.iterdir()), 0):
        pytest.skip("this file system keeps evicted files in memory (tmpfs?)")


def test_after_a_dump_came_from_disk_the_next_one_is_read_ahead_at_its_two_ends(tmp_path: Path) -> None:
    first, hinted, untouched, *_ = _wrapped_set(tmp_path / "set")
    size = hinted.stat().st_size
    _evicted(tmp_path / "set")
    read_ahead = ReadAhead(ahead=1)
    paths = [str(first), str(hinted), str(untouched)]

    read_ahead(paths, 0)  # nothing came from disk yet: no hint
    assert read_ahead.hints == 0
    load_dump(first, recent=128, read_ahead=read_ahead)
    assert read_ahead.cold
    assert 1 << 16 <= read_ahead.front < size // 2  # what the decode read of the front: the ends only
    assert 0 < read_ahead.back < size // 2

    read_ahead(paths, 0)
    assert read_ahead.hints == 1  # only the next one (ahead=1)
    deadline = time.monotonic() + HINTED_WITHIN_S
    front_end, back_start = read_ahead.front - 1, size - read_ahead.back
    while not (_cached(hinted, 0) and _cached(hinted, front_end) and _cached(hinted, back_start)):
        assert time.monotonic() < deadline, "the hinted dump's ends were not read"
        time.sleep(0.01)
    assert _cached(hinted, size - 1)
    assert not _cached(hinted, (front_end + back_start) // 2)  # its middle, which no decode reads
    assert not _cached(untouched, 0)  # beyond ``ahead``: not asked for

    read_ahead(paths, 0)  # asked again for the same dump: nothing hinted twice
    read_ahead(paths, 1)
    assert read_ahead.hints == 2


def test_a_set_in_the_page_cache_is_never_hinted(tmp_path: Path) -> None:
    paths = _wrapped_set(tmp_path / "set")
    for p in paths:
        p.read_bytes()
    read_ahead = ReadAhead()
    names = [str(p) for p in paths]
    for i, p in enumerate(paths):
        read_ahead(names, i)
        load_dump(p, recent=128, read_ahead=read_ahead)
    assert not read_ahead.cold
    assert read_ahead.hints == 0


def test_small_and_gzipped_dumps_are_probed_too(tmp_path: Path) -> None:
    """A file under 64 KiB (read whole) says whether it came from disk as a large one does."""
    src = sorted(SOURCE.iterdir())[0]
    (tmp_path / "set").mkdir()
    gz = tmp_path / "set" / src.name
    gz.write_bytes(src.read_bytes())
    _evicted(tmp_path / "set")
    read_ahead = ReadAhead()
    load_dump(gz, recent=128, read_ahead=read_ahead)
    assert read_ahead.cold


def test_a_hint_never_follows_a_link_waits_on_a_fifo_or_raises(tmp_path: Path) -> None:
    [dump, *_] = _wrapped_set(tmp_path / "set")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(dump)
    folder = tmp_path / "folder"
    folder.mkdir()
    read_ahead = ReadAhead(ahead=8)
    read_ahead.cold = True
    read_ahead([str(dump), str(fifo), str(link), str(folder), str(tmp_path / "gone"), str(dump)], 0)
    assert read_ahead.hints == 1  # the regular file alone (the last entry), and nothing raised or hung


def test_a_set_read_from_disk_is_analyzed_as_from_the_cache(tmp_path: Path) -> None:
    _wrapped_set(tmp_path / "set")
    cached = analyze_dir(tmp_path / "set", workers=2).to_json()
    _evicted(tmp_path / "set")
    cold = analyze_dir(tmp_path / "set", workers=2).to_json()
    assert json.dumps(cold, sort_keys=True) == json.dumps(cached, sort_keys=True)
    assert cold["verdict"] == "hang"


def test_after_a_large_dump_read_whole_the_next_one_is_read_ahead_whole(tmp_path: Path) -> None:
    """A JSON dump (or a gzipped one) is read whole, however large: so its read-ahead is."""
    folder = tmp_path / "json"
    folder.mkdir()
    src = gzip.decompress(sorted(SOURCE.iterdir())[0].read_bytes())
    as_json = json.dumps(loads_plain(src, source="rank 0")).encode()
    assert len(as_json) > 1 << 17
    paths = [folder / f"nccl_trace_rank_{r}.json" for r in range(2)]
    for p in paths:
        p.write_bytes(as_json)
    _evicted(folder)
    read_ahead = ReadAhead(ahead=1)
    load_dump(paths[0], recent=128, read_ahead=read_ahead)
    assert read_ahead.cold
    assert read_ahead.front >= len(as_json)
    read_ahead([str(p) for p in paths], 0)
    deadline = time.monotonic() + HINTED_WITHIN_S
    while not all(_cached(paths[1], at) for at in (0, len(as_json) // 2, len(as_json) - 1)):
        assert time.monotonic() < deadline, "the hinted dump was not read whole"
        time.sleep(0.01)
