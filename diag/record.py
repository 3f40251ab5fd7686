"""`@record`: a dataclass whose `__eq__`, `__repr__` (and a frozen one's `__hash__`) are shared
functions, not compiled code.

Python's `dataclass` compiles each method it adds to a class (an `exec` of generated source,
~0.25 ms apiece on Python 3.11): `__init__`, `__repr__` and `__eq__`, and for a frozen class
`__hash__`, `__setattr__` and `__delattr__` too. diag defines some ninety and `diag analyze`
imports most of them before it prints a line; the methods that no hot path calls cost ~15 ms of
the ~0.19 s the command takes on a 10 MB trace (benchmarks/README.md, issue #22). The semantics
are dataclass's: `__eq__` compares the fields with `compare=True`, in order, between instances of
the same class (NotImplemented otherwise); an unfrozen class is then unhashable, a frozen one
hashes the tuple of its hashed fields (`hash=True`, or `hash=None` and `compare=True`), unless the
class defines `__hash__`; `__repr__` lists the fields with `repr=True`, guarded against recursion.
A method the class defines itself is kept. `order`, `unsafe_hash` and explicit `eq`/`repr` settings
go to `dataclass` unchanged.
"""
from __future__ import annotations

import reprlib
from dataclasses import dataclass, fields

PASSED_ON = ("order", "unsafe_hash", "eq", "repr")


def record(cls=None, /, **kw):
    if cls is None:
        return lambda c: record(c, **kw)
    if any(kw.get(k) is not None for k in PASSED_ON):
        return dataclass(cls, **kw)
    own = cls.__dict__
    keep_eq, keep_repr, keep_hash = "__eq__" in own, "__repr__" in own, "__hash__" in own
    out = dataclass(cls, eq=False, repr=False, **kw)
    fs = fields(out)
    if not keep_eq:
        out.__record_compare__ = tuple(f.name for f in fs if f.compare)
        out.__eq__ = _eq
        if not keep_hash:
            if kw.get("frozen"):
                out.__record_hash__ = tuple(f.name for f in fs if (f.compare if f.hash is None else f.hash))
                out.__hash__ = _hash
            else:
                out.__hash__ = None
    if not keep_repr:
        out.__record_repr__ = tuple(f.name for f in fs if f.repr)
        out.__repr__ = _repr
    return out


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = self.__record_compare__
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _hash(self) -> int:
    return hash(tuple(getattr(self, n) for n in self.__record_hash__))


@reprlib.recursive_repr()
def _repr(self) -> str:
    return (f"{self.__class__.__qualname__}("
            + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__record_repr__) + ")")
