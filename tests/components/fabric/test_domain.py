"""The NVLink domain rule on its own: which GPUs form a domain, and when their losses are the domain's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sentinel.components.fabric.domain import (
    NO_CLUSTER,
    DomainSize,
    FabricDomainConfig,
    Loss,
    domain_down,
    domain_of,
    domain_sizes,
)
from sentinel.components.fabric.record import FabricInfo

CLUSTER = "c7a4f1d2-5b3e-4c69-9e0d-2f8b61a4d5e3"


def test_a_gpu_without_a_fabric_cluster_is_in_no_domain() -> None:
    assert domain_of(None) is None
    assert domain_of(FabricInfo(state="completed", clique_id=3)) is None
    assert domain_of(FabricInfo(state="completed", clique_id=3, cluster_uuid=NO_CLUSTER)) is None
    assert domain_of(FabricInfo(state="in_progress", clique_id=3, cluster_uuid=CLUSTER)) == (CLUSTER, 3)


def test_domain_sizes_count_gpus_and_hosts_per_domain() -> None:
    info = FabricInfo(state="completed", clique_id=1, cluster_uuid=CLUSTER)
    other = FabricInfo(state="completed", clique_id=2, cluster_uuid=CLUSTER)
    members = [("a", 0, info), ("a", 1, info), ("b", 0, info), ("c", 0, other), ("d", 0, None)]
    sizes = domain_sizes(members)
    assert sizes == [
        DomainSize(key=(CLUSTER, 1), gpus=3, hosts=("a", "b")),
        DomainSize(key=(CLUSTER, 2), gpus=1, hosts=("c",)),
    ]
    cfg = FabricDomainConfig(expected_gpus=4, expected_hosts=2)
    assert sizes[0].shortfall(cfg) == ("3 of the 4 GPUs expected report in this domain",)
    assert sizes[1].shortfall(cfg) == (
        "1 of the 4 GPUs expected report in this domain",
        "1 of the 2 hosts expected report in this domain",
    )
    assert sizes[0].shortfall(FabricDomainConfig()) == ()


def _brute(losses: list[Loss], cfg: FabricDomainConfig) -> bool:
    """Some window of ``window_s`` holds losses of ``min_hosts`` distinct hosts (every start tried)."""
    return any(
        len({x.host for x in losses if first.t <= x.t <= first.t + cfg.window_s}) >= cfg.min_hosts
        for first in losses
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcdef"), st.integers(0, 7), st.floats(0, 1000, allow_nan=False)),
        max_size=40,
    ),
    st.integers(2, 5),
    st.floats(1, 300, allow_nan=False),
)
def test_the_rule_agrees_with_trying_every_window(
    raw: list[tuple[str, int, float]], min_hosts: int, window_s: float
) -> None:
    cfg = FabricDomainConfig(min_hosts=min_hosts, window_s=window_s)
    losses = [Loss(host=h, gpu=g, t=t, reason="fabric_not_registered") for h, g, t in raw]
    down = domain_down((CLUSTER, 1), losses, {"z"}, cfg)
    assert (down is not None) == _brute(losses, cfg)
    if down is not None:
        assert len({x.host for x in down.losses}) >= min_hosts  # never one host's word alone
        assert set(down.hosts) >= {x.host for x in down.losses} | {"z"}
        assert down.began == min(x.t for x in down.losses)
