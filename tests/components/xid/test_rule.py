"""Xid policy state machine: faulty at once, suspect after repeats from distinct processes, latched."""

from __future__ import annotations

import msgspec
import pytest

from sentinel.components.xid.parse import XidRecord, parse_xid
from sentinel.components.xid.rule import XidPolicy, XidPolicyConfig

GPU = "0000:3b:00"


def xid(code: int, pid: int | None = None, tail: str = "details", gpu: str = GPU) -> XidRecord:
    middle = f"pid={pid}, name=python, " if pid is not None else ""
    record = parse_xid(f"NVRM: Xid (PCI:{gpu}): {code}, {middle}{tail}")
    assert record is not None
    return record


def test_xid13_three_processes_within_window_is_suspect_then_reset_clears() -> None:
    policy = XidPolicy()
    assert policy.observe(xid(13, pid=100), now=0).state == "ok"
    assert policy.observe(xid(13, pid=200), now=600).state == "ok"
    decision = policy.observe(xid(13, pid=300), now=1200)
    assert (decision.state, decision.reason, decision.changed) == ("suspect", "xid_13_repeated", True)
    assert decision.evidence
    assert policy.decision(GPU).state == "suspect"
    cleared = policy.observe_gpu_reset(GPU, now=5000)
    assert (cleared.state, cleared.reason, cleared.changed) == ("ok", "gpu_reset_observed", True)
    assert policy.observe(xid(13, pid=400), now=5001).state == "ok"


def test_xid13_alone_never_faulty_even_many_times() -> None:
    policy = XidPolicy()
    states = {policy.observe(xid(13, pid=pid), now=pid * 10.0).state for pid in range(1, 200)}
    assert "faulty" not in states
    assert policy.decision(GPU).state == "suspect"


@pytest.mark.parametrize("code", [13, 31, 43, 45])
def test_application_codes_never_faulty(code: int) -> None:
    policy = XidPolicy(XidPolicyConfig(extra_faulty_codes=[code]))
    for pid in range(10):
        assert policy.observe(xid(code, pid=pid), now=float(pid)).state != "faulty"


def test_same_process_repeating_is_one_program_bug() -> None:
    policy = XidPolicy()
    for second in range(10):
        assert policy.observe(xid(31, pid=7), now=second * 60.0).state == "ok"


def test_repeats_outside_window_do_not_add_up() -> None:
    policy = XidPolicy(XidPolicyConfig(repeat_window_s=3600))
    assert policy.observe(xid(13, pid=1), now=0).state == "ok"
    assert policy.observe(xid(13, pid=2), now=4000).state == "ok"
    assert policy.observe(xid(13, pid=3), now=8000).state == "ok"


def test_one_event_printed_on_many_lines_counts_once() -> None:
    policy = XidPolicy()
    for _ in range(5):  # one Xid 13 per SM, same pid, same instant
        policy.observe(xid(13), now=10.0)
    assert policy.decision(GPU).state == "ok"


def test_79_is_faulty_at_once_and_time_does_not_clear() -> None:
    policy = XidPolicy()
    decision = policy.observe(xid(79, tail="GPU has fallen off the bus."), now=1)
    assert (decision.state, decision.reason, decision.action) == ("faulty", "xid_79", "reboot")
    assert policy.observe(xid(13, pid=5), now=10**9).state == "faulty"
    assert policy.decision(GPU).state == "faulty"
    assert [d.state for d in policy.observe_reboot(now=10**9 + 1)] == ["ok"]


def test_state_only_goes_up_and_action_escalates() -> None:
    policy = XidPolicy()
    policy.observe(xid(48), now=1)
    decision = policy.observe(xid(79), now=2)
    assert (decision.state, decision.reason, decision.action, decision.changed) == (
        "faulty",
        "xid_48",
        "reboot",
        False,
    )


def test_nonfatal_nvlink_and_secondary_xid45() -> None:
    policy = XidPolicy()
    assert policy.observe(xid(149, tail="NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x1)"), now=1).state == "ok"
    assert policy.observe(xid(149, tail="NETIR_LINK_EVT Fatal XC0 i0 Link 01 (0x1)"), now=2).state == "faulty"
    other = XidPolicy()
    for pid in range(5):
        other.observe(xid(45, pid=pid, tail="Ch 0000000c caused by previous Xid 149"), now=float(pid * 5))
    assert other.decision(GPU).state == "ok"


def test_per_gpu_isolation_and_config_round_trip() -> None:
    policy = XidPolicy()
    policy.observe(xid(79, gpu="0000:3b:00"), now=1)
    assert policy.decision("0000:86:00").state == "ok"
    config = msgspec.toml.decode(b"repeat_threshold = 2\nrepeat_window_s = 60.0\n", type=XidPolicyConfig)
    assert config.repeat_threshold == 2
    with pytest.raises(msgspec.ValidationError):
        msgspec.toml.decode(b"repeat_threshold = 1\n", type=XidPolicyConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.toml.decode(b"no_such_field = 1\n", type=XidPolicyConfig)
    schema = msgspec.json.schema(XidPolicyConfig)
    props = schema["$defs"]["XidPolicyConfig"]["properties"]
    assert all(prop.get("description") for prop in props.values())


def test_policy_memory_is_bounded() -> None:
    policy = XidPolicy(XidPolicyConfig(max_gpus=4, max_events_per_gpu=8))
    for index in range(100):
        policy.observe(xid(13, pid=index, gpu=f"0000:{index % 256:02x}:00"), now=float(index))
    assert len(policy.decisions()) <= 4
