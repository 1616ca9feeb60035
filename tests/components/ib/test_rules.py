"""Port history and port rules over ticks of a changing fixture tree (virtual time, no sleeping)."""

from __future__ import annotations

from pathlib import Path

from sentinel.components.ib.record import IbPort
from sentinel.components.ib.rule import PortRuleConfig, evaluate_ports
from sentinel.components.ib.sysfs import SysfsPorts
from sentinel.components.ib.tracker import PortTracker
from tests.components.ib.conftest import SysfsTree

CFG = PortRuleConfig()


def tick(tree: SysfsTree, tracker: PortTracker, t: float) -> dict[str, IbPort]:
    return {p.device: p for p in tracker.update(SysfsPorts(tree.root).read().ports, t)}


def reasons(ports: dict[str, IbPort], t: float, cfg: PortRuleConfig = CFG) -> set[tuple[str, str]]:
    return {(f.device, f.reason) for f in evaluate_ports(list(ports.values()), cfg, t)}


def test_healthy_tree_has_no_findings(dgx: SysfsTree) -> None:
    tracker = PortTracker()
    for t in (0.0, 2.0, 4.0):
        ports = tick(dgx, tracker, t)
    assert reasons(ports, 4.0) == set()  # mlx5_3 was never up: an unused port is no fault


def test_counter_rates_per_second(dgx: SysfsTree) -> None:
    tracker = PortTracker()
    tick(dgx, tracker, 0.0)
    dgx.add("mlx5_0", "port_xmit_data", 50_000_000)
    ports = tick(dgx, tracker, 2.0)
    assert ports["mlx5_0"].rates["port_xmit_data"] == 25_000_000.0
    assert ports["mlx5_0"].rates["symbol_error"] == 0.0


def test_port_down_after_grace_and_recovery(dgx: SysfsTree) -> None:
    tracker = PortTracker()
    tick(dgx, tracker, 0.0)
    dgx.link_down("mlx5_0")
    ports = tick(dgx, tracker, 2.0)
    assert ("mlx5_0", "ib_port_down") not in reasons(ports, 3.0)  # inside down_after_s
    ports = tick(dgx, tracker, 4.0)
    found = evaluate_ports(list(ports.values()), CFG, 4.0)
    down = next(f for f in found if f.reason == "ib_port_down")
    assert (down.kind, down.action, down.since) == ("faulty", "drain", 2.0)
    dgx.link_up("mlx5_0")
    ports = tick(dgx, tracker, 6.0)
    assert reasons(ports, 6.0) == {("mlx5_0", "ib_link_downed")}  # one loss that recovered: degraded


def test_flap_from_link_downed_between_reads(dgx: SysfsTree) -> None:
    tracker = PortTracker()
    tick(dgx, tracker, 0.0)
    dgx.add("mlx5_1", "link_downed", 3)  # three bounces between two reads: the state never looked down
    ports = tick(dgx, tracker, 2.0)
    assert ("mlx5_1", "ib_link_flap") in reasons(ports, 2.0)
    ports = tick(dgx, tracker, 2.0 + 601.0)
    assert reasons(ports, 603.0) == set()  # out of the flap window


def test_flaps_survive_an_agent_restart(dgx: SysfsTree, tmp_path: Path) -> None:
    state = tmp_path / "ib_ports.json"
    tracker = PortTracker(state_path=state)
    tick(dgx, tracker, 0.0)
    for t in (10.0, 20.0):
        dgx.link_down("mlx5_0")
        tick(dgx, tracker, t)
        dgx.link_up("mlx5_0")
        tick(dgx, tracker, t + 2)
    assert state.exists()
    restarted = PortTracker(state_path=state)  # a new agent process
    dgx.link_down("mlx5_0")
    dgx.link_up("mlx5_0")  # the third bounce happened while the agent was restarting
    ports = tick(dgx, restarted, 40.0)
    assert len(ports["mlx5_0"].downs) == 3
    assert ("mlx5_0", "ib_link_flap") in reasons(ports, 40.0)
    fresh = PortTracker()  # without the state file the same reading shows no history
    assert len(tick(dgx, fresh, 40.0)["mlx5_0"].downs) == 0


def test_damaged_state_file_is_ignored(dgx: SysfsTree, tmp_path: Path) -> None:
    state = tmp_path / "ib_ports.json"
    state.write_text('{"version": 1, "ports": {"mlx5_0/1": {"downs": ["x"]}}}')
    tracker = PortTracker(state_path=state)
    assert tracker.ports == {}
    assert tick(dgx, tracker, 0.0)["mlx5_0"].downs == []


def test_rate_below_host_majority_or_config(dgx: SysfsTree) -> None:
    tracker = PortTracker()
    dgx.set("mlx5_1", "rate", "200 Gb/sec (2X NDR)")
    ports = tick(dgx, tracker, 0.0)
    assert reasons(ports, 0.0) == set()  # 400 vs 200 among InfiniBand ports: a tie is no majority
    configured = PortRuleConfig(expected_rate_gbps=400, ignore_devices=["mlx5_2"])  # the RoCE NIC is 200G
    assert reasons(ports, 0.0, configured) == {("mlx5_1", "ib_rate_degraded")}
    dgx.set("mlx5_3", "state", "4: ACTIVE")
    dgx.set("mlx5_3", "phys_state", "5: LinkUp")
    dgx.set("mlx5_3", "rate", "400 Gb/sec (4X NDR)")
    ports = tick(dgx, tracker, 2.0)
    assert reasons(ports, 2.0) == {("mlx5_1", "ib_rate_degraded")}  # two of three run at 400


