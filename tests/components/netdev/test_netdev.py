"""Reading network interfaces from a real sysfs layout: values, rates, bounds, damaged files, the agent."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.agent import Agent
from sentinel.components.netdev.metrics import NetdevMetrics
from sentinel.components.netdev.qdisc import QdiscStats
from sentinel.components.netdev.sysfs import (
    MAX_FILE_BYTES,
    NetdevFormatError,
    SysfsNetdevs,
    parse_counter,
    parse_speed,
    read_small,
)
from sentinel.components.netdev.tracker import NetdevRates
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource
from tests.support import sent

TREE = Path(__file__).parent / "tree"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(TREE, root, symlinks=True)
    return root


def stat_file(root: Path, name: str, counter: str) -> Path:
    return root / "class" / "net" / name / "statistics" / counter


def test_interfaces_as_the_kernel_lays_them_out_loopback_left_out(tree: Path) -> None:
    scan = SysfsNetdevs(tree).read()
    assert scan.errors == []
    by = {d.name: d for d in scan.netdevs}
    assert sorted(by) == ["ens6f1np1", "eth0", "veth-a"]
    eth = by["eth0"]
    assert (eth.operstate, eth.speed_mbps) == ("up", 25000)
    assert eth.counters["rx_bytes"] == 918273645 and eth.counters["rx_dropped"] == 12
    assert len(eth.counters) == 14 and "rx_compressed" not in eth.counters  # only what is judged
    assert (by["ens6f1np1"].operstate, by["ens6f1np1"].speed_mbps) == ("down", None)


def test_rates_per_second_between_reads_and_a_reset_starts_over(tree: Path) -> None:
    source, rates = SysfsNetdevs(tree), NetdevRates()
    first = {d.name: d for d in rates.update(source.read().netdevs, 100.0)}
    assert first["eth0"].rates == {}
    path = stat_file(tree, "eth0", "tx_bytes")
    path.write_text(f"{int(path.read_text()) + 50_000_000}\n")
    second = {d.name: d for d in rates.update(source.read().netdevs, 102.0)}
    assert second["eth0"].rates["tx_bytes"] == 25_000_000.0
    assert second["eth0"].rates["rx_bytes"] == 0.0
    assert second["eth0"].t == 102.0
    path.write_text("5\n")  # the driver was reloaded
    third = {d.name: d for d in rates.update(source.read().netdevs, 104.0)}
    assert third["eth0"].rates == {} and third["veth-a"].rates["tx_bytes"] == 0.0


def test_a_damaged_or_oversized_file_is_named_and_the_rest_still_read(tree: Path) -> None:
    stat_file(tree, "eth0", "rx_errors").write_text("lots\n")
    stat_file(tree, "eth0", "tx_errors").write_text("1" * (MAX_FILE_BYTES + 10))
    scan = SysfsNetdevs(tree).read()
    eth = next(d for d in scan.netdevs if d.name == "eth0")
    assert "rx_errors" not in eth.counters and "tx_errors" not in eth.counters
    assert eth.counters["tx_bytes"] == 123456789
    assert len(scan.errors) == 2 and all("eth0/statistics/" in e for e in scan.errors)


def test_a_fifo_in_place_of_a_counter_is_refused_without_blocking(tree: Path) -> None:
    path = stat_file(tree, "veth-a", "rx_bytes")
    path.unlink()
    os.mkfifo(path)
    scan = SysfsNetdevs(tree).read()
    veth = next(d for d in scan.netdevs if d.name == "veth-a")
    assert "rx_bytes" not in veth.counters and any("not a regular file" in e for e in scan.errors)


def test_interface_count_is_bounded(tmp_path: Path) -> None:
    base = tmp_path / "class" / "net"
    for i in range(70):
        (base / f"eth{i:02d}" / "statistics").mkdir(parents=True)
        (base / f"eth{i:02d}" / "statistics" / "rx_bytes").write_text("1\n")
    scan = SysfsNetdevs(tmp_path).read()
    assert len(scan.netdevs) == 64 and any("more than 64" in e for e in scan.errors)


def test_no_class_net_is_no_interfaces(tmp_path: Path) -> None:
    scan = SysfsNetdevs(tmp_path).read()
    assert scan.netdevs == [] and scan.errors == []


def test_speed_and_counter_parsing() -> None:
    assert parse_speed("-1\n") is None
    assert parse_speed("100000") == 100000
    assert parse_counter("18446744073709551615") == (1 << 64) - 1
    for bad in ("", "-3", "1e5", "18446744073709551616", "١٢"):
        with pytest.raises(NetdevFormatError):
            parse_counter(bad)


@given(st.binary(max_size=300))
def test_any_file_content_parses_or_is_refused(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("f") / "x"
    path.write_bytes(data)
    try:
        value = parse_counter(read_small(path))
    except NetdevFormatError:
        return
    assert 0 <= value < 1 << 64


def test_metrics_render_the_latest_records(tree: Path) -> None:
    metrics = NetdevMetrics("c1", "h1")
    metrics.netdevs = NetdevRates().update(SysfsNetdevs(tree).read().netdevs, 1.0)
    samples = {
        (s.name, frozenset(s.labels.items())): s.value for family in metrics.collect() for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[(name, frozenset({"cluster": "c1", "host": "h1", "netdev": "eth0", **labels}.items()))]

    assert value("sentinel_netdev_data_bytes_total", direction="tx") == 123456789
    assert value("sentinel_netdev_up") == 1.0
    assert value("sentinel_netdev_speed_bytes_per_second") == 25000 * 1e6 / 8
    assert value("sentinel_netdev_errors_total", counter="rx_dropped") == 12
    assert (
        "sentinel_netdev_data_bytes_total",
        frozenset({"cluster": "c1", "host": "h1", "netdev": "lo", "direction": "tx"}.items()),
    ) not in samples


async def test_the_agent_ships_its_interfaces_with_rates_and_metrics(tmp_path: Path, tree: Path) -> None:
    (tmp_path / "state").mkdir()
    config = make_config(tmp_path, netdev={"sysfs_root": str(tree), "interval_s": 0.1})
    agent = Agent(config, FakeSource(gpus=1))
    try:
        batch = sent(await agent.step(100.0))
        assert batch.netdevs is not None and {d.name for d in batch.netdevs} == {
            "eth0",
            "veth-a",
            "ens6f1np1",
        }
        path = stat_file(tree, "veth-a", "rx_bytes")
        path.write_text(f"{int(path.read_text()) + 4000}\n")
        batch = sent(await agent.step(102.0))
        assert batch.netdevs is not None
        assert {d.name: d for d in batch.netdevs}["veth-a"].rates["rx_bytes"] == 2000.0
        text = agent.render_metrics().decode()
        assert 'sentinel_netdev_up{cluster="default",host="host-test",netdev="veth-a"} 1.0' in text
        assert (
            'sentinel_agent_collector_success{cluster="default",collector="netdev",host="host-test"} 1.0'
            in text
        )
    finally:
        await agent.shutdown()


class _Roots:
    """The kernel's answer to a qdisc dump, as the netlink reader returns it."""

    def __init__(self, *roots: QdiscStats, error: OSError | None = None) -> None:
        self.roots = list(roots)
        self.error = error

    def read(self) -> list[QdiscStats]:
        if self.error is not None:
            raise self.error
        return self.roots


