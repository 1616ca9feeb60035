"""Kernel lines about an HCA port: classified by the corpus README's rules, matched to the port they name,
carried on its record and shown with the port rules' findings; end to end through the real agent.

Line formats are the mlx5 driver's (mlx5e/IPoIB carrier ``<netdev>: Link down``, mlx5_ib ``Port: N Link
DOWN``, port module events), as printed in public logs (the corpus and eval set hold copies with sources).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.agent import Agent
from sentinel.aggregator.engine import Engine
from sentinel.components.ib.kernel import PORT_REASONS, PortLogLine, host_evidence, names_port, port_log_line
from sentinel.components.ib.record import PortReading
from sentinel.components.ib.rule import PortRuleConfig, evaluate_ports
from sentinel.components.ib.tracker import PortTracker
from sentinel.config.aggregator import AggregatorConfig
from sentinel.signals import classify_line
from tests.agent.conftest import make_config
from tests.agent.fakes import FakeSource
from tests.components.ib.conftest import SysfsTree
from tests.support import sent

# (line, kind, severity, pci_bus, name, port) — kind and severity by the README's rules: a link going
# down or a cable unplugged is a warning, a transceiver error critical; mlx5 is "other".
LINES = [
    ("mlx5_core 0000:17:00.0 ib0: Link down", "other", "warning", "0000:17:00.0", "ib0", None),
    (
        "[ 4120.556101] mlx5_core 0000:01:00.1 enp1s0f1: Link down",
        "other",
        "warning",
        "0000:01:00.1",
        "enp1s0f1",
        None,
    ),
    (
        "Feb 14 05:09:12 000-000-00000-1-gpu-1 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN",
        "other",
        "warning",
        "0000:ab:00.0",
        "mlx5_5",
        1,
    ),
    (
        "[32704.121294] mlx5_core 0000:01:00.0: Port module event: module 0, Cable unplugged",
        "other",
        "warning",
        "0000:01:00.0",
        "",
        None,
    ),
    (
        "Dec  2 10:43:35 worker4 kernel: mlx5_core 0000:5E:00.0: mlx5_port_module_event:1145:(pid 0): "
        "Port module event[error]: module 0, Cable error, Bad cable",
        "other",
        "warning",  # the port's link is unusable, the HCA and its other ports carry on
        "0000:5e:00.0",
        "",
        None,
    ),
]


@pytest.mark.parametrize(("line", "kind", "severity", "pci", "name", "port"), LINES)
def test_port_lines_are_classified_by_the_rules_and_name_their_port(
    line: str, kind: str, severity: str, pci: str, name: str, port: int | None
) -> None:
    event = classify_line(line)
    assert event is not None
    assert (event.kind, event.severity, event.pci_bus) == (kind, severity, None)  # not a GPU address
    found = port_log_line(line, event.reason)
    assert found is not None
    assert (found.pci_bus, found.name, found.port) == (pci, name, port)
    assert found.text.startswith("mlx5_core ")


@pytest.mark.parametrize(
    "line",
    [
        "[32710.060490] mlx5_core 0000:01:00.0 enp1s0f0: Link up",  # normal operation: no evidence
        "[32704.121294] mlx5_core 0000:01:00.0: Port module event: module 0, Cable plugged",
        # a relay that cut the driver prefix: no port can be named
        "[...] mlx5_port_module_event:1131:(pid 0): Port module event[error]: module 0, Cable error, High "
        "Temperature",
        "[ 1234.567890] ice 0000:17:00.0 ens1f0: NIC Link is Down",  # not an HCA the ib component reads
    ],
)
def test_lines_that_are_not_port_evidence(line: str) -> None:
    event = classify_line(line)
    reason = event.reason if event is not None else None
    assert port_log_line(line, reason) is None


def _reading(device: str, pci: str, netdev: str = "", up: bool = True) -> PortReading:
    return PortReading(
        device=device,
        port=1,
        state="active" if up else "down",
        phys_state="linkup" if up else "disabled",
        rate_gbps=400.0,
        link_layer="InfiniBand",
        counters={"link_downed": 0 if up else 1},
        netdev=netdev,
        pci_bus=pci,
    )


def _line(text: str) -> PortLogLine:
    event = classify_line(text)
    assert event is not None
    found = port_log_line(text, event.reason)
    assert found is not None
    return found


def test_matching_by_device_interface_or_pci_function() -> None:
    ib0 = _line("mlx5_core 0000:17:00.0 ib0: Link down")
    assert names_port(ib0, "mlx5_0", 1, "", "0000:17:00.0")  # sysfs linked no netdev: the PCI function
    assert names_port(ib0, "mlx5_0", 1, "ib0", "0000:17:00.0")
    assert not names_port(ib0, "mlx5_0", 1, "ib1", "0000:17:00.0")  # another interface on it
    assert not names_port(ib0, "mlx5_1", 1, "", "0000:3b:00.0")
    port_state = _line("kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN")
    assert names_port(port_state, "mlx5_5", 1, "", "0000:ab:00.0")
    assert not names_port(port_state, "mlx5_5", 2, "", "0000:ab:00.0")
    assert not names_port(port_state, "mlx5_4", 1, "", "0000:ab:00.0")


def test_tracker_keeps_lines_as_evidence_not_as_downs_and_forgets_them_after_the_window() -> None:
    tracker = PortTracker(flap_window_s=600.0)
    # The kernel log is replayed before the first port scan: the line waits for its port.
    tracker.note_kernel_line(_line("mlx5_core 0000:3b:00.0 ib0: Link down"), 5.0)
    up = [_reading("mlx5_0", "0000:19:00.0"), _reading("mlx5_1", "0000:3b:00.0")]
    first = {p.device: p for p in tracker.update(up, 10.0)}
    assert first["mlx5_1"].kernel_log == ["mlx5_core 0000:3b:00.0 ib0: Link down"]
    assert first["mlx5_0"].kernel_log == []
    assert first["mlx5_1"].downs == []  # the counter counts losses of link; a line is not one more
    tracker.note_kernel_line(
        _line("mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged"), 11.0
    )
    down = [_reading("mlx5_0", "0000:19:00.0"), _reading("mlx5_1", "0000:3b:00.0", up=False)]
    second = {p.device: p for p in tracker.update(down, 12.0)}
    assert second["mlx5_1"].kernel_log == [
        "mlx5_core 0000:3b:00.0 ib0: Link down",
        "mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged",
    ]
    assert len(second["mlx5_1"].downs) == 1
    findings = evaluate_ports(list(second.values()), PortRuleConfig(), 20.0)
    [found] = [f for f in findings if f.device == "mlx5_1" and f.reason == "ib_port_down"]
    assert found.evidence[1:] == (
        "kernel log: mlx5_core 0000:3b:00.0 ib0: Link down",
        "kernel log: mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged",
    )
    later = {p.device: p for p in tracker.update(down, 700.0)}
    assert later["mlx5_1"].kernel_log == []


def test_unmatched_lines_are_bounded() -> None:
    tracker = PortTracker()
    for n in range(1000):
        tracker.note_kernel_line(_line(f"mlx5_core 0000:{n % 256:02x}:00.1 ib0: Link down"), float(n))
    ports = tracker.update([_reading("mlx5_0", "0000:e7:00.1")], 1000.0)
    assert len(ports[0].kernel_log) <= 8


async def test_agent_carries_a_kernel_link_down_to_the_port_and_its_finding(
    tmp_path: Path, dgx: SysfsTree
) -> None:
    """The real agent: /dev/kmsg (a plain file here) → classification → the ib collector's record."""
    (tmp_path / "state").mkdir(exist_ok=True)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,1001,81234567,-;mlx5_core 0000:3b:00.0 ib0: Link down\n"
        "3,1002,81234999,-;mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged\n"
    )
    config = make_config(
        tmp_path,
        ib={"sysfs_root": str(dgx.root), "interval_s": 0.1},
        kmsg={"enabled": True, "path": str(kmsg)},
    )
    agent = Agent(config, FakeSource(gpus=2))
    try:
        first = sent(await agent.step(100.0))
        dgx.link_down("mlx5_1")
        await agent.step(102.0)
        batch = sent(await agent.step(105.0))
        assert batch.ports is not None
        port = {p.device: p for p in batch.ports}["mlx5_1"]
        assert port.kernel_log == [
            "mlx5_core 0000:3b:00.0 ib0: Link down",
            "mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged",
        ]
        assert {p.device: p for p in batch.ports}["mlx5_0"].kernel_log == []
        findings = evaluate_ports(batch.ports, PortRuleConfig(), 105.0)
        [down] = [f for f in findings if f.reason == "ib_port_down"]
        assert down.device == "mlx5_1"
        assert (
            "kernel log: mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged"
            in down.evidence
        )
        events = [e for e in first.events if e.kind == "log" and "mlx5_core" in e.text]
        assert [e.severity for e in events] == ["warning", "warning"]  # still log events of their own
    finally:
        await agent.shutdown()


async def test_a_kernel_line_reaches_the_port_verdict_once(tmp_path: Path, dgx: SysfsTree) -> None:
    """Real agent → real engine: a port line rides on the port's record, an HCA line the agent cannot put on
    a port (a completion error) is the aggregator's host evidence; neither reaches the verdict twice."""
    (tmp_path / "state").mkdir(exist_ok=True)
    kmsg = tmp_path / "kmsg"
    port_line = "mlx5_core 0000:3b:00.0 mlx5_1: Port: 1 Link DOWN"
    cable_line = (
        "mlx5_core 0000:3b:00.0: mlx5_port_module_event:1145:(pid 0): Port module event[error]: module 0, "
        "Cable error, Bad cable"
    )
    hca_line = (
        "infiniband mlx5_1: mlx5_handle_error_cqe:332:(pid 0): WC error: 5, Message: local protection error"
    )
    kmsg.write_text(
        f"4,1001,81234567,-;{port_line}\n3,1002,81234999,-;{cable_line}\n3,1003,81235000,-;{hca_line}\n"
    )
    config = make_config(
        tmp_path,
        ib={"sysfs_root": str(dgx.root), "interval_s": 0.1},
        kmsg={"enabled": True, "path": str(kmsg)},
    )
    agent = Agent(config, FakeSource(gpus=2))
    engine = Engine(AggregatorConfig())
    try:
        host = engine.hello(agent.hello(), 100.0)
        for t in (100.0, 102.0, 105.0):
            if t == 102.0:
                dgx.link_down("mlx5_1")
            engine.ingest(host, sent(await agent.step(t)), t)
        changes = engine.tick(105.0)
    finally:
        await agent.shutdown()
    [down] = [c.verdict for c in changes if c.verdict.reason == "ib_port_down"]
    evidence = "\n".join(down.evidence)
    assert evidence.count(port_line) == 1
    assert evidence.count(cable_line) == 1
    assert evidence.count("WC error: 5") == 1


@pytest.mark.parametrize(
    ("line", "reason", "kept"),
    [
        ("mlx5_core 0000:3b:00.0 ib0: Link down", "link_down", False),  # on the port's record
        ("mlx5_core 0000:3b:00.0 mlx5_1: Port: 1 Link DOWN", "ib_link_down", False),
        ("ib0: Link down", "link_down", True),  # no PCI function: the agent cannot place it
        ("infiniband mlx5_1: WC error: 5", "ib_completion_error", True),
        ("mlx5_core 0000:3b:00.0 ib0: Link down", "nccl_warn_net", False),  # not about an HCA
    ],
)
def test_each_hca_line_takes_one_path(line: str, reason: str, kept: bool) -> None:
    assert host_evidence(line, reason) is kept
    assert (port_log_line(line, reason) is not None) is (reason in PORT_REASONS and not kept)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                ["mlx5_core ", "0000:3b:00.0", " ib0", ": ", "Link down", "Port: ", "1 ", "\x00"]
            ),
            st.text(max_size=40),
        ),
        max_size=30,
    ),
    st.sampled_from(["link_down", "ib_port_hardware", "ib_link_down", None]),
)
def test_port_log_line_never_raises_and_is_bounded(parts: list[str], reason: str | None) -> None:
    found = port_log_line("".join(parts), reason)
    if found is not None:
        assert len(found.text) <= 300
        assert names_port(found, "mlx5_0", 1, "", found.pci_bus)
