"""A real Slurm for the tests of this folder (munged, slurmctld, slurmd per node on 127.0.0.1; see cluster.py)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.cluster import SlurmCluster, available
from tests.support import need

NODES = ("sn1", "sn2", "sn3", "sn4")


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    need(available(), "slurm-wlm and munge not installed (munged, slurmctld, slurmd, scontrol, srun)")
    # short root: munge and slurmd socket paths must stay under the 108-byte unix socket limit
    with tempfile.TemporaryDirectory(prefix="sslurm-", dir="/tmp") as root:
        cluster = SlurmCluster(Path(root), NODES)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def idle_slurm(slurm: SlurmCluster) -> SlurmCluster:
    """The module's cluster with every node back in service (tests drain nodes)."""
    for node in slurm.nodes:
        with contextlib.suppress(RuntimeError):
            slurm.run("scontrol", "update", f"nodename={node}", "state=resume")
    slurm.wait_idle(15.0)
    return slurm
