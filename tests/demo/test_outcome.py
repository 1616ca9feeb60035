"""Matching injected faults to verdicts: what counts as caught, as a consequence, as wrong."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.demo.outcome import ApiShapeError, detection_bound_s, evaluate, verdict_from_api
from tests.demo.helpers import fault, verdict

XID = fault(0, 10.0, "host-002", 6, "xid", xid=79)
HANG = fault(1, 20.0, "host-003", 2, "hang")
THERMAL = fault(2, 5.0, "host-000", 5, "thermal_throttle", clock_mhz=1050)


def test_each_fault_takes_its_earliest_matching_verdict() -> None:
    verdicts = [
        verdict("b", "faulty", "host-002", 6, 14.0),
        verdict("a", "faulty", "host-002", 6, 11.5),
        verdict("c", "stuck", "host-003", 2, 27.0, job="ft", rank=26),
        verdict("d", "straggler", "host-000", 5, 31.0),
    ]
    out = evaluate([THERMAL, XID, HANG], verdicts, now_s=60.0)
    caught = {c.fault.kind: (c.verdict.id if c.verdict else None, c.delay_s) for c in out.catches}
    assert caught == {"xid": ("a", 1.5), "hang": ("c", 7.0), "thermal_throttle": ("d", 26.0)}
    assert out.all_caught
    assert out.wrong == ()
    # the second faulty verdict on the Xid GPU is a follow-on, not a wrong flag
    assert [(v.id, f.kind) for v, f in out.consequences] == [("b", "xid")]


def test_blaming_a_waiting_peer_is_wrong_and_the_hang_is_missed() -> None:
    out = evaluate([HANG], [verdict("p", "stuck", "host-003", 3, 25.0)], now_s=40.0)
    assert not out.all_caught
    assert out.missed == (HANG,)
    assert [v.id for v in out.wrong] == ["p"]


def test_wrong_kind_on_the_right_gpu_does_not_catch() -> None:
    # a hang reported as a hardware fault is not a correct detection (but it is about the faulty place)
    out = evaluate([HANG], [verdict("x", "faulty", "host-003", 2, 25.0)], now_s=40.0)
    assert out.missed == (HANG,)
    assert out.wrong == ()
    assert [v.id for v, _ in out.consequences] == ["x"]


def test_verdict_opened_before_the_fault_does_not_catch_it() -> None:
    out = evaluate([XID], [verdict("early", "faulty", "host-002", 6, 3.0)], now_s=30.0)
    assert out.missed == (XID,)
    assert [v.id for v in out.wrong] == ["early"]


def test_faults_not_yet_injected_are_not_judged() -> None:
    out = evaluate([XID, HANG], [], now_s=15.0)
    assert [c.fault.kind for c in out.catches] == ["xid"]
    assert out.missed == (XID,)


def test_host_fault_matches_a_host_level_verdict() -> None:
    down = fault(0, 10.0, "host-001", None, "host_down")
    out = evaluate([down], [verdict("s", "host_silent", "host-001", None, 21.0)], now_s=30.0)
    assert out.all_caught
    assert out.catches[0].delay_s == pytest.approx(11.0)


def test_one_verdict_catches_one_fault_only() -> None:
    twin_a = fault(0, 10.0, "host-002", None, "host_down")
    twin_b = fault(1, 11.0, "host-002", None, "host_down")
    out = evaluate([twin_a, twin_b], [verdict("s", "host_silent", "host-002", None, 21.0)], now_s=30.0)
    assert [c.verdict.id if c.verdict else None for c in out.catches] == ["s", None]


def test_verdict_from_api_reads_numbers_iso_times_and_defaults() -> None:
    v = verdict_from_api(
        {
            "id": 7,
            "kind": "stuck",
            "host": "host-003",
            "gpu": 2,
            "job": "ft",
            "rank": 26,
            "reason": "not_entered_collective",
            "action": "restart_app",
            "evidence": ["rank 26 never entered allreduce seq 412"],
            "opened_at": 1005.5,
            "state": "open",
        },
        started_at=1000.0,
        seen_at=1010.0,
    )
    assert (v.id, v.kind, v.gpu, v.rank, v.opened_s) == ("7", "stuck", 2, 26, 5.5)
    assert v.evidence == ("rank 26 never entered allreduce seq 412",)
    iso = verdict_from_api(
        {"id": "x", "kind": "faulty", "opened_at": "1970-01-01T00:16:50Z"}, started_at=1000.0, seen_at=0.0
    )
    assert iso.opened_s == pytest.approx(10.0)
    assert iso.action == "none"
    unknown_time = verdict_from_api({"id": "y", "kind": "faulty"}, started_at=1000.0, seen_at=1003.0)
    assert unknown_time.opened_s == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ([], "object"),
        ({"kind": "faulty"}, "id"),
        ({"id": 1, "kind": "faulty", "gpu": "3"}, "gpu"),
        ({"id": 1, "kind": "faulty", "rank": True}, "rank"),
        ({"id": 1, "kind": "faulty", "evidence": "text"}, "evidence"),
        ({"id": 1, "kind": "faulty", "opened_at": "yesterday"}, "ISO"),
    ],
)
def test_verdict_from_api_names_what_is_wrong(obj: object, field: str) -> None:
    with pytest.raises(ApiShapeError, match=field):
        verdict_from_api(obj, 0.0, 0.0)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=20,
)
VERDICTISH = st.fixed_dictionaries(
    {},
    optional=dict.fromkeys(
        ("id", "kind", "host", "gpu", "job", "rank", "reason", "action", "evidence", "opened_at", "state"),
        JSON,
    ),
)


@given(st.one_of(JSON, VERDICTISH))
def test_verdict_from_api_never_fails_other_than_with_a_shape_error(obj: object) -> None:
    try:
        v = verdict_from_api(obj, 0.0, 0.0)
    except ApiShapeError:
        return
    assert isinstance(v.id, str) and isinstance(v.kind, str)


def test_an_application_xid_is_handled_by_opening_nothing() -> None:
    app_xid = fault(0, 10.0, "host-001", 3, "xid", xid=13)
    assert not app_xid.expects_verdict and XID.expects_verdict
    quiet = evaluate([app_xid, XID], [verdict("a", "faulty", "host-002", 6, 11.0)], now_s=60.0)
    assert quiet.all_caught and quiet.missed == () and quiet.wrong == ()
    assert quiet.catches[0].ok and quiet.catches[0].verdict is None
    blamed = evaluate([app_xid], [verdict("b", "faulty", "host-001", 3, 11.0, reason="xid_13")], now_s=60.0)
    assert not blamed.all_caught
    assert [v.id for v in blamed.wrong] == ["b"]  # the application's error explains no GPU verdict
    assert blamed.catches[0].flagged_by is not None and blamed.catches[0].flagged_by.id == "b"
    assert blamed.missed == ()


def test_a_fault_without_verdict_is_pending_until_its_bound_passes() -> None:
    bound = detection_bound_s("hang")
    assert 10.0 <= bound <= 12.0
    early = evaluate([HANG], [], now_s=HANG.at_s + bound - 0.5)
    assert early.pending == (HANG,) and early.missed == () and early.all_caught
    late = evaluate([HANG], [], now_s=HANG.at_s + bound)
    assert late.pending == () and late.missed == (HANG,) and not late.all_caught
    assert detection_bound_s("xid") < 5 < detection_bound_s("thermal_throttle")