def test_symbol_and_receive_error_budgets(dgx: SysfsTree) -> None:
    tracker = PortTracker(error_window_s=3600.0)
    tick(dgx, tracker, 0.0)
    dgx.add("mlx5_0", "symbol_error", 10)
    dgx.add("mlx5_2", "port_rcv_errors", 6)
    dgx.add("mlx5_2", "local_link_integrity_errors", 5)
    ports = tick(dgx, tracker, 600.0)
    assert reasons(ports, 600.0) == {("mlx5_2", "ib_receive_errors")}  # 10 symbol errors: within budget
    dgx.add("mlx5_0", "symbol_error", 1)
    ports = tick(dgx, tracker, 1200.0)
    assert ("mlx5_0", "ib_symbol_errors") in reasons(ports, 1200.0)
    ports = tick(dgx, tracker, 1200.0 + 3700.0)
    assert reasons(ports, 4900.0) == set()  # the errors aged out of the hour


def test_ignored_devices(dgx: SysfsTree) -> None:
    tracker = PortTracker()
    tick(dgx, tracker, 0.0)
    dgx.link_down("mlx5_2")
    tick(dgx, tracker, 10.0)
    ports = tick(dgx, tracker, 12.0)
    assert ("mlx5_2", "ib_port_down") in reasons(ports, 12.0)
    assert reasons(ports, 12.0, PortRuleConfig(ignore_devices=["mlx5_2*"])) == set()


def test_an_hca_gone_from_sysfs_is_a_missing_port_down_until_the_flap_window_ends(dgx: SysfsTree) -> None:
    tracker = PortTracker(flap_window_s=60.0)
    tick(dgx, tracker, 0.0)
    (dgx.root / "class" / "infiniband" / "mlx5_1").unlink()  # the HCA fell off the bus
    ports = tick(dgx, tracker, 2.0)
    gone = ports["mlx5_1"]
    assert (gone.state, gone.phys_state, gone.down_since, gone.rates) == ("missing", "missing", 2.0, {})
    assert len(gone.downs) == 1
    ports = tick(dgx, tracker, 5.0)
    found = [f for f in evaluate_ports(list(ports.values()), CFG, 5.0) if f.device == "mlx5_1"]
    assert [(f.kind, f.reason, f.action) for f in found] == [("faulty", "ib_port_down", "drain")]
    assert "MISSING / missing for 3s" in found[0].evidence[0]
    assert "mlx5_3" not in {d for d, _ in reasons(ports, 5.0)}  # never up, so never missed
    assert "mlx5_1" not in tick(dgx, tracker, 63.0)  # forgotten after the flap window


def test_a_never_up_port_that_disappears_is_not_missed(dgx: SysfsTree) -> None:
    tracker = PortTracker()
    tick(dgx, tracker, 0.0)
    (dgx.root / "class" / "infiniband" / "mlx5_3").unlink()
    assert "mlx5_3" not in tick(dgx, tracker, 2.0)


def test_a_busy_port_between_errors_downs_and_a_counter_reset(dgx: SysfsTree) -> None:
    tracker = PortTracker(error_window_s=3600.0)
    first = tick(dgx, tracker, 0.0)["mlx5_0"]
    for t in range(1, 6):  # traffic only: every read's rates, the window still growing, no error
        dgx.add("mlx5_0", "port_xmit_data", 1000 * t)
        dgx.add("mlx5_0", "port_rcv_data", 500)
        port = tick(dgx, tracker, float(t))["mlx5_0"]
        assert port.counters == {**first.counters, **{n: dgx.counter("mlx5_0", n) for n in first.counters}}
        assert port.rates["port_xmit_data"] == 1000.0 * t and port.rates["port_rcv_data"] == 500.0
        assert port.rates["symbol_error"] == 0.0 and port.window_increase == {}
        assert (port.t, port.window_s, port.downs, port.down_since) == (float(t), float(t), [], None)
    dgx.add("mlx5_0", "symbol_error", 4)
    dgx.add("mlx5_0", "port_xmit_data", 10)
    port = tick(dgx, tracker, 6.0)["mlx5_0"]
    assert port.window_increase == {"symbol_error": 4} and port.rates["symbol_error"] == 4.0
    dgx.add("mlx5_0", "port_xmit_data", 20)
    port = tick(dgx, tracker, 8.0)["mlx5_0"]  # the errors stay counted in the window while traffic moves
    assert port.window_increase == {"symbol_error": 4}
    assert port.rates["symbol_error"] == 0.0 and port.rates["port_xmit_data"] == 10.0
    dgx.set("mlx5_0", "counters/port_xmit_data", 5)  # went back: a driver reload zeroed the counters
    port = tick(dgx, tracker, 9.0)["mlx5_0"]
    assert port.rates == {} and port.window_increase == {} and port.window_s == 0.0
    dgx.link_down("mlx5_0")
    dgx.add("mlx5_0", "port_rcv_data", 7)
    port = tick(dgx, tracker, 10.0)["mlx5_0"]
    assert (port.downs, port.down_since, port.rates["port_rcv_data"]) == ([10.0], 10.0, 7.0)
    assert ("mlx5_0", "ib_port_down") in reasons({"mlx5_0": port}, 10.0 + CFG.down_after_s)
