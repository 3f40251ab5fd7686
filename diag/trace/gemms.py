"""The shapes of a rank's matrix multiplications, kept while its trace is decoded.

A trace recorded with `record_shapes=True` (torchtitan's profiler does) gives every aten op
its `Input Dims`; those of the GEMM ops show the model's shape (hidden size, MLP width,
tokens per micro-batch: analysis.shapes). Only these few ops' args are decoded, and what is
kept is a count per distinct (op, input dims), a few dozen entries however long the trace.
"""
from __future__ import annotations

from collections import Counter
from math import prod
from typing import Optional

import numpy as np

from . import schema

GEMM_OPS = frozenset({"aten::linear", "aten::addmm", "aten::mm", "aten::matmul"})
MAX_RANK = 8                     # tensors of more dimensions are not a GEMM's operands

Dims = tuple[tuple[int, ...], ...]


MAX_ELEMENTS = (1 << 63) - 1   # int64: past it a shape is damage, and would overflow what reads it
TOO_BIG = "GEMM ops whose Input Dims pass int64 elements (their shape is taken as unknown)"


def dims_key(dims) -> Optional[Dims]:
    """`Input Dims` as a hashable tuple of shapes (a scalar argument is ()); None when it is
    not a list of lists of integers (no record_shapes, or damage)."""
    if not isinstance(dims, list):
        return None
    out = []
    for d in dims:
        if not isinstance(d, list) or len(d) > MAX_RANK \
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
            return None
        out.append(tuple(d))
    return tuple(out)


def _fits(dims: Dims) -> bool:
    return all(prod(d) <= MAX_ELEMENTS for d in dims)


def gemm_shapes(evs: list, name_ids: np.ndarray, names: list[str], skipped: Optional[dict] = None) -> Counter:
    """(op name, input dims) -> count, over the GEMM ops among a chunk's events. Shapes whose
    element count passes int64 are left out, and counted in skipped (TOO_BIG)."""
    is_gemm = np.fromiter((n in GEMM_OPS for n in names), dtype=bool, count=len(names))
    rows = np.flatnonzero(is_gemm[name_ids]) if len(names) else np.zeros(0, dtype=np.int64)
    if not rows.size:
        return Counter()
    args = schema.decode_args_many([evs[i].args for i in rows])
    keys = Counter(k for k in ((names[name_ids[i]], dims_key(a.input_dims)) for i, a in zip(rows.tolist(), args))
                   if k[1] is not None)
    too_big = [k for k in keys if not _fits(k[1])]
    if too_big and skipped is not None:
        skipped[TOO_BIG] = skipped.get(TOO_BIG, 0) + sum(keys[k] for k in too_big)
    for k in too_big:
        del keys[k]
    return keys
