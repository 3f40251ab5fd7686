"""Python values -> numpy columns, tolerant of the odd types real traces contain."""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def num_column(values: list, dtype, missing: int = -1) -> np.ndarray:
    """Numbers (or None, or numeric strings) -> array; anything unparsable, or out of an integer
    dtype's range, -> missing."""
    try:
        arr = np.array(values, dtype=np.float64)
        if arr.ndim != 1:
            raise ValueError("not a flat list of numbers")
    except (TypeError, ValueError, OverflowError):
        arr = np.array([as_float(v) for v in values], dtype=np.float64)
    return float_column(arr, dtype, missing)


def float_column(arr: np.ndarray, dtype, missing: int = -1) -> np.ndarray:
    """A float64 array -> dtype, as num_column: not finite, or out of an integer dtype's range,
    -> missing (arr is changed in place)."""
    bad = ~np.isfinite(arr)
    if np.issubdtype(np.dtype(dtype), np.integer):      # past the type's range: missing, not wrapped
        lim = np.iinfo(dtype)
        bad |= (arr < float(lim.min)) | (arr >= float(lim.max) + 1.0)
    if bad.any():
        arr[bad] = missing
    return arr.astype(dtype)


def as_float(v: Any) -> float:
    if isinstance(v, (list, dict, bool)):
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def sparse_column(n: int, rows: np.ndarray, values) -> np.ndarray:
    """A full int64 column, -1 except at rows (whose args were decoded): values is a list, or
    a float64 array (num_column's first step, done by the caller)."""
    out = np.full(n, -1, dtype=np.int64)
    if rows.size:
        out[rows] = float_column(values, np.int64) if isinstance(values, np.ndarray) else num_column(values, np.int64)
    return out
