"""A fatal Xid back on the same GPU after a reset, within the recurrence window: rma with the history (pure,
virtual clock). What is not a recurrence stays as it was: no reset between, outside the window, an
application code, another code."""

from __future__ import annotations

from sentinel.components.xid.parse import XidRecord, parse_xid
from sentinel.components.xid.rule import XidMemory, XidPolicy, XidPolicyConfig, observe_xid, reset_memory

GPU = "0000:3b:00"


def xid(
    code: int, pid: int = 7, tail: str = "An uncorrectable double bit error (DBE) has been detected"
) -> XidRecord:
    record = parse_xid(f"NVRM: Xid (PCI:{GPU}): {code}, pid={pid}, name=python, {tail}")
    assert record is not None
    return record


def test_a_fatal_xid_back_after_a_reset_goes_to_rma_with_its_history() -> None:
    policy = XidPolicy()
    first = policy.observe(xid(48), 100.0)
    assert (first.state, first.reason, first.action) == ("faulty", "xid_48", "reset_gpu")
    assert policy.observe_gpu_reset(GPU, 130.0).state == "ok"
    again = policy.observe(xid(48, pid=8), 400.0)
    assert (again.state, again.reason, again.action, again.changed) == (
        "faulty",
        "xid_48_recurring",
        "rma",
        True,
    )
    history = again.evidence[-1]
    assert "came back after 1 GPU reset" in history
    assert "Xid 48 at t+100.0s" in history and "reset at t+130.0s" in history
    assert "NVIDIA: investigate, RMA" in history


def test_an_rma_for_a_recurrence_survives_the_next_reset() -> None:
    policy = XidPolicy()
    policy.observe(xid(48), 100.0)
    policy.observe_gpu_reset(GPU, 130.0)
    policy.observe(xid(48), 400.0)
    after = policy.observe_gpu_reset(GPU, 430.0)
    assert (after.state, after.reason, after.action) == ("faulty", "xid_48_recurring", "rma")


def test_one_reset_reported_twice_is_one_reset() -> None:
    policy = XidPolicy()
    policy.observe(xid(79, tail="GPU has fallen off the bus."), 10.0)
    policy.observe_gpu_reset(GPU, 20.0)
    policy.observe_gpu_reset(GPU, 20.4)  # NVML's answer again and the re-initialisation: the same reset
    again = policy.observe(xid(79, tail="GPU has fallen off the bus."), 50.0)
    assert again.reason == "xid_79_recurring" and "after 1 GPU reset" in again.evidence[-1]


def test_no_recurrence_without_a_reset_outside_the_window_or_for_another_code() -> None:
    no_reset = XidPolicy()
    no_reset.observe(xid(48), 100.0)
    assert (
        no_reset.observe(xid(48, pid=9), 200.0).reason == "xid_48"
    )  # still the first latch: no reset between

    window = XidPolicyConfig(recurrence_window_s=3600.0)
    late = XidPolicy(window)
    late.observe(xid(48), 100.0)
    late.observe_gpu_reset(GPU, 200.0)
    assert late.observe(xid(48), 100.0 + 3601.0).reason == "xid_48"

    other = XidPolicy()
    other.observe(xid(48), 100.0)
    other.observe_gpu_reset(GPU, 200.0)
    assert other.observe(xid(79, tail="GPU has fallen off the bus."), 300.0).reason == "xid_79"

    off = XidPolicy(XidPolicyConfig(recurrence_window_s=0.0))
    off.observe(xid(48), 100.0)
    off.observe_gpu_reset(GPU, 100.0)
    assert off.observe(xid(48), 100.0).reason == "xid_48"


def test_application_xids_after_resets_never_escalate() -> None:
    policy = XidPolicy()
    for k in range(6):
        decision = policy.observe(xid(13, pid=100 + k, tail="Graphics SM Warp Exception"), 100.0 * k)
        policy.observe_gpu_reset(GPU, 100.0 * k + 50.0)
        assert decision.state == "ok" and decision.action != "rma"


def test_the_history_is_bounded() -> None:
    """The xid signal's memory, as the aggregator keeps it per GPU: observed, reset, observed, ..."""
    config = XidPolicyConfig(recurrence_window_s=1e9)
    gpu = XidMemory()
    for k in range(200):
        observe_xid(gpu, xid(48 if k % 2 else 79, tail="x"), 100.0 * k, config)
        gpu = reset_memory(gpu, 100.0 * k + 50.0)
        assert len(gpu.history) <= 16 and len(gpu.resets) <= 16 and len(gpu.evidence) <= 16
    assert gpu.state == "faulty" and gpu.action == "rma"
