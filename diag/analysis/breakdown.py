"""Temporal breakdown and compute/communication overlap for one rank.

GPU traces: the timeline is all GPU streams merged (HTA's `get_temporal_breakdown`
and `get_comm_comp_overlap`): compute = union of compute kernels; communication =
union of NCCL/RCCL kernels; the breakdown assigns each instant to the first of
compute > comm > memory > other that covers it, the rest of the span is idle.
CPU-only traces (gloo): the same questions on the host timeline, with `gloo:*`, `c10d::*`,
the functional collectives' `_c10d_functional::*` (their `wait_tensor` included) and
`diag:comm:*` spans as communication and the other operators as compute. A thread inside a
communication call is not computing; but a span that is in flight (gloo records an async
send/recv from its post to the return of its wait, on the posting thread, while the thread goes
on working) takes nothing from compute: only the part of it where the thread does no other op
(idle, or blocked in the wait) is left exposed.
"""
from __future__ import annotations

import numpy as np

from ..trace.columns import distinct
from ..trace.commtable import HOST_COMM_RE
from ..trace.kinds import Kind
from ..trace.table import EventTable
from . import intervals as iv
from .hostops import fsdp_waits
from .results import Breakdown, Overlap
from .steps import Window, work_spans
from ..record import record

NS = 1e-9
# Kineto writes microseconds with three decimals, rounded: a child may end a tick after its
# parent. A call outlived by less than this is not outlived.
CROSS_TOLERANCE_NS = 1000


def _union(t: EventTable, rows: np.ndarray) -> iv.Intervals:
    return iv.merge(t.ts_ns[rows], t.end_ns[rows])


@record
class TimelineSets:
    """A window's activity as merged interval sets, computed once per rank."""

    compute: iv.Intervals
    comm: iv.Intervals
    memory: iv.Intervals = iv.EMPTY
    other: iv.Intervals = iv.EMPTY

    def busy(self) -> iv.Intervals:
        """Where anything runs: the timeline less its idle."""
        return iv.union(self.compute, self.comm, self.memory, self.other)


def timeline_sets(t: EventTable, w: Window, timeline: str) -> TimelineSets:
    if timeline != "gpu":
        return TimelineSets(*host_split(t, w))
    rows, kind = w.rows, t.kind[w.rows]
    return TimelineSets(_union(t, rows[kind == Kind.COMPUTE]), _union(t, rows[kind == Kind.COMM]),
                        _union(t, rows[(kind == Kind.MEMCPY) | (kind == Kind.MEMSET)]),
                        _union(t, rows[kind == Kind.GPU_OTHER]))


def host_split(t: EventTable, w: Window):
    """compute and comm interval sets on the host timeline.

    A thread is not computing while it is inside a communication call of its own: a
    synchronous collective blocks inside whatever op encloses it (an autograd node, say),
    ops nested inside a `c10d::` call are part of the call, and `wait_tensor` is blocked.
    A span in flight (see in_flight) takes nothing from compute: the ops inside it are the
    thread's own work, and what it leaves uncovered is exposed as communication. Nor is a thread
    computing where it waits inside FSDP2's spans for a collective that gloo runs on its worker
    thread (hostops.fsdp_waits): inside an autograd node whose hook unshards the next layer, say.
    """
    rows = w.rows
    is_comm = t.name_mask(HOST_COMM_RE.match)[rows]
    comm_rows, op_rows = rows[is_comm], rows[~is_comm & (t.kind[rows] == Kind.CPU_OP)]
    blocking = comm_rows[~in_flight(t, comm_rows, rows[t.kind[rows] == Kind.CPU_OP])]
    waits = fsdp_waits(t, rows)
    starts, ends = [], []
    for th in distinct(t.thread[op_rows]):
        ops = _union(t, op_rows[t.thread[op_rows] == th])
        s, e = iv.subtract(ops, _union(t, blocking[t.thread[blocking] == th]))
        if th in waits:
            s, e = iv.subtract((s, e), waits[th][1])
        starts.append(s)
        ends.append(e)
    compute = iv.merge(np.concatenate(starts), np.concatenate(ends)) if starts else iv.EMPTY
    return compute, _union(t, comm_rows)


