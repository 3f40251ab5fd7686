"""Python values -> numpy columns, tolerant of the odd types real traces contain; and the two
numpy reductions the analysis uses everywhere, without the import of numpy.ma that numpy's own
make on first use (~10 ms a process, in every worker: numpy.ma rewrites its docstrings at import)."""
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


def distinct(values: np.ndarray) -> np.ndarray:
    """np.unique(values): the sorted distinct values. Plain np.unique asks numpy.ma whether the
    array is masked; asked for the counts too, it does not ask, and the values are the same."""
    return np.unique(values, return_counts=True)[0]


def median(values):
    """np.median(values) over all the values (a numpy float): the same partition and mean of the
    middle one or two. np.median's check for NaN asks numpy.ma; here the values are checked first,
    and an empty input, one with a NaN or of another type than int or float goes to np.median."""
    a = np.asarray(values)
    if a.size == 0 or a.dtype.kind not in "iuf" or (a.dtype.kind == "f" and np.isnan(a).any()):
        return np.median(a)
    a = a.ravel()
    h = a.size // 2
    if a.size % 2:
        return np.mean(np.partition(a, h)[h:h + 1], axis=0)
    return np.mean(np.partition(a, [h - 1, h])[h - 1:h + 1], axis=0)


def percentile(values, q: float) -> float:
    """float(np.percentile(values, q)) (method "linear", numpy's default): numpy's virtual index
    (n - 1) q / 100 and its two-sided interpolation between the neighbours, in the same float
    arithmetic. np.percentile sorts its indices with np.unique, which asks numpy.ma; an input that
    is not all finite floats or ints, or is empty, goes to np.percentile."""
    a = np.asarray(values)
    if a.size == 0 or a.dtype.kind not in "iuf" or not np.isfinite(a).all():
        return float(np.percentile(a, q))
    a = a.ravel().astype(np.float64, copy=False)
    n, f = a.size, q / 100
    v = (n - 1) * f                                       # numpy's virtual index for "linear"
    if v >= n - 1:
        return float(a.max())
    if v < 0:
        return float(a.min())
    lo = int(np.floor(v))
    part = np.partition(a, [lo, lo + 1])
    x, y, t = float(part[lo]), float(part[lo + 1]), v - lo
    return y - (y - x) * (1 - t) if t >= 0.5 else x + (y - x) * t     # numpy's _lerp
