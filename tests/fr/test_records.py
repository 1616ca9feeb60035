"""sentinel.fr.records.NamedTuple makes, at run time, the record typing.NamedTuple makes."""

from __future__ import annotations

import typing

import pytest

from sentinel.fr.records import NamedTuple


class Mine(NamedTuple):
    """A record."""

    seq: int
    op: str
    p2p: bool = False
    peer: int = -1

    def label(self) -> str:
        return f"{self.op}#{self.seq}"


class Theirs(typing.NamedTuple):
    """A record."""

    seq: int
    op: str
    p2p: bool = False
    peer: int = -1

    def label(self) -> str:
        return f"{self.op}#{self.seq}"


def test_the_same_record_as_typing_makes() -> None:
    mine, theirs = Mine(3, "send", peer=2), Theirs(3, "send", peer=2)
    assert tuple(mine) == tuple(theirs) == (3, "send", False, 2)
    assert repr(mine).removeprefix("Mine") == repr(theirs).removeprefix("Theirs")
    assert Mine._fields == Theirs._fields
    assert Mine._field_defaults == Theirs._field_defaults
    assert mine._replace(op="recv").label() == theirs._replace(op="recv").label() == "recv#3"
    assert Mine.__doc__ == Theirs.__doc__ == "A record."
    assert Mine.__module__ == Theirs.__module__ == __name__
    assert Mine.__qualname__ == "Mine"
    assert list(Mine.__annotations__) == list(Theirs.__annotations__)
    assert isinstance(mine, tuple)
    assert Mine(*theirs) == mine and hash(Mine(*theirs)) == hash(mine)


def test_a_field_without_default_after_one_with_a_default_is_refused() -> None:
    with pytest.raises(TypeError):

        class Bad(NamedTuple):
            a: int = 0
            b: int  # type: ignore[misc]
