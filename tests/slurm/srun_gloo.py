"""One Slurm task of the end-to-end gloo job: the node's launcher, as ``srun`` starts one per node.

Run as ``srun ... python -m tests.slurm.srun_gloo SPEC.json``. The spec lists the ranks of every node
(``nodes``: Slurm node name → ranks with their environment); this task takes those of the node it runs on
(``SLURMD_NODENAME``), names the job by Slurm's job id, and hands them to the gloo launcher of
tests/integration/gloo_train.py (which forks them, each with its probe). A spec with ``ranks_per_node``
instead (a batch job Slurm may place anywhere, and place again after a requeue) gives the task of the
allocation's n-th node (``SLURM_NODEID``) ranks n*k .. n*k+k-1, probing the socket named after its node.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.integration import gloo_train


def main(spec_path: str) -> int:
    job = json.loads(Path(spec_path).read_text())
    node = os.environ["SLURMD_NODENAME"]
    if "ranks_per_node" in job:
        k = int(job["ranks_per_node"])
        first = int(os.environ["SLURM_NODEID"]) * k
        env = {"SENTINEL_PROBE_SOCKET": str(Path(job["sockets"]) / f"{node}.sock")}
        ranks = [{"rank": first + i, "local_rank": i, "env": env} for i in range(k)]
    else:
        ranks = job["nodes"][node]
    mine = dict(job, job_id=os.environ["SLURM_JOB_ID"], ranks=ranks)
    mine.pop("nodes", None)
    own = Path(job["control"]) / f"spec-{node}.json"
    own.write_text(json.dumps(mine))
    return gloo_train.main(str(own))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
