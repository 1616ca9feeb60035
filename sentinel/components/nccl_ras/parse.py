"""Parse the text NCCL's RAS service answers to ``STATUS`` / ``VERBOSE STATUS`` into a :class:`RasStatus`.

The format is NCCL's ``src/ras/client_support.cc`` (2.24 … 2.29); NVIDIA notes that it "varies from release
to release", so the parser reads it by section and by line shape, never by position: ``Job summary``, the
``Communicators`` table, then ``Errors`` / ``Warnings`` made of blocks separated by blank lines — ``INCOMPLETE``
(job processes that sent no data), ``DEAD`` (processes unreachable for 60 s), ``TIMEOUT``, and
``#<group>-<index> (<hash>) INCOMPLETE|MISMATCH|ERROR`` per communicator. A line it does not recognise is
counted in ``unparsed`` and skipped. Input is bounded (size, lines, items), every integer to the wire's range
(a line with a larger one is unparsed), the work is linear in the lines (a rank line finds its group through
an index), and nothing here raises on text.
"""

from __future__ import annotations

import re

from sentinel.components.nccl_ras.record import (
    MAX_ITEMS,
    MAX_LINES,
    RasCommIssue,
    RasGroupRow,
    RasOpGroup,
    RasProcess,
    RasRankRef,
    RasStatus,
)
from sentinel.components.nccl_ras.record import WIRE_INT_MAX as _INT_MAX

MAX_TEXT_BYTES = 1024 * 1024
MAX_INPUT_LINES = 20000

_VERSION = re.compile(r"^NCCL version (\S{1,64})")
_ROW = re.compile(
    r"^\s*(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s+(\d{1,9}(?:-\d{1,9})?)\s+(\d{1,9})\s+(\d{1,9})\s+"
    r"([A-Z]{1,16})\s+([A-Z,]{1,64})\s*$"
)
_COMMS_TIME = re.compile(r"^Communicators\.\.\.\s*\((\d{1,6}(?:\.\d{1,6})?)s\)")
_OBTAINED = re.compile(r"obtained a result in (\d{1,6}(?:\.\d{1,6})?)s")
_COMM_HEAD = re.compile(r"^#(\d{1,9})-(\d{1,9}) \(([0-9a-fA-F]{1,32})\) ([A-Z]{1,16})\s*$")
_PROCESS = re.compile(
    r"^Process (\d{1,10}) on node (\S{1,256}) managing GPUs? ([0-9][0-9 ,()\-NVML]{0,200})$"
)
_RANK = re.compile(
    r"^Rank (\d{1,10})(?P<what>(?: has status (?P<status>\w{1,16})| has launched up to operation (?P<ops>\d{1,20})"
    r"| has not launched any operations| reported (?P<error>.{1,120}?)))? -- "
    r"(?:GPU (?P<gpu>\d{1,4})(?: \(NVML \d{1,4}\))? managed by process (?P<pid>\d{1,10}) on node (?P<node>\S{1,256})"
    r"|\[process information not found\])\s*$"
)
_MISSING_RANKS_OLD = re.compile(r"^The missing ranks?: ([\d, ]{1,4000})$")
_MISSING_DATA = re.compile(r"^Missing communicator data from (\d{1,10}) (rank|job process)")
_DEAD = re.compile(r"^(\d{1,10}) job process(?:es are| is) considered dead")
_TIMEOUTS = re.compile(r"^Encountered (\d{1,10}) communication timeouts?")
_DIFFERENT = re.compile(r"^Communicator ranks have different (.{1,80}?)\s*$")
_GROUP_OPS = re.compile(r"^(\d{1,10}) ranks have launched up to operation (\d{1,20})")
_GROUP_NONE = re.compile(r"^(\d{1,10}) ranks have not launched any operations")
_GROUP_STATUS = re.compile(r"^(\d{1,10}) ranks have status (\w{1,16})")
_ERRORS_ON = re.compile(r"^(Initialization|Asynchronous) errors? on (\d{1,10}) ranks?")
_REPORTED = re.compile(r"^(\d{1,10}) ranks reported (.{1,120})$")
_TOTALS = re.compile(r"^\s*(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s*$")
_TOTALS3 = re.compile(r"^\s*(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s*$")


def _int(text: str) -> int | None:
    """A decimal the parser matched, or None when it lies beyond what the wire carries."""
    value = int(text)
    return value if value <= _INT_MAX else None


def _gpus(text: str) -> list[int]:
    """``5``, ``0,1``, ``0-3`` or ``5 (NVML 3)`` → GPU indices (CUDA numbering), bounded."""
    text = re.sub(r"\(NVML [^)]*\)", "", text)
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            lo, _, hi = part.partition("-")
            if (
                lo.isdigit()
                and hi.isdigit()
                and len(lo) <= 4
                and len(hi) <= 4
                and int(lo) <= int(hi)
                and int(hi) - int(lo) < 64
            ):
                out.extend(range(int(lo), int(hi) + 1))
        elif part.isdigit() and len(part) <= 4:
            out.append(int(part))
    return out[:64]


