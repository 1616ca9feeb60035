"""The remediation lease file (sentinel/aggregator/remediation/lease.py): taking, renewing, expiry with the
command grace, release — and whatever the shared file holds (another version, a torn write, garbage, deep
JSON, huge numbers) never breaks the reader: it is no lease, never an exception."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sentinel.aggregator.remediation.lease import MAX_LEASE_BYTES, LeaseFile, LeaseState, _parse


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
