"""Collective op names and the rules that say which fields must agree across the ranks of one collective.

PyTorch records ``profiling_name`` as ``<backend>:<op>[ <p2p peers>]`` (``nccl:all_reduce``,
``gloo:all_gather``, ``nccl:send 0->1``, ``nccl:recv 1<-0``, ``nccl:coalesced``). Every rank of a collective
must pass the same op; sizes must agree by per-op rules: an all_gather's output holds group-size inputs, a
reduce_scatter's input holds group-size outputs, gather/scatter only agree on the non-root side, and
all_to_all may legitimately differ (uneven splits).
"""

from __future__ import annotations

import re

from sentinel.fr.errors import FrFormatError
from sentinel.fr.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

SAME_INPUT_AND_OUTPUT = frozenset(
    {
        "all_reduce",
        "allreduce",
        "allreduce_coalesced",
        "all_reduce_coalesced",
        "broadcast",
        "_broadcast_oop",
        "reduce",
        "_reduce_oop",
        "barrier",
        "all_reduce_barrier",
    }
)
GATHER_LIKE = frozenset(
    {
        "all_gather",
        "allgather",
        "_all_gather_base",
        "all_gather_base",
        "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced",
        "all_gather_single",
        "ALLGATHER_coalesced",
        "allgather_coalesced",
        "allgather_into_tensor_coalesced",
    }
)
SCATTER_LIKE = frozenset(
    {
        "reduce_scatter",
        "_reduce_scatter_base",
        "reduce_scatter_base",
        "reduce_scatter_tensor",
        "reduce_scatter_single",
        "reduce_scatter_tensor_coalesced",
        "REDUCE_SCATTER_coalesced",
    }
)
UNEVEN = frozenset({"all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base"})
UNEVEN |= frozenset({"all_gather_v", "reduce_scatter_v", "gather", "scatter"})
P2P = frozenset({"send", "recv", "isend", "irecv", "recv_anysource"})
#: Backends whose process group records its collectives in the flight recorder but not its send/recv:
#: ProcessGroupGloo (torch 2.13) counts a send/recv in ``op_id`` and in its ``pg_status`` without writing an
#: entry, where ProcessGroupNCCL writes one per op (``nccl:send 0->1``, ``is_p2p``). Only for these do
#: ``op_id`` gaps mean "send/recv ran here".
UNRECORDED_P2P_BACKENDS = frozenset({"gloo"})
_BACKEND = re.compile(r"[a-z0-9_]{1,16}")
#: :func:`backend` of a group whose entries name more than one backend (``cpu:gloo,cuda:nccl``)
MIXED_BACKENDS = "mixed"


def op_name(profiling_name: str) -> str:
    """``nccl:send 0->1`` → ``send``; ``gloo:all_reduce`` → ``all_reduce``."""
    name = profiling_name.split(":", 1)[1] if ":" in profiling_name else profiling_name
    return name.split(" ", 1)[0]


def backend(profiling_name: str) -> str:
    """The communication library that recorded an entry: ``nccl:send 0->1`` → ``nccl``, ``gloo:barrier`` →
    ``gloo`` (the prefix PyTorch's own analyzer splits off as ``comm_lib_backend``); "" when the name
    carries none that looks like one (at most 16 lowercase letters, digits or ``_``)."""
    head, sep, _ = profiling_name[:17].partition(":")
    return head if sep and _BACKEND.fullmatch(head) else ""


def entry_completed(entry: dict[str, Any]) -> bool:
    """Whether a decoded entry's op is over: retired, or state "completed" (the rule the dump reduction in
    :mod:`sentinel.fr.summary` applies inline in its hot loop; the live heads and the newest-entries
    check read it here)."""
    return entry.get("retired") is True or entry.get("state") == "completed"


#: :func:`op_name` of the entry that closes a coalesced batch (``nccl:coalesced``)
COALESCED = "coalesced"


