def test_evidence_times_are_readable() -> None:
    from sentinel.components.xid.rule import evidence_time

    assert evidence_time(1796124677.4) == "2026-12-01 11:31:17 UTC"  # was "t=1.79612e+09"
    assert evidence_time(12.25) == "t+12.2s"
