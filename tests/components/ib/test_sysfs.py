"""Reading IB/RoCE ports from a real sysfs layout: values, topology, bounds, damaged files."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sentinel.components.ib.sysfs import SysfsFormatError, SysfsPorts, parse_counter, parse_rate, parse_state
from tests.components.ib.conftest import SysfsTree


def test_state_and_rate_as_the_kernel_prints_them() -> None:
    assert parse_state("4: ACTIVE") == "active"
    assert parse_state("1: DOWN\n") == "down"
    assert parse_state("5: LinkUp") == "linkup"
    assert parse_state("2: Polling") == "polling"
    assert parse_state("7: Phy Test") == "phytest"
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate("200 Gb/sec (2X NDR)") == 200.0
    assert parse_counter("18446744073709551615\n") == (1 << 64) - 1
    for bad in ("ACTIVE", "4 ACTIVE", ""):
        try:
            parse_state(bad)
        except SysfsFormatError:
            continue
        raise AssertionError(bad)


def test_ports_gpus_and_netdev_from_the_tree(dgx: SysfsTree) -> None:
    scan = SysfsPorts(dgx.root).read()
    assert scan.present and scan.errors == []
    by = {p.device: p for p in scan.ports}
    assert sorted(by) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert (by["mlx5_0"].gpus, by["mlx5_0"].locality) == ([0, 1], "pcie_switch")
    assert (by["mlx5_1"].gpus, by["mlx5_1"].locality) == ([2], "pcie_switch")
    assert (by["mlx5_2"].gpus, by["mlx5_2"].locality) == ([2, 3], "numa")
    assert by["mlx5_3"].gpus == [] and not by["mlx5_3"].up
    roce = by["mlx5_2"]
    assert roce.link_layer == "Ethernet" and roce.netdev == "ens6f0np0"
    assert roce.counters["rx_write_requests"] == 88213  # hw_counters/ joined in
    assert by["mlx5_1"].counters["link_downed"] == 2
    assert by["mlx5_0"].pci_bus == "0000:19:00.0" and by["mlx5_0"].numa_node == 0


def test_nvml_numbering_wins_over_pci_order(dgx: SysfsTree) -> None:
    # NVML says the GPU at 0000:3a:00 is index 7 (e.g. CUDA_VISIBLE_DEVICES has nothing to do with it)
    scan = SysfsPorts(dgx.root, {"0000:18:00": 0, "0000:1a:00": 1, "0000:3a:00": 7, "0000:5d:00": 3}).read()
    assert {p.device: p.gpus for p in scan.ports}["mlx5_1"] == [7]


def test_damaged_files_are_named_and_the_rest_is_read(dgx: SysfsTree) -> None:
    dgx.set("mlx5_0", "rate", "fast")
    dgx.set("mlx5_0", "counters/symbol_error", "-3")
    os.remove(dgx.port("mlx5_1") / "state")
    scan = SysfsPorts(dgx.root).read()
    devices = [p.device for p in scan.ports]
    assert "mlx5_1" not in devices and "mlx5_0" in devices
    port = next(p for p in scan.ports if p.device == "mlx5_0")
    assert port.rate_gbps == 0.0 and "symbol_error" not in port.counters
    assert port.counters["link_downed"] == 1
    assert any("mlx5_0/ports/1/rate" in e for e in scan.errors)
    assert any("symbol_error" in e for e in scan.errors)
    assert any("mlx5_1/ports/1/state" in e for e in scan.errors)


def test_no_infiniband_is_not_an_error(tmp_path: Path) -> None:
    scan = SysfsPorts(tmp_path).read()
    assert not scan.present and scan.ports == [] and scan.errors == []


@given(st.text(max_size=200))
def test_state_parser_never_fails_otherwise(text: str) -> None:
    try:
        state = parse_state(text)
    except SysfsFormatError:
        return
    assert state.isalpha() and state == state.lower()


@given(st.one_of(st.text(max_size=100), st.integers(min_value=-(1 << 70), max_value=1 << 70).map(str)))
def test_counter_and_rate_parsers_never_fail_otherwise(text: str) -> None:
    for parse in (parse_counter, parse_rate):
        try:
            value = parse(text)
        except SysfsFormatError:
            continue
        assert 0 <= value < 1 << 64