def in_flight(t: EventTable, spans: np.ndarray, cpu_ops: np.ndarray) -> np.ndarray:
    """Per span row: whether it is in flight rather than a call the thread is inside.

    Decided by measuring the thread's timeline, not by name: an operator's span (a dispatcher
    call: `c10d::send`, `aten::mm`) is a call, and calls nest, each wholly inside its caller. A
    span that begins inside such a call and outlives it is no call: it is a record of work the
    call posted, in flight while the thread went on (gloo's `gloo:send` begins inside the
    `c10d::send` that posted it and ends when its `wait()` returns).
    """
    out = np.zeros(spans.size, bool)
    for th in distinct(t.thread[spans]):
        mine, calls = t.thread[spans] == th, cpu_ops[t.thread[cpu_ops] == th]
        out[mine] = _outlives(t.ts_ns[calls], t.end_ns[calls], t.ts_ns[spans[mine]], t.end_ns[spans[mine]],
                              CROSS_TOLERANCE_NS)
    return out


def _outlives(starts: np.ndarray, ends: np.ndarray, lo: np.ndarray, hi: np.ndarray, tol: int) -> np.ndarray:
    """Per window [lo, hi): does an interval of (starts, ends) begin before it and end inside it
    (by more than tol)? Of the intervals ending inside, sorted by end, the earliest start (a range
    minimum for every window at once: reduceat on the interleaved bounds)."""
    by_end = np.argsort(ends, kind="stable")
    a = np.searchsorted(ends[by_end], lo + tol, "right")
    b = np.searchsorted(ends[by_end], hi - tol, "left")
    first = np.full(lo.size, np.iinfo(np.int64).max)
    ok = b > a
    if ok.any():
        bounds = np.stack([a[ok], b[ok]], axis=1).ravel()
        first[ok] = np.minimum.reduceat(np.append(starts[by_end], 0), bounds)[::2]
    return first < lo - tol


def analyse_timeline(sets: TimelineSets, w: Window, timeline: str) -> tuple[Breakdown, Overlap]:
    compute, comm, memory, other = sets.compute, sets.comm, sets.memory, sets.other
    everything = sets.busy()
    span = int(everything[1][-1] - everything[0][0]) if everything[0].size else 0
    comm_only = iv.subtract(comm, compute)
    mem_only = iv.subtract(memory, iv.union(compute, comm))
    busy = iv.length(everything)
    c, x, m = iv.length(compute), iv.length(comm_only), iv.length(mem_only)
    bd = Breakdown(timeline=timeline, window=w.convention, span_s=span * NS, compute_s=c * NS,
                   comm_s=x * NS, memory_s=m * NS, other_s=(busy - c - x - m) * NS,
                   idle_s=(span - busy) * NS)
    comm_total = iv.length(comm)
    n_steps = int(distinct(w.step_index[w.step_index >= 0]).size)
    ov = Overlap(comm_s=comm_total * NS, overlapped_s=(comm_total - x) * NS,
                 ratio=(comm_total - x) / comm_total if comm_total else None,
                 exposed_s=x * NS, exposed_per_step_s=x * NS / n_steps if n_steps else None)
    return bd, ov


def exposed_comm_by_step(t: EventTable, w: Window, sets: TimelineSets) -> dict[int, float]:
    """Exposed communication seconds per step index, over each step's span of work."""
    exposed = iv.subtract(sets.comm, sets.compute)
    idx, lo, hi = work_spans(t, w)
    if idx.size == 0:
        return {}
    return {int(i): float(v) * NS for i, v in zip(idx, iv.lengths_in_windows(exposed, lo, hi))}