def _rank(line: str) -> RasRankRef | None:
    match = _RANK.match(line)
    if match is None:
        return None
    ops = match.group("ops")
    status = match.group("status") or match.group("error") or ""
    ops_value: int | None
    if "not launched any" in (match.group("what") or ""):
        status, ops_value = "not launched", 0
    else:
        ops_value = _int(ops) if ops is not None else None
        if ops is not None and ops_value is None:
            return None  # a count beyond the wire's range: not a line RAS writes
    return RasRankRef(
        rank=int(match.group(1)),
        gpu=int(match.group("gpu")) if match.group("gpu") else None,
        pid=int(match.group("pid")) if match.group("pid") else None,
        node=match.group("node") or "",
        status=status,
        ops=ops_value,
    )


def _process(line: str) -> RasProcess | None:
    match = _PROCESS.match(line)
    if match is None:
        return None
    return RasProcess(pid=int(match.group(1)), node=match.group(2), gpus=_gpus(match.group(3)))


class _Parser:
    def __init__(self) -> None:
        self.status = RasStatus()
        self.unparsed = 0
        self.section = ""

    def run(self, text: str) -> RasStatus:
        lines = text[:MAX_TEXT_BYTES].splitlines()[:MAX_INPUT_LINES]
        block: list[str] = []
        for raw in lines:
            line = raw.rstrip()
            stripped = line.strip()
            if not stripped:
                if block:
                    self._block(block)
                    block = []
                continue
            if set(stripped) == {"="}:
                continue  # the underline of a section title
            if self._section(stripped):
                if block:
                    self._block(block)
                    block = []
                continue
            if self.section not in ("errors", "warnings") and _COMM_HEAD.match(stripped):
                self.section = "warnings"  # an excerpt without its section title: still a block
            elif stripped.startswith("Group ") and "Comms" in stripped:
                self.section = "comms"  # the table's header, with or without the Communicators title
                continue
            if self.section in ("errors", "warnings"):
                block.append(stripped)
            else:
                self._line(stripped)
        if block:
            self._block(block)
        self.status.unparsed = self.unparsed
        return self.status

    def _section(self, line: str) -> bool:
        if line == "Job summary":
            self.section = "job"
        elif line.startswith("Communicators"):
            self.section = "comms"
            match = _COMMS_TIME.match(line)
            if match is not None:
                self.status.collection_s = float(match.group(1))
        elif line == "Errors":
            self.section = "errors"
        elif line == "Warnings":
            self.section = "warnings"
        else:
            return False
        return True

    def _line(self, line: str) -> None:
        s = self.status
        version = _VERSION.match(line)
        if version is not None:
            s.nccl_version = version.group(1)
            return
        if line.startswith(("CUDA runtime version", "Gathering data", "Collected data", "Travel times")):
            obtained = _OBTAINED.search(line)
            if obtained is not None and "communicators" in line:
                s.collection_s = float(obtained.group(1))
            return
        if self.section == "comms":
            row = _ROW.match(line)
            if row is not None:
                if len(s.groups) < MAX_ITEMS:
                    g = row.groups()
                    s.groups.append(
                        RasGroupRow(
                            group=int(g[0]),
                            comms=int(g[1]),
                            nodes=int(g[2]),
                            ranks_per_node=g[3],
                            ranks_per_comm=int(g[4]),
                            ranks_in_group=int(g[5]),
                            status=g[6],
                            errors=g[7],
                        )
                    )
                return
            if line.startswith(("Group", "#  in group", "No communicator data")):
                return
        if self.section == "job":
            totals = _TOTALS.match(line)
            if totals is not None:  # Nodes (total), Processes per node, GPUs per process, Processes, GPUs
                s.nodes, s.processes, s.gpus = (
                    int(totals.group(1)),
                    int(totals.group(4)),
                    int(totals.group(5)),
                )
                return
            if _TOTALS3.match(line) is not None or line.startswith(
                ("Nodes", "(total)", "per node", "The outlier", "Node ")
            ):
                return
        self.unparsed += 1

    def _block(self, block: list[str]) -> None:
        s = self.status
        head = block[0]
        body = block[1:]
        if head == "INCOMPLETE":
            for line in body:
                missing = _MISSING_DATA.match(line)
                if missing is not None:
                    s.missing_process_count = int(missing.group(1))
                elif (proc := _process(line)) is not None:
                    if len(s.missing_processes) < MAX_ITEMS:
                        s.missing_processes.append(proc)
                elif not line.startswith("[could not find"):
                    self.unparsed += 1
            return
        if head == "DEAD":
            for line in body:
                dead = _DEAD.match(line)
                if dead is not None:
                    s.dead_process_count = int(dead.group(1))
                elif (proc := _process(line)) is not None:
                    if len(s.dead_processes) < MAX_ITEMS:
                        s.dead_processes.append(proc)
                elif not line.startswith("[could not find"):
                    self.unparsed += 1
            return
        if head == "TIMEOUT":
            for line in body:
                timeouts = _TIMEOUTS.match(line)
                if timeouts is not None:
                    s.timeouts = int(timeouts.group(1))
            return
        comm = _COMM_HEAD.match(head)
        if comm is None:
            self.unparsed += len(block)
            return
        if len(s.comms) < MAX_ITEMS:
            s.comms.append(self._comm(comm, body))

    def _comm(self, head: re.Match[str], body: list[str]) -> RasCommIssue:
        missing = 0
        missing_ranks: list[RasRankRef] = []
        about = ""
        groups = _Groups()
        errors: list[RasRankRef] = []
        for line in body:
            if line.startswith("Rank "):  # most of a large block: straight to the rank parser
                rank = _rank(line)
                if rank is None:
                    self.unparsed += 1
                elif head.group(4) == "INCOMPLETE":
                    if len(missing_ranks) < MAX_ITEMS:
                        missing_ranks.append(rank)
                elif head.group(4) == "ERROR":
                    if len(errors) < MAX_ITEMS:
                        errors.append(rank)
                else:
                    groups.place(rank)
            elif (m := _MISSING_DATA.match(line)) is not None:
                missing = int(m.group(1))
            elif (m := _MISSING_RANKS_OLD.match(line)) is not None:
                for part in m.group(1).split(","):
                    digits = part.strip()
                    if digits.isdigit() and len(digits) <= 10 and len(missing_ranks) < MAX_ITEMS:
                        missing_ranks.append(RasRankRef(rank=int(digits)))
            elif (m := _DIFFERENT.match(line)) is not None:
                about = m.group(1)
            elif (m := _GROUP_OPS.match(line)) is not None and (ops := _int(m.group(2))) is not None:
                groups.add(int(m.group(1)), ops, "")
            elif (m := _GROUP_NONE.match(line)) is not None:
                groups.add(int(m.group(1)), 0, "")
            elif (m := _GROUP_STATUS.match(line)) is not None:
                groups.add(int(m.group(1)), None, m.group(2))
            elif _ERRORS_ON.match(line) is not None or _REPORTED.match(line) is not None:
                continue
            else:
                self.unparsed += 1
        return RasCommIssue(
            comm=f"#{head.group(1)}-{head.group(2)}",
            hash=head.group(3).lower(),
            kind=head.group(4),
            missing=missing or len(missing_ranks),
            missing_ranks=missing_ranks,
            about=about,
            groups=[RasOpGroup(count=c, ops=o, status=st, ranks=r) for c, o, st, r in groups.rows],
            errors=errors,
            lines=[line[:200] for line in body[:MAX_LINES]],
        )


