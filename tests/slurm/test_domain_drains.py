"""An NVLink domain verdict (``fabric_domain_down``, the hardware detector's, naming every host of the domain)
against a real Slurm: with ``drain_domains`` each host is drained once, each through the breaker; without it,
nothing; a domain verdict held by too few hosts never exists (tests/aggregator/test_fabric_domain.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sentinel.aggregator.remediation import Remediator
from sentinel.aggregator.verdicts import Finding, VerdictBook
from sentinel.config.aggregator import BreakerConfig
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_remediation import hw_finding, open_on, outcomes, remediator

pytestmark = pytest.mark.timeout(120)


def domain_finding(*hosts: str, evidence: str = "3 hosts lost their fabric") -> Finding:
    return Finding(
        key=("fabric_domain", "c7a4f1d2-5b3e-4c69-9e0d-2f8b61a4d5e3", "7"),
        detector="hardware",
        kind="faulty",
        reason="fabric_domain_down",
        action="drain",
        evidence=(evidence,),
        evidence_t=time.time(),
        hosts=hosts,
    )


async def settle(r: Remediator) -> None:
    await asyncio.wait_for(r.idle.wait(), 30)


async def test_every_host_of_the_domain_is_drained_once(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    book = VerdictBook()
    r = remediator(
        idle_slurm,
        tmp_path,
        book,
        drain_domains=True,
        breaker=BreakerConfig(max_drains=10, max_fraction=1.0, max_unavailable_fraction=1.0),
    )
    await r.start()
    try:
        open_on(book, r, domain_finding("sn1", "sn2", "sn3"))
        await settle(r)
        # the domain's membership or evidence changes: nothing is drained twice
        open_on(book, r, domain_finding("sn1", "sn2", "sn3", evidence="more GPUs lost their fabric"))
        await settle(r)
    finally:
        await r.stop()
    assert sorted(outcomes(r)) == [("sn1", "done"), ("sn2", "done"), ("sn3", "done")]
    [verdict] = book.open.values()
    for node in ("sn1", "sn2", "sn3"):
        state, reason = idle_slurm.node_state(node)
        assert "DRAIN" in state and reason == f"sentinel: faulty fabric_domain_down {verdict.id}"
    assert idle_slurm.node_state("sn4")[0] == "IDLE"


async def test_the_breaker_refuses_the_hosts_past_its_limit(idle_slurm: SlurmCluster, tmp_path: Path) -> None:
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book, drain_domains=True)  # max_drains=2
    await r.start()
    try:
        open_on(book, r, domain_finding("sn1", "sn2", "sn3"))
        await settle(r)
    finally:
        await r.stop()
    done = [node for node, outcome in outcomes(r) if outcome == "done"]
    refused = [rec for rec in r.audit.read() if rec["outcome"] == "refused"]
    assert len(done) == 2 and [rec["reason"] for rec in refused] == ["breaker_sentinel_drains"]
    [verdict] = book.open.values()
    assert f"{verdict.id}@{refused[0]['node']}" in r.retry  # retried while the domain verdict stays open
    assert idle_slurm.node_state(refused[0]["node"])[0] == "IDLE"


async def test_off_by_default_a_domain_verdict_drains_nothing(
    idle_slurm: SlurmCluster, tmp_path: Path
) -> None:
    book = VerdictBook()
    r = remediator(idle_slurm, tmp_path, book)
    await r.start()
    try:
        open_on(book, r, domain_finding("sn1", "sn2", "sn3"), hw_finding("sn4"))
        await settle(r)
    finally:
        await r.stop()
    assert outcomes(r) == [("sn4", "done")]  # the host's own verdict still drains it
    assert all(idle_slurm.node_state(n)[0] == "IDLE" for n in ("sn1", "sn2", "sn3"))
