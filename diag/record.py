"""`@record`: a dataclass whose `__eq__` and `__repr__` are two shared functions, not compiled code.

Python's `dataclass` compiles an `__init__`, a `__repr__` and an `__eq__` for every class it makes
(an `exec` of generated source each, ~0.25 ms apiece on Python 3.11). diag defines some ninety
and `diag analyze` imports most of them before it prints a line; the two per class that no hot
path calls cost ~11 ms of the ~0.19 s the command takes on a 10 MB trace (benchmarks/README.md,
issue #22). The semantics are dataclass's: `__eq__` compares the fields with `compare=True`, in
order, between instances of the same class (NotImplemented otherwise) and leaves the class
unhashable, unless it defines `__hash__`; `__repr__` lists the fields with `repr=True`, guarded
against recursion. A method the class defines itself is kept. Frozen classes, `order`, and
explicit `eq`/`repr` settings go to `dataclass` unchanged.
"""
from __future__ import annotations

import reprlib
from dataclasses import dataclass, fields


def record(cls=None, /, **kw):
    if cls is None:
        return lambda c: record(c, **kw)
    if kw.get("frozen") or kw.get("order") or "eq" in kw or "repr" in kw:
        return dataclass(cls, **kw)
    own = cls.__dict__
    keep_eq, keep_repr, keep_hash = "__eq__" in own, "__repr__" in own, "__hash__" in own
    out = dataclass(cls, eq=False, repr=False, **kw)
    if not keep_eq:
        out.__record_compare__ = tuple(f.name for f in fields(out) if f.compare)
        out.__eq__ = _eq
        if not keep_hash:
            out.__hash__ = None
    if not keep_repr:
        out.__record_repr__ = tuple(f.name for f in fields(out) if f.repr)
        out.__repr__ = _repr
    return out


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = self.__record_compare__
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


@reprlib.recursive_repr()
def _repr(self) -> str:
    return (f"{self.__class__.__qualname__}("
            + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__record_repr__) + ")")