def closes_p2p_batch(is_p2p: Any, p2p_seq: int, member_seq: int | None) -> bool:
    """Whether a ``coalesced`` entry (:data:`COALESCED`) closes a batch of send/recv rather than being a
    collective: the rule every reader of entries applies (the dump reduction
    :func:`sentinel.fr.summary._summarize`, the live one :func:`sentinel.fr.reduce.reduce_snapshot`, the
    newest-entries checks :class:`sentinel.fr.recent._Batches` and :func:`sentinel.fr.loader._column_split`).

    **A batch's closer is known by its place, not its is_p2p flag**: it follows its batch's send/recv in
    its group, with their ``p2p_seq_id``. ProcessGroupNCCL::pointToPoint, while coalescing
    (``batch_isend_irecv``, ``_coalescing_manager``), records each op of the batch with no work of its own,
    and ``endCoalescing`` records the batch's work right after them as one ``nccl:coalesced`` entry of the
    same group and ``p2p_seq_id``. Its ``is_p2p`` cannot be trusted: torch 2.5's ``initWork`` records it as
    ``isP2POp(COALESCED)``, which is false (its ``collective_seq_id`` is then the group's last collective's,
    so read as a collective it folds into that one's column: a false mismatch, or a batch whose members
    never close); the FlightRecorder of 2.7+ records it true; an older or hand-made dump may carry no flag
    at all. Since 2.7 ``endCoalescing`` also closes slow-path coalesced *collectives* with such an entry
    (their members are collectives of its ``collective_seq_id``): one that follows no send/recv of its
    ``p2p_seq_id`` and does not say ``is_p2p`` True is a collective.

    ``is_p2p``: the entry's flag as decoded; ``member_seq``: the ``p2p_seq_id`` of the send/recv the entry
    follows in its group (its batch's last member; which one each reader can see is said where it is
    called), None when it follows none. Called for ``coalesced`` entries only (the reduction's hot loop
    pays nothing for the others)."""
    return is_p2p is True or (member_seq is not None and member_seq == p2p_seq)


def reads_as_p2p(op: str, is_p2p: Any, p2p_seq: int, member_seq: int | None) -> bool:
    """Whether an entry of :func:`op_name` ``op`` is a send/recv or a batch's closer, not a collective: by
    name, by ``is_p2p`` True, or as a ``coalesced`` entry by its place (:func:`closes_p2p_batch`)."""
    return op in P2P or is_p2p is True or (op == COALESCED and closes_p2p_batch(is_p2p, p2p_seq, member_seq))


def is_send(op: str) -> bool:
    """Whether a p2p op (``nccl:send 0->1``, or its name ``send``/``isend``) sends; else it receives."""
    return op_name(op) in ("send", "isend")


def p2p_peer(profiling_name: str) -> tuple[int, int] | None:
    """(src, dst) group-local ranks of a p2p op, or None when the name does not carry them."""
    tail = profiling_name.rsplit(" ", 1)[-1]
    try:
        if "->" in tail:
            src, dst = tail.split("->", 1)
            return int(src), int(dst)
        if "<-" in tail:
            dst, src = tail.split("<-", 1)
            return int(src), int(dst)
    except ValueError:
        return None
    return None


#: Element counts saturate here: a shape of 100,000 dims of 2^62 must not build a 6-million-bit integer
#: (each multiplication would cost more than the last: quadratic).
NUMEL_CAP = 1 << 64


def numel(sizes: Any) -> int:
    """Total elements of a list of tensor shapes (saturating at NUMEL_CAP); FrFormatError when the shapes
    are not lists of ints."""
    total = 0
    for shape in sizes:
        if not isinstance(shape, list | tuple):
            raise FrFormatError(f"tensor shape is {type(shape).__name__}, expected a list")
        n = 1
        for dim in shape:
            if type(dim) is not int:
                raise FrFormatError(f"tensor dimension is {type(dim).__name__}, expected an int")
            n = min(n * dim, NUMEL_CAP) if dim >= 0 else -1
        total = min(total + n, NUMEL_CAP)
    return total


def group_size_hint(op: str, in_sizes: Any, out_sizes: Any) -> int:
    """The group size implied by an all_gather / reduce_scatter's shapes, 0 when they imply none."""
    if op in GATHER_LIKE:
        small, big = numel(in_sizes), numel(out_sizes)
    elif op in SCATTER_LIKE:
        small, big = numel(out_sizes), numel(in_sizes)
    else:
        return 0
    if small <= 0 or big <= 0 or big >= NUMEL_CAP or big % small:
        return 0
    ratio = big // small
    return ratio if ratio <= 1 << 24 else 0


def match_key(op: str, in_sizes: Any, out_sizes: Any, dtypes: Any) -> str:
    """The part of a collective's description that must be identical on every rank of it."""
    if op in SAME_INPUT_AND_OUTPUT or op in GATHER_LIKE or op in SCATTER_LIKE:
        sizes = f"{in_sizes}>{out_sizes}"
    elif op in UNEVEN:
        sizes = ""
    else:  # p2p too: a send's input must fit the matching recv's tensor (checked pairwise, not across ranks)
        sizes = f"{in_sizes}"
    return f"{op}|{sizes}|{','.join(sorted(dtypes))}"


def describe_sizes(in_sizes: Any, out_sizes: Any) -> str:
    """A short human form of input → output shapes."""
    return f"{_shapes(in_sizes)}→{_shapes(out_sizes)}"


def _shapes(sizes: Any) -> str:
    try:
        return "[" + ", ".join("x".join(str(d) for d in s) or "scalar" for s in sizes) + "]"
    except TypeError:
        return str(sizes)[:60]
