"""Vectorised interval arithmetic on int64 nanosecond [start, end) intervals.

Sets of intervals are kept merged (sorted, disjoint). Everything here is numpy
sorting and cumulative sums: no Python loop over events.
"""
from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.zeros(0, np.int64), np.zeros(0, np.int64))


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Union of possibly overlapping intervals, as sorted disjoint intervals."""
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    # A new group starts where an interval begins after everything before it has ended.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def union(*sets: Intervals) -> Intervals:
    """Union of interval sets (merged or not), as sorted disjoint intervals."""
    return merge(np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))


def length(iv: Intervals) -> int:
    return int((iv[1] - iv[0]).sum())


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two merged interval sets."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate([np.ones(a[0].size, np.int8), -np.ones(a[1].size, np.int8),
                            np.ones(b[0].size, np.int8), -np.ones(b[1].size, np.int8)])
    # Ends sort before starts at the same instant so touching intervals do not overlap.
    order = np.lexsort((delta, times))
    times, depth = times[order], np.cumsum(delta[order])
    inside = depth == 2
    starts = times[:-1][inside[:-1]]
    ends = times[1:][inside[:-1]]
    keep = ends > starts
    return merge(starts[keep], ends[keep])


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Parts of merged set a not covered by merged set b."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    da = np.concatenate([np.ones(a[0].size, np.int8), -np.ones(a[1].size, np.int8),
                         np.zeros(2 * b[0].size, np.int8)])
    db = np.concatenate([np.zeros(2 * a[0].size, np.int8),
                         np.ones(b[0].size, np.int8), -np.ones(b[1].size, np.int8)])
    order = np.lexsort((da + db, times))
    times = times[order]
    in_a, in_b = np.cumsum(da[order]), np.cumsum(db[order])
    inside = (in_a == 1) & (in_b == 0)
    starts, ends = times[:-1][inside[:-1]], times[1:][inside[:-1]]
    keep = ends > starts
    return merge(starts[keep], ends[keep])


def clip(iv: Intervals, lo: int, hi: int) -> Intervals:
    """The part of a merged set inside [lo, hi)."""
    s, e = np.maximum(iv[0], lo), np.minimum(iv[1], hi)
    keep = e > s
    return s[keep], e[keep]


def lengths_in_windows(iv: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Covered length of a merged set inside each [lo[i], hi[i]) window (windows may overlap)."""
    s, e = iv
    if s.size == 0:
        return np.zeros(lo.size, np.int64)
    cum = np.concatenate([[0], np.cumsum(e - s)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        # Length of the set below time t: whole intervals ending before t, plus a partial one.
        i = np.searchsorted(e, t, side="right")
        partial = np.where(i < s.size, np.clip(t - s[np.minimum(i, s.size - 1)], 0, None), 0)
        return cum[i] + partial

    return covered_before(hi) - covered_before(lo)