def test_the_root_qdisc_joins_its_interface_by_ifindex_and_is_rendered(tree: Path) -> None:
    tbf = QdiscStats(ifindex=7, kind="tbf", overlimits=900, drops=3, backlog_bytes=4096)
    scan = SysfsNetdevs(tree, _Roots(tbf)).read()
    by = {d.name: d for d in scan.netdevs}
    assert (
        by["veth-a"].qdisc,
        by["veth-a"].counters["qdisc_overlimits"],
        by["veth-a"].qdisc_backlog_bytes,
    ) == (
        "tbf",
        900,
        4096,
    )
    assert by["eth0"].qdisc == "" and "qdisc_drops" not in by["eth0"].counters
    metrics = NetdevMetrics("c1", "h1")
    metrics.netdevs = NetdevRates().update(scan.netdevs, 1.0)
    text = {
        (s.name, s.labels.get("netdev"), s.labels.get("counter")): s.value
        for f in metrics.collect()
        for s in f.samples
    }
    assert text[("sentinel_netdev_qdisc_total", "veth-a", "overlimits")] == 900
    assert text[("sentinel_netdev_qdisc_backlog_bytes", "veth-a", None)] == 4096


def test_a_failed_qdisc_dump_is_named_and_the_interfaces_still_read(tree: Path) -> None:
    scan = SysfsNetdevs(tree, _Roots(error=PermissionError(1, "Operation not permitted"))).read()
    assert len(scan.netdevs) == 3 and scan.errors == ["qdisc dump: Operation not permitted"]
