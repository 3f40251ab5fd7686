"""Each rank's waits on point-to-point transfers: the raw material of the pipeline bubble.

Problem: a pipeline stage loses time where it waits for its neighbour's activations or
gradients. Traces of torchtitan or Megatron-LM jobs rarely say which process group a send or
receive ran in (gloo's `gloo:send` spans carry no args at all), so this per-rank pass keeps
every point-to-point op it finds with what the trace does say of it (its group, its peer within
the group, whether a pipelining annotation or a `diag:comm:pp` label encloses it) and the time
the rank spent waiting on it. The merge (analysis.pipeline) decides, with the job's layout,
which of them are the pipeline's.

What counts as waiting:
- host timeline (CPU-only traces): the main thread (the one with the ProfilerStep marks) blocked
  in the op's wait. gloo, like NCCL's host side, records an async op as a span from its post to
  the return of its `wait()`; the wait is the idle stretch of the main thread (no CPU op running,
  or only the p2p op itself) that ends when the span ends. Idle moments while a send posted long
  ago is still open do not count: torch.distributed.pipelining waits on its sends only at the end
  of the step, so their spans cover most of it.
- GPU timeline: the p2p kernel's time not under compute (a receive kernel spins until the data
  arrives), as for every other exposed communication.
"""
from __future__ import annotations

import re
from dataclasses import field

import numpy as np

from ..layout import axis_index
from ..trace.commtable import P2P_OPS
from ..trace.kinds import Coll, Kind
from ..trace.table import RankTrace
from . import intervals as iv
from .collectives import RankComms
from .hostlink import enclosing
from .steps import Window
from ..record import record

P2P_COLLS = (Coll.SEND, Coll.RECV, Coll.SEND_RECV)
P2P_SPANS = frozenset({"gloo:send", "gloo:recv"})
# What encloses the post of a transfer the pipeline certainly made: torch.distributed.pipelining's
# `PP:<stage>SEND_F<mb>`-style actions and GPipe's `Forward i` / `Backward i`, the trainer's label.
PIPELINE_POST_RE = re.compile(r"^(PP:|Forward \d+$|Backward \d+$|diag:comm:pp:)")
PP_AXIS = axis_index("pp")


def _ints(dtype) -> np.ndarray:
    return np.zeros(0, dtype)


@record
class P2PWaits:
    """One rank's point-to-point ops (candidates for the pipeline's) and its waits on them."""

    group: list = field(default_factory=list)     # per op: member-rank key "0,4", or None
    peer: np.ndarray = field(default_factory=lambda: _ints(np.int32))   # peer within the group, -1
    sure: np.ndarray = field(default_factory=lambda: _ints(np.bool_))   # the pipeline's for certain
    wait_op: np.ndarray = field(default_factory=lambda: _ints(np.int32))  # per waiting interval: its op
    wait_lo: np.ndarray = field(default_factory=lambda: _ints(np.int64))  # [lo, hi) on the rank's clock
    wait_hi: np.ndarray = field(default_factory=lambda: _ints(np.int64))

    def __len__(self) -> int:
        return int(self.peer.size)

    def waited(self, ops: np.ndarray) -> iv.Intervals:
        """The union of the waits on the chosen ops (a boolean mask over ops)."""
        pick = ops[self.wait_op] if self.wait_op.size else np.zeros(0, bool)
        return iv.merge(self.wait_lo[pick], self.wait_hi[pick])


def main_thread(t, steps_rows: np.ndarray) -> int:
    """The thread that marks the steps: the training loop's."""
    if steps_rows.size:
        return int(np.bincount(t.thread[steps_rows]).argmax())
    ops = t.thread[t.kind == Kind.CPU_OP]
    return int(np.bincount(ops).argmax()) if ops.size else -1


def _host_facts(rt: RankTrace, rows: np.ndarray):
    """(group, peer, sure) of host p2p rows. A gloo span names nothing: it takes the facts of the
    c10d op it was posted from (its start lies inside that op on the same thread)."""
    t, c = rt.events, rt.comms
    src = enclosing(t, t.ts_ns[rows], t.thread[rows], lambda s: s in P2P_OPS, kinds=(Kind.CPU_OP,))
    src = np.where(src >= 0, src, rows)
    sure = enclosing(t, t.ts_ns[src], t.thread[src], PIPELINE_POST_RE.match) >= 0
    if len(c) == 0:
        return [None] * src.size, np.full(src.size, -1, np.int32), sure
    j = np.clip(np.searchsorted(c.row, src), 0, len(c) - 1)          # comm rows are ascending
    has = c.row[j] == src
    g = np.where(has, c.group[j], -1)
    peer = np.where(has, c.peer[j] if c.peer is not None else -1, -1).astype(np.int32)
    return [t.symbols[int(x)] if x >= 0 else None for x in g.tolist()], peer, sure


