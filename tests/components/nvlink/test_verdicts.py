"""The nvlink signal through the engine: an error rate opens degraded, naming the links that rose."""

from __future__ import annotations

from sentinel.wire import (
    NvLink,
)
from tests.aggregator.helpers import Fleet, sample


def test_nvlink_error_rate_opens_degraded_and_a_stray_error_does_not() -> None:
    f = Fleet(hosts=1)

    def links(errors: int) -> list[NvLink]:
        return [NvLink(link=0, crc_errors=errors), NvLink(link=1)]

    for t in range(0, 20):
        errors = 1 if t >= 5 else 0  # one stray CRC error
        f.send(
            "h0",
            float(t),
            samples=[sample(i, float(t), nvlink=links(errors if i == 4 else 0)) for i in range(8)],
        )
        f.engine.tick(float(t))
    assert f.open() == []
    for t in range(20, 23):
        errors = 1 + 50 * (t - 19)
        f.send(
            "h0",
            float(t),
            samples=[sample(i, float(t), nvlink=links(errors if i == 4 else 0)) for i in range(8)],
        )
        f.engine.tick(float(t))
    assert f.open() == [("degraded", "h0", 4, "nvlink_errors")]
    assert f.engine.book.open[("hw", "h0", "4")].opened_at == 20.0
    for t in range(23, 90):  # the counter stops rising: the rate decays below the threshold
        f.send(
            "h0",
            float(t),
            samples=[sample(i, float(t), nvlink=links(101 if i == 4 else 0)) for i in range(8)],
        )
        f.engine.tick(float(t))
    assert f.open() == []


def test_nvlink_verdict_names_the_links_and_counters_that_rose() -> None:
    f = Fleet(hosts=1)
    for t in range(0, 8):
        replays = 0 if t < 3 else 200 * (t - 2)
        links = [NvLink(link=0, crc_errors=0), NvLink(link=7, replay_errors=replays, effective_errors=t)]
        f.send(
            "h0", float(t), samples=[sample(i, float(t), nvlink=links if i == 2 else None) for i in range(8)]
        )
        f.engine.tick(float(t))
    assert f.open() == [("degraded", "h0", 2, "nvlink_errors")]
    evidence = " ".join(f.engine.book.open[("hw", "h0", "2")].evidence)
    assert "link 7 replay +200" in evidence and "link 7 effective +1" in evidence
    assert "link 0" not in evidence