class _Groups:
    """A communicator block's op-count / status groups, at most :data:`MAX_ITEMS`, each with at most
    ``MAX_ITEMS`` ranks, indexed by ops and by status so a rank line finds its group in constant time."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int | None, str, list[RasRankRef]]] = []
        self.by_ops: dict[int, int] = {}  # ops → the first group with that count
        self.by_status: dict[str, int] = {}  # status → the first group with that status

    def add(self, count: int, ops: int | None, status: str) -> list[RasRankRef] | None:
        if len(self.rows) >= MAX_ITEMS:
            return None
        index = len(self.rows)
        ranks: list[RasRankRef] = []
        self.rows.append((count, ops, status, ranks))
        if ops is not None:
            self.by_ops.setdefault(ops, index)
        if status:
            self.by_status.setdefault(status, index)
        return ranks

    def place(self, rank: RasRankRef) -> None:
        """A rank line belongs to the first group with its count or status (or makes its own), else, saying
        neither, to the group printed just before it."""
        ranks: list[RasRankRef] | None
        if rank.ops is not None or rank.status:
            found = [
                i
                for i in (
                    self.by_ops.get(rank.ops) if rank.ops is not None else None,
                    self.by_status.get(rank.status) if rank.status else None,
                )
                if i is not None
            ]
            if found:
                ranks = self.rows[min(found)][3]
            else:
                ranks = self.add(1, rank.ops, rank.status if rank.ops is None else "")
            if ranks is not None and len(ranks) < MAX_ITEMS:
                ranks.append(rank)
            return
        if self.rows:
            _count, ops, status, ranks = self.rows[-1]
            if ops is not None and rank.ops is None:
                rank = RasRankRef(rank=rank.rank, gpu=rank.gpu, pid=rank.pid, node=rank.node, ops=ops)
            elif status:
                rank = RasRankRef(rank=rank.rank, gpu=rank.gpu, pid=rank.pid, node=rank.node, status=status)
            if len(ranks) < MAX_ITEMS:
                ranks.append(rank)


def parse_status(text: str) -> RasStatus:
    """The RAS answer as a record; garbage in gives an empty record with ``unparsed`` counting the lines."""
    return _Parser().run(text)