def host_waits(rt: RankTrace, w: Window, steps: np.ndarray, main: int) -> P2PWaits:
    """CPU-only traces: each p2p op's wait on the main thread, within the analysed steps (indices)."""
    t = rt.events
    in_steps = iv.merge(w.steps.start_ns[steps], w.steps.end_ns[steps])
    p2p_op = t.name_mask(lambda s: s in P2P_OPS) & (t.kind == Kind.CPU_OP)
    rows = np.flatnonzero(p2p_op | (t.name_mask(lambda s: s in P2P_SPANS) & t.mask(Kind.CPU_OP, Kind.ANNOTATION)))
    rows = rows[iv.lengths_in_windows(in_steps, t.ts_ns[rows], t.end_ns[rows]) > 0] if rows.size else rows
    if rows.size == 0:
        return P2PWaits()
    busy_rows = np.flatnonzero((t.kind == Kind.CPU_OP) & (t.thread == main) & ~p2p_op)
    idle = iv.subtract(in_steps, iv.merge(t.ts_ns[busy_rows], t.end_ns[busy_rows]))
    end = t.end_ns[rows]
    lo = _wait_start(idle, t.ts_ns[rows], end)
    keep = end > lo
    group, peer, sure = _host_facts(rt, rows)
    return P2PWaits(group=group, peer=peer, sure=sure, wait_op=np.flatnonzero(keep).astype(np.int32),
                    wait_lo=lo[keep], wait_hi=end[keep])


def _wait_start(idle: iv.Intervals, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per span, where its wait began: the start of the idle gap holding its end (not before the
    span's own start); the end itself where the thread was busy then (nothing waited for it)."""
    if idle[0].size == 0:
        return end.copy()
    g = np.searchsorted(idle[0], end, side="right") - 1
    gi = np.maximum(g, 0)
    inside = (g >= 0) & (end <= idle[1][gi])
    return np.where(inside, np.maximum(idle[0][gi], start), end)


def gpu_waits(rc: RankComms) -> P2PWaits:
    """GPU traces: each p2p kernel's time not under compute (its group and label axis as the
    kernel's args and launching host ops say; the peer is not recorded on kernels)."""
    # A collective over the pipeline group (a gradient-norm all-reduce) is no wait on a neighbour.
    p2p = np.isin(rc.coll, np.asarray(P2P_COLLS, np.int8))
    pick = np.flatnonzero(p2p | ((rc.coll == Coll.UNKNOWN) & (rc.axis == PP_AXIS)))
    op, lo, hi = _outside(rc.compute, rc.start_ns[pick], rc.start_ns[pick] + rc.dur_ns[pick])
    return P2PWaits(group=[rc.group[i] for i in pick.tolist()], peer=np.full(pick.size, -1, np.int32),
                    sure=rc.axis[pick] == PP_AXIS, wait_op=op, wait_lo=lo, wait_hi=hi)


def _outside(busy: iv.Intervals, start: np.ndarray, end: np.ndarray):
    """(op, lo, hi): the pieces of each [start, end) not covered by the merged set `busy`."""
    big = np.iinfo(np.int64).max
    gap_lo = np.concatenate([[-big], busy[1]]).astype(np.int64)
    gap_hi = np.concatenate([busy[0], [big]]).astype(np.int64)
    first = np.searchsorted(gap_hi, start, side="right")          # first gap ending after the start
    count = np.maximum(np.searchsorted(gap_lo, end, side="left") - first, 0)
    op = np.repeat(np.arange(start.size, dtype=np.int32), count)
    # each piece's gap: its op's first gap plus the piece's place among that op's pieces
    gap = np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
    lo, hi = np.maximum(gap_lo[gap], start[op]), np.minimum(gap_hi[gap], end[op])
    keep = hi > lo
    return op[keep], lo[keep], hi[keep]
