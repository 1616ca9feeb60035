"""``NamedTuple`` for the records of ``fr analyze``, without :mod:`typing` at run time.

A small ``fr analyze`` is a one-shot process whose start is a large share of its time, and importing
:mod:`typing` is a measurable part of it, for ``NamedTuple`` and names that only annotations use. Type checkers see :class:`typing.NamedTuple` itself; at run time a class written the same way
(fields annotated in order, defaults last, docstring and methods) becomes the same
:func:`collections.namedtuple` that ``typing.NamedTuple`` makes. Modules of the path import ``Any`` and
the like under ``if TYPE_CHECKING:``, with the ``TYPE_CHECKING`` (False) of this module, which type
checkers read as true.
"""

from __future__ import annotations

from collections import namedtuple

__all__ = ["TYPE_CHECKING", "NamedTuple"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple
else:

    class _RecordType(type):
        """What ``typing.NamedTupleMeta`` does for a class written as ``class X(NamedTuple): ...``."""

        def __new__(mcls, name, bases, ns):
            if not bases:  # NamedTuple itself
                return super().__new__(mcls, name, bases, ns)
            fields = list(ns.get("__annotations__", {}))
            defaults = [ns[f] for f in fields if f in ns]
            if any(f in ns for f in fields[: len(fields) - len(defaults)]):
                raise TypeError(f"{name}: a field without a default follows one with a default")
            record = namedtuple(name, fields, defaults=defaults, module=ns["__module__"])
            record.__annotations__ = dict(ns.get("__annotations__", {}))
            for key, value in ns.items():
                if key not in ("__module__", "__annotations__") and key not in fields:
                    setattr(record, key, value)
            return record

    class NamedTuple(metaclass=_RecordType):
        """Base of a record class (see the module's docstring)."""
