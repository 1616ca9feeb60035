"""The link-pace judgement, table-driven: which link slows a job, and when nothing is named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sentinel.components.linkpace.rule import JobPace, LinkLoad, LinkPaceConfig, judge, standouts

CFG = LinkPaceConfig()
GBPS = 2.5e9  # bytes per second of a healthy rail under load


def rails(n: int = 8, **changed: LinkLoad) -> list[LinkLoad]:
    out = [
        LinkLoad(host=f"host-{i // 4:03d}", link=f"mlx5_{i % 4}/1", bytes_per_s=GBPS, waits={"port_xmit_wait": 2e5},
                 gpus=(i % 4,), ranks=(i,))
        for i in range(n)
    ]  # fmt: skip
    for key, link in changed.items():
        out[int(key.removeprefix("r"))] = link
    return out


def slow_rail(i: int, *, factor: float = 1.0, wait: float = 2e5, **waits: float) -> LinkLoad:
    return LinkLoad(
        host=f"host-{i // 4:03d}",
        link=f"mlx5_{i % 4}/1",
        bytes_per_s=GBPS * factor,
        waits={"port_xmit_wait": wait, **waits},
        gpus=(i % 4,),
        ranks=(i,),
    )


SLOWER_IN_COMM = JobPace(job="J", step_s=1.31, baseline_step_s=1.0, compute_s=0.6, baseline_compute_s=0.6)
SLOWER_IN_COMPUTE = JobPace(job="J", step_s=1.31, baseline_step_s=1.0, compute_s=0.9, baseline_compute_s=0.6)
STEADY = JobPace(job="J", step_s=1.03, baseline_step_s=1.0, compute_s=0.6, baseline_compute_s=0.6)
NO_COMPUTE_SPLIT = JobPace(job="J", step_s=1.4, baseline_step_s=1.0)

CASES = [
    # (name, pace, links, the links named)
    ("one rail waits far above its peers", SLOWER_IN_COMM, rails(r5=slow_rail(5, wait=5e6)), ["host-001 mlx5_1/1"]),
    ("one rail carries less than its peers", SLOWER_IN_COMM, rails(r2=slow_rail(2, factor=0.4)), ["host-000 mlx5_2/1"]),
    ("RoCE congestion on one port", SLOWER_IN_COMM, rails(r7=slow_rail(7, np_cnp_sent=4000.0)), ["host-001 mlx5_3/1"]),
    ("uniformly slower, no port stands out", SLOWER_IN_COMM, [slow_rail(i, factor=0.7, wait=4e5) for i in range(8)], []),
    ("a port stands out but the job is not slower", STEADY, rails(r5=slow_rail(5, wait=5e6)), []),
    ("slower because it computes more", SLOWER_IN_COMPUTE, rails(r5=slow_rail(5, wait=5e6)), []),
    ("no compute split: pace and a standing-out port suffice", NO_COMPUTE_SPLIT, rails(r5=slow_rail(5, wait=5e6)),
     ["host-001 mlx5_1/1"]),
    ("idle ports between jobs", SLOWER_IN_COMM, [slow_rail(i, factor=0.0001, wait=0.0) for i in range(8)], []),
    ("half the ports stand out: the job's pattern, not a port", SLOWER_IN_COMM,
     rails(r0=slow_rail(0, wait=5e6), r1=slow_rail(1, wait=5e6), r2=slow_rail(2, wait=5e6), r3=slow_rail(3, wait=5e6)),
     []),
    ("a shaped interface of two hosts", SLOWER_IN_COMM,
     [LinkLoad(host="a", link="netdev:veth0", bytes_per_s=5e7, waits={"qdisc_overlimits": 3000.0}),
      LinkLoad(host="b", link="netdev:veth0", bytes_per_s=5e7, waits={"qdisc_overlimits": 0.0})],
     ["a netdev:veth0"]),
    ("a single link has no peers", SLOWER_IN_COMM, rails(1), []),
]  # fmt: skip


@pytest.mark.parametrize(("name", "pace", "links", "named"), CASES, ids=[c[0] for c in CASES])
def test_judgement(name: str, pace: JobPace, links: list[LinkLoad], named: list[str]) -> None:
    found = judge(pace, links, CFG)
    assert [f"{f.host} {f.link}" for f in found] == named, name


def test_a_verdict_names_the_cost_the_ranks_and_the_evidence() -> None:
    (found,) = judge(SLOWER_IN_COMM, rails(r5=slow_rail(5, wait=5e6)), CFG)
    assert found.evidence[0] == "port mlx5_1/1 on host-001 slows job J by 31% (serves GPU 1, rank(s) 5)"
    assert found.evidence[1].startswith("job J steps in 1310 ms against its baseline 1000 ms (+31%)")
    assert "100% of the extra time is communication" in found.evidence[1]
    assert found.evidence[2] == "port mlx5_1/1: port_xmit_wait 5.0M/s against its peers' median 200.0k/s"
    assert found.slowdown == pytest.approx(0.31) and (found.ranks, found.gpus) == ((5,), (1,))


def test_switched_off_names_nothing() -> None:
    off = LinkPaceConfig(enabled=False)
    assert judge(SLOWER_IN_COMM, rails(r5=slow_rail(5, wait=5e6)), off) == []


@given(
    liars=st.lists(st.floats(0, 1e12, allow_nan=False), min_size=0, max_size=3),
    culprit=st.integers(0, 9),
)
def test_a_minority_of_lying_ports_cannot_move_the_median(liars: list[float], culprit: int) -> None:
    """Ten rails, one truly waiting; up to three others report any wait at all. The waiting rail is still
    measured against the honest majority's median, and no honest rail is named."""
    links = [slow_rail(i) for i in range(10)]
    links[culprit] = slow_rail(culprit, wait=5e7)
    others = [i for i in range(10) if i != culprit]
    for i, value in zip(others, liars, strict=False):
        links[i] = slow_rail(i, wait=value)
    found = {s.link.link + s.link.host for s in standouts(links, CFG)}
    honest = {links[i].link + links[i].host for i in others[len(liars) :]}
    assert not found & honest
    assert links[culprit].link + links[culprit].host in found


def test_a_large_job_measures_each_rail_against_the_others_median_and_the_fleets_mad() -> None:
    """200 rails (the sorted, O(1)-per-rail path): the one waiting and the one carrying less are named,
    ten others reporting a little more wait than the rest are not."""
    links = rails(200)
    for i in range(10, 20):
        links[i] = slow_rail(i, wait=2.4e5)
    links[150] = slow_rail(150, wait=5e6)
    links[77] = slow_rail(77, factor=0.5)
    found = [(s.link.host, s.link.link) for s in standouts(links, CFG)]
    assert found == [(links[77].host, links[77].link), (links[150].host, links[150].link)]
