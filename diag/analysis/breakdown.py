"""Temporal breakdown and compute/communication overlap for one rank.

GPU traces: the timeline is all GPU streams merged (HTA's `get_temporal_breakdown`
and `get_comm_comp_overlap`): compute = union of compute kernels; communication =
union of NCCL/RCCL kernels; the breakdown assigns each instant to the first of
compute > comm > memory > other that covers it, the rest of the span is idle.
CPU-only traces (gloo): the same questions on the host timeline, with `gloo:*`,
`c10d::*` and `diag:comm:*` spans as communication and the other operators as compute.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Kind
from ..trace.table import EventTable
from . import intervals as iv
from .results import Breakdown, Overlap
from .steps import Window

NS = 1e-9
HOST_COMM_RE = re.compile(r"^(gloo:|c10d::|diag:comm:|nccl:|record_param_comms$)")


def _union(t: EventTable, rows: np.ndarray) -> iv.Intervals:
    return iv.merge(t.ts_ns[rows], t.end_ns[rows])


@dataclass
class TimelineSets:
    """A window's activity as merged interval sets, computed once per rank."""

    compute: iv.Intervals
    comm: iv.Intervals
    memory: iv.Intervals = iv.EMPTY
    other: iv.Intervals = iv.EMPTY


def timeline_sets(t: EventTable, w: Window, timeline: str) -> TimelineSets:
    if timeline != "gpu":
        return TimelineSets(*host_split(t, w))
    rows, kind = w.rows, t.kind[w.rows]
    return TimelineSets(_union(t, rows[kind == Kind.COMPUTE]), _union(t, rows[kind == Kind.COMM]),
                        _union(t, rows[(kind == Kind.MEMCPY) | (kind == Kind.MEMSET)]),
                        _union(t, rows[kind == Kind.GPU_OTHER]))


def host_split(t: EventTable, w: Window):
    """compute and comm interval sets on the host timeline.

    A thread is not computing while it is inside a communication span of its own: a
    synchronous collective blocks inside whatever op encloses it (an autograd node, say),
    and ops nested inside a `c10d::` call are part of the call.
    """
    rows = w.rows
    is_comm = t.name_mask(HOST_COMM_RE.match)[rows]
    comm_rows, op_rows = rows[is_comm], rows[~is_comm & (t.kind[rows] == Kind.CPU_OP)]
    starts, ends = [], []
    for th in np.unique(t.thread[op_rows]):
        ops = _union(t, op_rows[t.thread[op_rows] == th])
        own_comm = _union(t, comm_rows[t.thread[comm_rows] == th])
        s, e = iv.subtract(ops, own_comm)
        starts.append(s)
        ends.append(e)
    compute = iv.merge(np.concatenate(starts), np.concatenate(ends)) if starts else iv.EMPTY
    return compute, _union(t, comm_rows)


def analyse_timeline(sets: TimelineSets, w: Window, timeline: str) -> tuple[Breakdown, Overlap]:
    compute, comm, memory, other = sets.compute, sets.comm, sets.memory, sets.other
    everything = iv.merge(np.concatenate([compute[0], comm[0], memory[0], other[0]]),
                          np.concatenate([compute[1], comm[1], memory[1], other[1]]))
    span = int(everything[1][-1] - everything[0][0]) if everything[0].size else 0
    comm_only = iv.subtract(comm, compute)
    mem_only = iv.subtract(memory, iv.merge(np.concatenate([compute[0], comm[0]]),
                                            np.concatenate([compute[1], comm[1]])))
    busy = iv.length(everything)
    c, x, m = iv.length(compute), iv.length(comm_only), iv.length(mem_only)
    bd = Breakdown(timeline=timeline, window=w.convention, span_s=span * NS, compute_s=c * NS,
                   comm_s=x * NS, memory_s=m * NS, other_s=(busy - c - x - m) * NS,
                   idle_s=(span - busy) * NS)
    comm_total = iv.length(comm)
    n_steps = int(np.unique(w.step_index[w.step_index >= 0]).size)
    ov = Overlap(comm_s=comm_total * NS, overlapped_s=(comm_total - x) * NS,
                 ratio=(comm_total - x) / comm_total if comm_total else None,
                 exposed_s=x * NS, exposed_per_step_s=x * NS / n_steps if n_steps else None)
    return bd, ov


def exposed_comm_by_step(t: EventTable, w: Window, sets: TimelineSets) -> dict[int, float]:
    """Exposed communication seconds per step index, over each step's span of work."""
    exposed = iv.subtract(sets.comm, sets.compute)
    idx = np.unique(w.step_index[w.step_index >= 0])
    if idx.size == 0:
        return {}
    lo = np.array([t.ts_ns[w.rows[w.step_index == i]].min() for i in idx])
    hi = np.array([t.end_ns[w.rows[w.step_index == i]].max() for i in idx])
    return {int(i): float(v) * NS for i, v in zip(idx, iv.lengths_in_windows(exposed, lo, hi))}
