"""`diag.record.record` behaves as `dataclasses.dataclass` does, without compiling `__eq__` and
`__repr__` per class: each assertion is made on a record and on its dataclass twin."""
from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, field, fields, replace
from typing import Optional

import pytest

from diag.record import record


def twin(decorate):
    """One class body, made a record or a dataclass."""
    @decorate
    class C:
        a: int
        b: Optional[str] = None
        hidden: int = field(default=0, repr=False)
        ignored: int = field(default=0, compare=False)
        kids: list = field(default_factory=list)

    return C


@pytest.mark.parametrize("decorate", [record, dataclass])
def test_same_semantics_as_dataclass(decorate):
    cls = twin(decorate)
    x, y = cls(1, "b", hidden=2, ignored=3), cls(1, "b", hidden=2, ignored=4)
    assert x == y and not (x != y)                       # compare=False is not compared
    assert x != cls(1, "c", hidden=2) and x != replace(x, hidden=5)
    assert (x == object()) is False and x.__eq__(object()) is NotImplemented
    with pytest.raises(TypeError):
        hash(x)                                          # eq without frozen: unhashable
    name = cls.__qualname__
    assert repr(x) == f"{name}(a=1, b='b', ignored=3, kids=[])"   # repr=False left out
    x.kids.append(x)
    assert repr(x) == f"{name}(a=1, b='b', ignored=3, kids=[...])"   # recursion guarded
    assert [f.name for f in fields(cls)] == ["a", "b", "hidden", "ignored", "kids"]


def test_a_record_is_not_equal_to_its_dataclass_twin_nor_a_subclass():
    R, D = twin(record), twin(dataclass)
    assert R(1) != D(1) and D(1) != R(1)

    @record
    class S(R):
        c: int = 0

    assert S(1) != R(1) and S(1, c=2) == S(1, c=2) and S(1, c=2) != S(1, c=3)
    assert repr(S(1)) == "test_a_record_is_not_equal_to_its_dataclass_twin_nor_a_subclass.<locals>.S(a=1, b=None, ignored=0, kids=[], c=0)"


def test_what_the_class_defines_is_kept():
    @record
    class Own:
        a: int

        def __eq__(self, other):
            return True

        def __hash__(self):
            return 7

        def __repr__(self):
            return "own"

    assert Own(1) == Own(2) and hash(Own(1)) == 7 and repr(Own(1)) == "own"



@pytest.mark.parametrize("decorate", [record, dataclass])
def test_frozen_as_dataclass(decorate):
    """Frozen: hashed on the tuple of its hashed fields (compare=True, or hash=True), equal by
    its compared ones, and not assignable."""
    @decorate(frozen=True)
    class F:
        a: int
        b: str = "x"
        note: str = field(default="", compare=False)
        salt: int = field(default=0, compare=False, hash=True)

    assert F(1, note="p") == F(1, note="q") and F(1) != F(2)
    assert hash(F(1, "y", salt=3)) == hash((1, "y", 3)) and hash(F(1, note="p")) == hash(F(1, note="q"))
    assert repr(F(1)).endswith("F(a=1, b='x', note='', salt=0)")
    with pytest.raises(FrozenInstanceError):
        F(1).a = 2
    with pytest.raises(FrozenInstanceError):
        del F(1).b
