"""The remediation lease file (sentinel/aggregator/remediation/lease.py): taking, renewing, expiry with the
command grace, release — and whatever the shared file holds (another version, a torn write, garbage, deep
JSON, huge numbers) never breaks the reader: it is no lease, never an exception."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from sentinel.aggregator.remediation.lease import (
    MAX_LEASE_BYTES,
    LeaseFile,
    LeaseFileRefused,
    LeaseState,
    _parse,
)
from sentinel.aggregator.remediation.remediator import Remediator
from sentinel.aggregator.verdicts import VerdictBook
from sentinel.config.aggregator import RemediationConfig


def test_one_holder_at_a_time_and_the_grace_after_expiry(tmp_path: Path) -> None:
    path = tmp_path / "lease.json"
    a, b = LeaseFile(path, "a", 15.0, 10.0), LeaseFile(path, "b", 15.0, 10.0)
    assert a.hold(100.0) == LeaseState("a", 115.0)
    assert b.hold(101.0) == LeaseState("a", 115.0)  # held: B is told who holds it until when
    assert a.hold(110.0) == LeaseState("a", 125.0)  # renewed
    assert b.hold(134.9) == LeaseState("a", 125.0)  # run out, but not by the grace yet
    assert b.hold(135.1) == LeaseState("b", 150.1)
    assert a.hold(136.0) == LeaseState("b", 150.1)  # the old holder is a follower now
    b.release()
    assert a.hold(137.0) == LeaseState("a", 152.0)  # handed back: taken at once
    a.release()
    assert b.read() == LeaseState("", 0.0)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=MAX_LEASE_BYTES),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.builds(
            lambda holder, until: json.dumps({"holder": holder, "until": until}).encode(),
            json_values,
            st.integers() | st.floats() | st.booleans() | st.text(max_size=5),
        ),
        st.integers(min_value=1, max_value=MAX_LEASE_BYTES // 2).map(lambda n: b"[" * n),
        st.just(b'{"holder": "x", "until": 1' + b"0" * 400 + b"}"),
    )
)
def test_any_file_content_is_a_lease_or_none(data: bytes) -> None:
    state = _parse(data)
    assert state is None or (isinstance(state.holder, str) and state.until == state.until)


def test_a_garbled_file_is_free_to_take(tmp_path: Path) -> None:
    path = tmp_path / "lease.json"
    path.write_bytes(b'{"holder": "a", "unt')  # a torn write of another version
    assert LeaseFile(path, "b", 15.0, 10.0).hold(5.0) == LeaseState("b", 20.0)


def test_an_until_beyond_a_term_is_invalid_and_taken_over_once_it_stays_unchanged(tmp_path: Path) -> None:
    """``{"until": 1e15}`` (or a holder whose clock ran a year ahead) does not stop every aggregator for
    ever: the record is marked invalid, and once it stayed unchanged for a term plus the grace it is taken."""
    path = tmp_path / "lease.json"
    path.write_text(json.dumps({"holder": "ahead", "until": 1e15}))
    b = LeaseFile(path, "b", 15.0, 10.0)
    first = b.hold(100.0)
    assert (first.holder, first.until) == ("ahead", 1e15) and "ahead" in first.invalid
    assert b.hold(124.9).holder == "ahead"  # not before a whole term + grace since it was first seen
    assert b.hold(125.1) == LeaseState("b", 140.1)


def test_an_invalid_lease_that_keeps_being_renewed_is_kept_by_its_holder(tmp_path: Path) -> None:
    """A live holder whose clock runs a year ahead renews (changes) its record: exactly one acts — it."""
    path = tmp_path / "lease.json"
    year = 365 * 86400.0
    ahead, b = LeaseFile(path, "ahead", 15.0, 10.0), LeaseFile(path, "b", 15.0, 10.0)
    for t in range(100, 200, 5):
        assert ahead.hold(t + year).holder == "ahead"
        held = b.hold(float(t))
        assert held.holder == "ahead" and held.invalid
    ahead.release()
    assert b.hold(200.0) == LeaseState("b", 215.0)


def test_a_valid_lease_ahead_by_less_than_the_skew_allowance_is_believed(tmp_path: Path) -> None:
    path = tmp_path / "lease.json"
    path.write_text(json.dumps({"holder": "a", "until": 100.0 + 15.0 + 9.0}))
    held = LeaseFile(path, "b", 15.0, 10.0).hold(100.0)
    assert held == LeaseState("a", 124.0) and not held.invalid


def test_a_symlinked_lease_path_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("do not truncate me")
    link = tmp_path / "lease.json"
    link.symlink_to(target)
    lease = LeaseFile(link, "a", 15.0, 10.0)
    with pytest.raises(LeaseFileRefused, match="symbolic link"):
        lease.hold(1.0)
    with pytest.raises(LeaseFileRefused, match="symbolic link"):
        lease.read()
    lease.release()  # nothing raised, nothing written
    assert target.read_text() == "do not truncate me"


def test_a_lease_path_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "lease.json"
    os.mkfifo(fifo)
    with pytest.raises(LeaseFileRefused, match="not a regular file"):
        LeaseFile(fifo, "a", 15.0, 10.0).hold(1.0)


async def test_the_remediator_logs_counts_and_gauges_an_invalid_lease_then_takes_it_over(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lease.json"
    path.write_text(json.dumps({"holder": "ahead", "until": 1e15}))
    now = [1000.0]
    config = RemediationConfig(enabled=True, lease_file=str(path), lease_s=15.0, command_timeout_s=10.0)
    registry = CollectorRegistry()
    r = Remediator(config, VerdictBook(), state_dir=tmp_path, registry=registry, clock=lambda: now[0], env={})

    def sample(name: str) -> float | None:
        return registry.get_sample_value(name, {"cluster": "default"})

    with capture_logs() as logs:
        assert not await r.renew()
        assert not await r.renew()
    assert sample("sentinel_remediation_lease_invalid") == 1
    assert sample("sentinel_remediation_lease_invalid_reads_total") == 2
    assert sample("sentinel_remediation_leader") == 0
    invalid = [e for e in logs if e["event"] == "remediation_lease_invalid"]
    assert len(invalid) == 1 and invalid[0]["holder"] == "ahead" and invalid[0]["log_level"] == "error"
    now[0] += 15.0 + 10.0 + 1.0
    assert await r.renew()
    assert sample("sentinel_remediation_lease_invalid") == 0
    assert sample("sentinel_remediation_leader") == 1
    assert r.lease is not None and json.loads(path.read_text())["holder"] == r.lease.holder


async def test_the_remediator_refuses_a_symlinked_lease_in_one_line(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep")
    (tmp_path / "lease.json").symlink_to(target)
    config = RemediationConfig(enabled=True, lease_file=str(tmp_path / "lease.json"))
    r = Remediator(config, VerdictBook(), state_dir=tmp_path, registry=CollectorRegistry(), env={})
    with capture_logs() as logs:
        assert not await r.renew()
    (failed,) = [e for e in logs if e["event"] == "remediation_lease_failed"]
    assert "symbolic link" in failed["error"] and target.read_text() == "keep"
