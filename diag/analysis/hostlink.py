"""Link GPU kernels to the host operations that launched them (communication kernels to their
collective; a pipeline action's host span to the kernels it launched).

Older traces carry no NCCL args on kernels: what the kernel moved, in which group, and
for which parallel axis is only said on the host, by the ops enclosing its launch
(`c10d::alltoall_base_`, `record_param_comms` with args, `nccl:all_to_all`, and the
trainer's `diag:comm:<axis>:<op>:<bytes>` label). The kernel's launch is found by
`correlation`; enclosing ops by time containment on the launching thread.
"""
from __future__ import annotations

import re
from typing import Callable

import numpy as np

from ..layout import AXES
from ..trace.columns import distinct
from ..trace.kinds import Kind
from ..trace.table import EventTable

LABEL_RE = re.compile(r"^diag:comm:(" + "|".join(sorted(AXES, key=len, reverse=True)) + r"):([a-z_]+):(\d+)")
C10D_RE = re.compile(r"^(c10d::|nccl:|gloo:)")


def enclosing(t: EventTable, points_ns: np.ndarray, threads: np.ndarray,
              predicate: Callable[[str], object], kinds=(Kind.CPU_OP, Kind.ANNOTATION)) -> np.ndarray:
    """For each (time, host thread), the innermost row matching predicate that contains it; -1 if none.

    Rows of one pattern are assumed not to nest among themselves on a thread (true for
    collectives and labels); among overlapping candidates the latest-starting wins.
    """
    out = np.full(points_ns.size, -1, dtype=np.int64)
    cand = np.flatnonzero(t.name_mask(predicate) & t.mask(*kinds))
    if cand.size == 0 or points_ns.size == 0:
        return out
    for th in distinct(threads[threads >= 0]):
        rows = cand[t.thread[cand] == th]
        if rows.size == 0:
            continue
        rows = rows[np.argsort(t.ts_ns[rows], kind="stable")]
        sel = np.flatnonzero(threads == th)
        i = np.searchsorted(t.ts_ns[rows], points_ns[sel], side="right") - 1
        ok = i >= 0
        hit = np.where(ok, rows[np.maximum(i, 0)], -1)
        ok &= t.end_ns[np.maximum(hit, 0)] >= points_ns[sel]
        out[sel[ok]] = hit[ok]
    return out


def launches(t: EventTable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(launch time, launch thread) of GPU rows via correlation; -1 where not found."""
    corr, lrows = t.launch_index
    ts = np.full(rows.size, -1, dtype=np.int64)
    th = np.full(rows.size, -1, dtype=np.int64)
    if lrows.size == 0 or rows.size == 0:
        return ts, th
    want = t.correlation[rows]
    pos = np.clip(np.searchsorted(corr, want), 0, corr.size - 1)
    hit = (corr[pos] == want) & (want >= 0)
    src = lrows[pos[hit]]
    ts[hit], th[hit] = t.ts_ns[src], t.thread[src]
    return ts, th



def kernel_spans(t: EventTable, rows: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host spans [start, end) -> the span of the GPU rows launched inside each, from any thread
    (first kernel start, last kernel end); -1, -1 where none was. Any thread: on a GPU, autograd
    launches a backward's kernels from its own device thread while the main thread waits."""
    lo, hi = np.full(start.size, -1, np.int64), np.full(start.size, -1, np.int64)
    at = launches(t, rows)[0]
    order = np.argsort(at, kind="stable")
    rows, at = rows[order], at[order]
    a, b = np.searchsorted(at, start, side="left"), np.searchsorted(at, end, side="left")
    for i in np.flatnonzero(b > a).tolist():
        sel = rows[a[i]:b[i]]
        lo[i], hi[i] = int(t.ts_ns[sel].min()), int(t.end_ns[sel].max())
    return lo, hi
