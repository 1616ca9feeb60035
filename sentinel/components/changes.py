"""A reading and the one before its latest change: the memory of a signal whose rule compares the two (ECC
counters, row-remap counters), so a rise is seen once and a reset forgets what came before it."""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

R = TypeVar("R")


class Changes(msgspec.Struct, Generic[R], kw_only=True):
    """The latest reading, the one before its latest change (none after a reset), and when it changed."""

    cur: R | None = None
    prev: R | None = None
    t: float = 0.0


def remember_change(memory: Changes[R] | None, reading: R | None, t: float) -> tuple[Changes[R], bool] | None:
    """``reading`` at agent time ``t`` folded in: changed when it differs from the latest; None when the
    sample has no reading or the same one."""
    if reading is None or (memory is not None and (reading is memory.cur or reading == memory.cur)):
        return None
    if memory is None:
        return Changes(cur=reading, t=t), True
    memory.prev, memory.cur, memory.t = memory.cur, reading, t
    return memory, True


def forget_before(memory: Changes[R], t: float) -> Changes[R]:
    """A GPU reset at ``t``: rises are judged from the reset on."""
    memory.prev = None
    return memory
