"""How findings name ranks and point-to-point ops: short, with long rank lists cut."""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from sentinel.fr.ops import is_send


def counterpart(op: str) -> str:
    return "recv" if is_send(op) else "send"


def list_ranks(ranks: Sequence[int] | AbstractSet[int]) -> str:
    items = sorted(ranks)
    if len(items) > 12:
        return ", ".join(str(r) for r in items[:10]) + f", … ({len(items)} ranks)"
    return ", ".join(str(r) for r in items)


def who(ranks: Sequence[int] | AbstractSet[int]) -> str:
    return f"rank {list_ranks(ranks)}" if len(ranks) == 1 else f"ranks {list_ranks(ranks)}"
