"""NVSwitch SXids, the fabric manager and mlx5 HCA health as host verdicts, through the agent's own line
classification and the real engine: one verdict per host and switch, never one per GPU."""

from __future__ import annotations

from sentinel.agent.classify import LineClassifier, log_line
from sentinel.components.fabric.record import FabricManagerStatus
from sentinel.components.vocab import Severity
from sentinel.wire import LogLine
from tests.aggregator.helpers import Fleet, hello

CLASSIFY = LineClassifier()

# Our own lines, in the nvidia-nvswitch driver's format (switch addresses and links chosen for these tests).
FATAL = [
    "nvidia-nvswitch1: SXid (PCI:0000:a6:00.0): 20034, Fatal, Link 12 LTSSM Fault Up",
    "nvidia-nvswitch1: SXid (PCI:0000:a6:00.0): 20034, Severity 1 Engine instance 12 Sub-engine instance 00",
    "nvidia-nvswitch1: SXid (PCI:0000:a6:00.0): 20034, Data {0x0000300c, 0x00000001, 0x00000000}",
]
NON_FATAL = (
    "nvidia-nvswitch3: SXid (PCI:0000:a8:00.0): 12028, Non-fatal, Link 40 egress non-posted PRIV error"
)
NON_FATAL_DATA = "nvidia-nvswitch3: SXid (PCI:0000:a8:00.0): 12028, Data {0x00000140, 0x00000002}"


def event(text: str, t: float) -> LogLine:
    """The wire event the agent's line processor sends for a kernel line (no GPU: a switch or an HCA)."""
    result = CLASSIFY(text)
    assert result is not None
    severity: Severity = "critical" if result.severity == "critical" else "warning"
    return log_line(
        result.fields, line_kind=result.kind, t=t, source="kmsg", gpu=None, severity=severity, text=text
    )


def verdicts(f: Fleet) -> list[tuple[str, str | None, int | None, str, str]]:
    return sorted((v.kind, v.host, v.gpu, v.reason, v.action) for v in f.engine.book.open.values())


def test_a_fatal_sxid_is_one_host_verdict_naming_the_switch() -> None:
    f = Fleet()
    for t in range(0, 10):
        events = [event(line, float(t)) for line in FATAL] if t == 3 else []
        f.send("h0", float(t), events=events)
        f.send("h1", float(t))
        f.engine.tick(float(t))
    assert verdicts(f) == [("faulty", "h0", None, "sxid_20034", "reboot")]
    [verdict] = f.engine.book.open.values()
    assert "0000:a6:00" in verdict.evidence[0] and "20034" in verdict.evidence[0]


def test_a_reboot_resets_the_switch_and_closes_the_verdict() -> None:
    f = Fleet(hosts=1)
    f.send("h0", 1.0, events=[event(FATAL[0], 1.0)])
    f.engine.tick(1.0)
    assert verdicts(f) == [("faulty", "h0", None, "sxid_20034", "reboot")]
    rebooted = hello("h0")
    rebooted.boot_id = "boot-2"
    f.views["h0"] = f.engine.hello(rebooted, 50.0)
    f.send("h0", 51.0)
    f.engine.tick(51.0)
    assert verdicts(f) == []


def test_non_fatal_sxids_degrade_the_host_only_when_they_repeat() -> None:
    f = Fleet(hosts=1)
    f.engine.config.detect.fabric.nonfatal_sxids = 5
    for t in range(0, 4):  # four events, each with its data line: four, not eight
        f.send("h0", float(t), events=[event(NON_FATAL, float(t)), event(NON_FATAL_DATA, float(t))])
        f.engine.tick(float(t))
    assert verdicts(f) == []
    f.send("h0", 4.0, events=[event(NON_FATAL, 4.0)])
    f.engine.tick(4.0)
    assert verdicts(f) == [("degraded", "h0", None, "sxid_12028", "none")]


def test_fabric_manager_down_past_the_grace_is_a_faulty_host_and_closes_when_it_runs() -> None:
    f = Fleet(hosts=1)
    grace = f.engine.config.detect.fabric.manager_down_after_s
    down = FabricManagerStatus(present=True, running=False, state="failed/failed", since=10.0)
    f.send("h0", 10.0, fabric_manager=down)
    f.engine.tick(10.0)
    f.send("h0", 10.0 + grace - 1)
    f.engine.tick(10.0 + grace - 1)
    assert verdicts(f) == []
    f.send("h0", 10.0 + grace)
    f.engine.tick(10.0 + grace)
    assert verdicts(f) == [("faulty", "h0", None, "fabric_manager_down", "drain")]
    up = FabricManagerStatus(present=True, running=True, state="active/running", since=10.0 + grace + 5)
    f.send("h0", 10.0 + grace + 5, fabric_manager=up)
    f.engine.tick(10.0 + grace + 5)
    assert verdicts(f) == []


def test_a_host_without_the_unit_is_never_judged() -> None:
    f = Fleet(hosts=1)
    absent = FabricManagerStatus(present=False, running=False, state="inactive/dead", since=0.0)
    for t in (0.0, 1000.0, 5000.0):
        f.send("h0", t, fabric_manager=absent)
        f.engine.tick(t)
    assert verdicts(f) == []


def test_hca_lines_are_host_verdicts_by_what_they_mean() -> None:
    f = Fleet(hosts=2)
    dead = "mlx5_core 0000:3a:00.0: poll_health:790:(pid 0): device's health compromised - reached miss count"
    timeout = "mlx5_core 0000:3b:00.0: wait_func:1088:(pid 77): ENABLE_HCA(0x104) timeout. Will cause a leak of a command resource"
    heat = "mlx5_core 0000:3b:00.0: Port module event[error]: module 1, High Temperature"
    f.send("h0", 1.0, events=[event(dead, 1.0)])
    f.send("h1", 1.0, events=[event(timeout, 1.0), event(heat, 1.0)])
    f.engine.tick(1.0)
    assert verdicts(f) == [
        ("degraded", "h1", None, "ib_hca_cmd_timeout", "drain"),
        ("faulty", "h0", None, "ib_hca_failure", "drain"),
    ]
