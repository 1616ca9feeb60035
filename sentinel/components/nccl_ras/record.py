"""The typed record of one NCCL RAS status answer: the same struct on the wire and in the stuck detector.

NCCL's RAS service (NCCL >= 2.24) answers ``STATUS`` with a job summary, a table of communicator groups and,
when something is wrong, ``Errors`` / ``Warnings`` sections naming missing or dead processes, communicators
with missing ranks, ranks behind in collective counts, and ranks reporting NCCL errors. This is that answer
as data; the agent attaches the job it queried for.
"""

from __future__ import annotations

import msgspec

MAX_ITEMS = 256  # processes, ranks, communicators, groups kept per answer
MAX_LINES = 32
#: every integer a RAS answer carries lies within this (a signed 64-bit msgpack integer on the wire)
WIRE_INT_MAX = (1 << 63) - 1


class RasRankRef(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One rank as RAS names it: ``Rank 21 -- GPU 5 managed by process 3487984 on node 172.16.64.213``."""

    rank: int
    gpu: int | None = None
    pid: int | None = None
    node: str = ""
    status: str = ""  # "has status FINALIZE", the error reported, "up to operation 6649"
    ops: int | None = None  # the collective count this rank has launched up to, when RAS says


class RasProcess(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``Process 3487984 on node 172.16.64.213 managing GPU 5``."""

    pid: int
    node: str
    gpus: list[int] = []


class RasOpGroup(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``26 ranks have launched up to operation 6650`` (``ops`` None: have not launched any)."""

    count: int
    ops: int | None = None
    status: str = ""  # for "ranks have status X" groups
    ranks: list[RasRankRef] = []  # listed only when RAS considers the group an outlier


class RasCommIssue(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One ``#<group>-<index> (<hash>) <KIND>`` block: INCOMPLETE, MISMATCH or ERROR."""

    comm: str  # "#0-0"
    hash: str
    kind: str  # INCOMPLETE | MISMATCH | ERROR
    missing: int = 0  # "Missing communicator data from N ranks"
    missing_ranks: list[RasRankRef] = []
    about: str = ""  # "AllGather operation counts", "status", "collective operation counts"
    groups: list[RasOpGroup] = []
    errors: list[RasRankRef] = []  # ranks reporting an initialization / asynchronous error
    lines: list[str] = []  # the block as printed (bounded), for evidence


class RasGroupRow(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A row of the communicators table."""

    group: int
    comms: int
    nodes: int
    ranks_per_node: str
    ranks_per_comm: int
    ranks_in_group: int
    status: str  # RUNNING, INIT, FINALIZE, ABORT, NOCOMM
    errors: str  # OK, MISMATCH, INCOMPLETE, ERROR or a comma-joined mix


class RasStatus(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One parsed RAS answer."""

    t: float = 0.0
    job: str | None = None
    nccl_version: str = ""
    nodes: int | None = None
    processes: int | None = None
    gpus: int | None = None
    collection_s: float | None = None
    groups: list[RasGroupRow] = []
    missing_processes: list[RasProcess] = []  # INCOMPLETE: no data from these job processes
    missing_process_count: int = 0
    dead_processes: list[RasProcess] = []  # DEAD: unreachable via the RAS network for 60 s
    dead_process_count: int = 0
    comms: list[RasCommIssue] = []
    timeouts: int = 0  # communication timeouts while gathering the data
    unparsed: int = 0  # non-blank lines the parser did not recognise (format drift shows up here)

    @property
    def healthy(self) -> bool:
        return (
            not self.missing_process_count
            and not self.dead_process_count
            and not self.comms
            and all(row.errors == "OK" for row in self.groups)
        )
