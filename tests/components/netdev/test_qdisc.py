"""The root qdiscs from rtnetlink: the dump parser on built and random answers, and a real namespace with a
tbf shaper whose overlimits rise while a TCP stream is pushed through it."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.components.netdev.qdisc import (
    NLMSG_DONE,
    RTM_NEWQDISC,
    TC_H_ROOT,
    NetlinkFormatError,
    NetlinkQdiscs,
    QdiscStats,
    parse_dump,
)
from sentinel.components.netdev.sysfs import SysfsNetdevs
from tests.support import need


def _attr(kind: int, value: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(value), kind) + value
    return raw + b"\0" * (-len(raw) % 4)


def _qdisc_msg(ifindex: int, parent: int, kind: str, queue: tuple[int, int, int, int, int]) -> bytes:
    body = struct.pack("=BxxxiLLL", 0, ifindex, 0x80010000, parent, 1)
    body += _attr(1, kind.encode() + b"\0")
    body += _attr(7, _attr(3, struct.pack("=LLLLL", *queue)))
    return struct.pack("=LHHLL", 16 + len(body), RTM_NEWQDISC, 2, 1, 0) + body


def _done() -> bytes:
    return struct.pack("=LHHLL", 20, NLMSG_DONE, 2, 1, 0) + b"\0\0\0\0"


def test_root_qdiscs_are_kept_children_left_out() -> None:
    data = (
        _qdisc_msg(3, TC_H_ROOT, "tbf", (1, 1500, 4, 2, 9000))
        + _qdisc_msg(3, 0x80010001, "fq_codel", (0, 0, 99, 0, 0))
        + _qdisc_msg(5, TC_H_ROOT, "noqueue", (0, 0, 0, 0, 0))
        + _done()
    )
    found, done = parse_dump(data)
    assert done
    assert found == [
        QdiscStats(ifindex=3, kind="tbf", drops=4, overlimits=9000, requeues=2, backlog_bytes=1500, qlen=1),
        QdiscStats(ifindex=5, kind="noqueue"),
    ]


def test_a_truncated_or_lying_length_is_refused() -> None:
    msg = _qdisc_msg(3, TC_H_ROOT, "tbf", (0, 0, 0, 0, 0))
    with pytest.raises(NetlinkFormatError):
        parse_dump(struct.pack("=L", len(msg) + 40) + msg[4:])
    assert parse_dump(msg[:10]) == ([], False)  # less than a header: wait for more, nothing parsed


@given(st.binary(max_size=600))
def test_any_answer_parses_or_is_refused(data: bytes) -> None:
    try:
        found, _ = parse_dump(data)
    except NetlinkFormatError:
        return
    assert all(q.ifindex > 0 for q in found)


@given(st.lists(st.tuples(st.integers(1, 1 << 20), st.integers(0, (1 << 32) - 1)), max_size=20))
def test_every_root_qdisc_built_is_read_back(entries: list[tuple[int, int]]) -> None:
    data = b"".join(_qdisc_msg(i, TC_H_ROOT, "mq", (0, 0, v, 0, v)) for i, v in entries) + _done()
    found, done = parse_dump(data)
    assert done and [(q.ifindex, q.drops, q.overlimits) for q in found] == [(i, v, v) for i, v in entries]


def _can_make_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


@pytest.fixture
def shaped_pair(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Two namespaces joined by a veth pair, the first's end shaped by tbf; removed afterwards."""
    need(_can_make_namespaces(), "network namespaces need root with ip and tc")
    tag = uuid.uuid4().hex[:6]
    a, b = f"snq{tag}a", f"snq{tag}b"
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    steps = [
        ["ip", "netns", "add", a],
        ["ip", "netns", "add", b],
        ["ip", "link", "add", f"q{tag}a", "type", "veth", "peer", "name", f"q{tag}b"],
        ["ip", "link", "set", f"q{tag}a", "netns", a],
        ["ip", "link", "set", f"q{tag}b", "netns", b],
        ["ip", "-n", a, "addr", "add", "10.213.0.1/30", "dev", f"q{tag}a"],
        ["ip", "-n", b, "addr", "add", "10.213.0.2/30", "dev", f"q{tag}b"],
        ["ip", "-n", a, "link", "set", f"q{tag}a", "up"],
        ["ip", "-n", b, "link", "set", f"q{tag}b", "up"],
        ["ip", "netns", "exec", a, "tc", "qdisc", "add", "dev", f"q{tag}a", "root", "tbf", "rate", "200mbit",
         "burst", "32kb", "latency", "50ms"],
        ["nsenter", f"--net=/run/netns/{a}", "mount", "-t", "sysfs", "sysfs", str(sysfs)],
    ]  # fmt: skip
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=30)
        yield f"/run/netns/{a}", sysfs
    finally:
        subprocess.run(["umount", "-l", str(sysfs)], capture_output=True, timeout=30)
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        assert not any(tag in ns for ns in os.listdir("/run/netns")), "a namespace was left behind"


def _push(netns: str, seconds: float) -> None:
    """A TCP stream from the shaped namespace to the other (each socket made inside its namespace)."""
    name = Path(netns).name
    serve = (
        "import socket\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
        "s.bind(('10.213.0.2',5201));s.listen(1);c,_=s.accept()\nwhile c.recv(1<<20):pass"
    )
    send = (
        "import socket,time\nfor _ in range(100):\n try:\n  s=socket.create_connection(('10.213.0.2',5201))\n"
        "  break\n except OSError: time.sleep(0.05)\nb=b'x'*(1<<20);t=time.time()\n"
        f"while time.time()-t<{seconds}: s.sendall(b)\n"
    )
    server = subprocess.Popen(["ip", "netns", "exec", name[:-1] + "b", "python3", "-c", serve])
    try:
        subprocess.run(["ip", "netns", "exec", name, "python3", "-c", send], check=True, timeout=60)
    finally:
        server.kill()
        server.wait(10)


def test_a_shaped_link_waits_in_its_qdisc_read_from_inside_its_namespace(
    shaped_pair: tuple[str, Path],
) -> None:
    netns, sysfs = shaped_pair
    source = SysfsNetdevs(sysfs, NetlinkQdiscs(netns=netns))
    before = {d.name: d for d in source.read().netdevs}
    (name,) = [n for n in before if n.startswith("q")]
    assert before[name].qdisc == "tbf"
    _push(netns, 1.5)
    after = {d.name: d for d in source.read().netdevs}[name]
    assert after.counters["tx_bytes"] - before[name].counters["tx_bytes"] > 10_000_000
    assert after.counters["qdisc_overlimits"] > before[name].counters["qdisc_overlimits"] + 100
    # the reading thread came back to the process's own namespace
    assert os.stat("/proc/thread-self/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino
