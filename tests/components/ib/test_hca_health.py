"""mlx5 lines judged by what they mean for the port: a dead HCA is critical, a transceiver event a warning."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.components.ib.hca import CONDITIONS, HcaMemory, hca_condition, judge_hcas, markdown_table
from sentinel.components.ib.kernel import host_evidence, port_log_line
from sentinel.signals import classify_line
from tests.support import REPO

# Our own lines (HCA functions, pids and syndromes chosen for these tests).
LINES = [
    # the HCA stopped answering its health poll: every port on it is gone
    (
        "mlx5_core 0000:b8:00.0: poll_health:811:(pid 0): device's health compromised - reached miss count",
        "critical",
        "ib_hca_failure",
    ),
    # a firmware command never completed
    (
        "mlx5_core 0000:b8:00.0: wait_func:1102:(pid 4410): ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource",
        "critical",
        "ib_hca_cmd_timeout",
    ),
    (
        "mlx5_core 0000:b8:00.1: wait_func:1102:(pid 4410): QUERY_VPORT_STATE(0x750) op_mod(0x1) timeout",
        "critical",
        "ib_hca_cmd_timeout",
    ),
    (
        "mlx5_core 0000:b8:00.0: print_health_info:431:(pid 0): assert_var[0] 0x00c0ffee",
        "critical",
        "ib_hca_fw_fatal",
    ),
    (
        "mlx5_core 0000:b8:00.0: mlx5_health_try_recover:335:(pid 912): firmware fatal error detected, recovering",
        "critical",
        "ib_hca_fw_fatal",
    ),
    # the transceiver: the port degrades or drops, the HCA carries on
    (
        "mlx5_core 0000:b8:00.0: mlx5_port_module_event:1172:(pid 0): Port module event[error]: module 3, High Temperature",
        "warning",
        "ib_port_hardware",
    ),
    (
        "mlx5_core 0000:b8:00.0: Port module event[warning]: module 3, Cable error, Power budget exceeded",
        "warning",
        "ib_port_hardware",
    ),
    ("mlx5_core 0000:b8:00.0: Port module event: module 3, Cable unplugged", "warning", None),
]


@pytest.mark.parametrize(("line", "severity", "reason"), LINES)
def test_hca_lines(line: str, severity: str, reason: str | None) -> None:
    event = classify_line(f"Dec  7 09:14:02 gpu-node-17 kernel: {line}")
    assert event is not None
    assert (event.kind, event.severity, event.pci_bus) == ("other", severity, None)
    if reason is not None:
        assert event.reason == reason


def test_a_failed_hca_is_host_evidence_not_a_ports() -> None:
    line = "mlx5_core 0000:b8:00.0: poll_health:811:(pid 0): device's health compromised - reached miss count"
    event = classify_line(line)
    assert event is not None
    assert port_log_line(line, event.reason) is None
    assert host_evidence(line, event.reason)


HOST_VERDICTS = [
    ("poll_health:811:(pid 0): device's health compromised - reached miss count", "faulty", "drain"),
    ("mlx5_health_try_recover:335:(pid 912): firmware fatal error detected, recovering", "faulty", "drain"),
    (
        "wait_func:1102:(pid 4410): ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource",
        "suspect",
        "drain",
    ),
    ("Port module event[error]: module 3, High Temperature", None, None),
]


@pytest.mark.parametrize(("line", "health", "action"), HOST_VERDICTS)
def test_each_line_is_judged_once_for_the_host(line: str, health: str | None, action: str | None) -> None:
    text = f"mlx5_core 0000:b8:00.0: {line}"
    event = classify_line(text)
    assert event is not None and event.reason is not None
    memory = HcaMemory()
    memory.note(event.reason, text, 5.0)
    memory.note(event.reason, text, 6.0)
    found = judge_hcas(memory)
    if health is None:
        assert found == [] and event.severity == "warning"
        return
    [(finding, first)] = found
    assert (finding.state, finding.action, finding.reason, first) == (health, action, event.reason, 5.0)
    assert finding.evidence[-1].endswith(line)


@given(st.text(max_size=300))
def test_any_line_gets_at_most_one_condition_from_the_table(text: str) -> None:
    condition = hca_condition(text)
    assert condition is None or condition in CONDITIONS


def test_the_docs_table_is_the_code_table() -> None:
    assert markdown_table() in (REPO / "docs" / "network.md").read_text(encoding="utf-8")
