"""A rank's pipeline actions as its trace shows them: each forward and backward, of which stage
and micro-batch, and where on the rank's timeline it ran.

Problem: the schedule, m and v that the bubble's ideal needs, and the F3 / B3 labels of the
Gantt's bars, are stated by no trace from torchtitan or Megatron-LM. What a trace can show,
read here per rank (strongest first):

1. torch.distributed.pipelining's runtime schedules (Interleaved1F1B, LoopedBFS,
   InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) wrap every action in
   `record_function("PP:<action>")`: `PP:2F0` is stage 2's forward of micro-batch 0, `B` a full
   backward, `I` / `W` the split backward (input / weight) of the zero-bubble schedules,
   `PP:(0F1;1B0)OVERLAP_F_B` DualPipeV's overlapped pair; `SEND_F`, `RECV_B`, ... post transfers.
2. ScheduleGPipe wraps each micro-batch in `Forward i` / `Backward i` (no stage index).
3. Schedule1F1B (torch 2.13) and Megatron-LM write nothing a torch.profiler trace keeps
   (Megatron's ranges are NVTX, off by default and not recorded by Kineto). Then the order comes
   from the compute itself: a backward is a run of autograd nodes
   (`autograd::engine::evaluate_function`), a forward a run of matrix multiplies outside them,
   and a point-to-point op or a change of kind separates one micro-batch from the next.

An action's span is its annotation's (or its run's) on a host timeline; on a GPU, the span of
the compute kernels launched inside it. The job-level reading is ppschedule.
"""
from __future__ import annotations

import re
from dataclasses import field
from typing import Optional

import numpy as np

from ..trace.columns import distinct
from ..trace.commtable import HOST_COMM_RE, P2P_OPS
from ..trace.kinds import Kind
from ..trace.table import RankTrace
from . import intervals as iv
from .collectives import RankComms
from .hostlink import kernel_spans
from .ppwaits import P2P_SPANS, P2PWaits, gpu_waits, host_waits, main_thread
from .results import ActionGaps
from .steps import Window, _step_of
from ..record import record

ACTIONS = ("F", "B", "I", "W")          # forward, full backward, backward input, backward weight
KIND = {k: i for i, k in enumerate(ACTIONS)}
_ACTION = r"(\d+)(F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)(\d*)"
_PP_RE = re.compile(r"^PP:" + _ACTION + "$")
_ONE_RE = re.compile(_ACTION + "$")
_OVERLAP_RE = re.compile(r"^PP:\((.*)\)OVERLAP_F_B$")
_GPIPE_RE = re.compile(r"^(Forward|Backward) (\d+)$")
_BACKWARD = "autograd::engine::evaluate_function"
SINGLE_STAGE = ("1f1b", "gpipe")          # schedules of one model chunk per rank
_GEMMS = frozenset({"aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm", "aten::baddbmm"})

SOURCES = {
    "pp": "the trace's PP:<action> annotations of torch.distributed.pipelining",
    "gpipe": "the trace's Forward i / Backward i annotations of torch.distributed.pipelining's GPipe",
    "compute": "the order of forward and backward compute between pipeline sends/receives, the trace "
               "having no schedule annotations",
}


def _ints(dtype) -> np.ndarray:
    return np.zeros(0, dtype)


@record
class PPTrace:
    """What one rank's trace shows of its pipeline (plain data: it travels in the rank summary)."""

    source: str = ""                  # a key of SOURCES; "" when nothing was read
    overlapped: int = 0               # DualPipeV's OVERLAP_F_B actions seen
    act_step: np.ndarray = field(default_factory=lambda: _ints(np.int64))   # ProfilerStep number
    act_stage: np.ndarray = field(default_factory=lambda: _ints(np.int32))  # named stage, -1 none
    act_kind: np.ndarray = field(default_factory=lambda: _ints(np.int8))    # index into ACTIONS
    act_mb: np.ndarray = field(default_factory=lambda: _ints(np.int32))     # micro-batch, -1 unknown
    # where each action ran, ns on the rank's timeline (the Gantt's clock): the annotation's span
    # on a host timeline, the span of the compute kernels launched inside it on a GPU; -1 unknown
    act_start_ns: np.ndarray = field(default_factory=lambda: _ints(np.int64))
    act_end_ns: np.ndarray = field(default_factory=lambda: _ints(np.int64))
    p2p: P2PWaits = field(default_factory=P2PWaits)
    # each transfer's post on the main thread (_posts): its ProfilerStep number and host span, ns
    post_step: np.ndarray = field(default_factory=lambda: _ints(np.int64))
    post_ns: np.ndarray = field(default_factory=lambda: _ints(np.int64))

    def step_order(self, step: int) -> list[str]:
        """One step's compute actions as torch names them: '2F0' (stage 2, forward, micro-batch 0),
        'F0' where no stage is named."""
        sel = self.act_step == step
        cols = (self.act_stage[sel].tolist(), self.act_kind[sel].tolist(), self.act_mb[sel].tolist())
        return [(f"{s}" if s >= 0 else "") + ACTIONS[k] + (f"{m}" if m >= 0 else "") for s, k, m in zip(*cols)]

    def labels(self, schedule: Optional[str]) -> list[Optional[str]]:
        """Each action as the Gantt labels it: 'F3' (forward of micro-batch 3; B, I, W alike), 'F3.1'
        on a rank that holds several stages (.1: its second model chunk, its stages in order); None
        where the micro-batch is unknown. Micro-batches numbered from the compute's order are known
        only when the job's schedule (`schedule`, diag's name) runs them in order: 1F1B or GPipe."""
        if self.source == "compute" and schedule not in SINGLE_STAGE:
            return [None] * self.act_kind.size
        held = sorted(set(self.act_stage[self.act_stage >= 0].tolist()))
        chunk = {s: i for i, s in enumerate(held)} if len(held) > 1 else {}
        cols = (self.act_stage.tolist(), self.act_kind.tolist(), self.act_mb.tolist())
        return [None if m < 0 else f"{ACTIONS[k]}{m}" + (f".{chunk[s]}" if s in chunk else "")
                for s, k, m in zip(*cols)]


def _parse(name: str) -> Optional[list[tuple[int, int, int]]]:
    """(stage, kind, micro-batch) of the compute actions an annotation names; [] for a pipelining
    annotation that computes nothing (a transfer's post); None for any other name."""
    m = _GPIPE_RE.match(name)
    if m:
        return [(-1, KIND["F" if m.group(1) == "Forward" else "B"], int(m.group(2)))]
    m = _OVERLAP_RE.match(name)
    parts = [_ONE_RE.match(p.strip()) for p in m.group(1).split(";")] if m else [_PP_RE.match(name)]
    if not all(parts):
        return None
    return [(int(p.group(1)), KIND[p.group(2)], int(p.group(3)) if p.group(3) else -1)
            for p in parts if p.group(2) in KIND]


def _annotated(t, steps_of) -> Optional[tuple]:
    """Actions from pipelining annotations: (source, overlapped, columns), or None; columns as _columns."""
    parsed = {i: acts for i, n in enumerate(t.symbols.names) if (acts := _parse(n)) is not None}
    rows = np.flatnonzero(np.isin(t.name_id, list(parsed)) & t.mask(Kind.CPU_OP, Kind.ANNOTATION)) if parsed else []
    if len(rows) == 0:
        return None
    rows = rows[np.argsort(t.ts_ns[rows], kind="stable")]
    step = steps_of(t.ts_ns[rows])
    acts = [(s, *a, int(t.ts_ns[r]), int(t.end_ns[r]))
            for r, s in zip(rows.tolist(), step.tolist()) if s >= 0 for a in parsed[int(t.name_id[r])]]
    names = {int(i): t.symbols[int(i)] for i in distinct(t.name_id[rows])}
    gpipe = all(_GPIPE_RE.match(n) for n in names.values())
    overlapped = int(np.isin(t.name_id[rows], [i for i, n in names.items() if n.endswith("OVERLAP_F_B")]).sum())
    return "gpipe" if gpipe else "pp", overlapped, _columns(acts)


def _posts(t, steps_of, main: int) -> tuple[np.ndarray, np.ndarray]:
    """(step, host span ns) of each transfer's post on the rank's main thread in the window's steps: the
    innermost point-to-point op (c10d::send, c10d::recv_: the call that hands the transfer to the backend;
    an op around another one, as a Python dispatch mode's re-dispatch of it, is left out), its host span
    the thread's time to post it, not the transfer (which the backend runs) nor the wait for it."""
    rows = np.flatnonzero(t.name_mask(lambda s: s in P2P_OPS) & (t.kind == Kind.CPU_OP) & (t.thread == main))
    rows = rows[np.lexsort((-t.end_ns[rows], t.ts_ns[rows]))]       # by start; of two starting together, the outer first
    inner = np.ones(rows.size, bool)
    inner[:-1] = t.ts_ns[rows[1:]] >= t.end_ns[rows[:-1]]      # the next op starts inside: this one wraps it
    rows = rows[inner]
    step = steps_of(t.ts_ns[rows])
    keep = step >= 0
    return step[keep].astype(np.int64), (t.end_ns[rows[keep]] - t.ts_ns[rows[keep]]).astype(np.int64)


_DTYPES = (np.int64, np.int32, np.int8, np.int32, np.int64, np.int64)


def _columns(acts: list[tuple]) -> tuple:
    """(step, stage, kind, micro-batch, host start, host end) arrays of the actions."""
    cols = list(zip(*acts)) if acts else [()] * len(_DTYPES)
    return tuple(np.array(c, d) for c, d in zip(cols, _DTYPES))


def _tokens(t, main: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, token, end) in time order: 0 a forward's matrix multiply (main thread, outside
    autograd nodes and the optimizer), 1 a run of autograd nodes, 2 a point-to-point op."""
    host = t.mask(Kind.CPU_OP, Kind.ANNOTATION)
    bwd = np.flatnonzero(t.name_mask(lambda s: s.startswith(_BACKWARD)) & host)
    b_set = iv.merge(t.ts_ns[bwd], t.end_ns[bwd])
    opt = np.flatnonzero(t.name_mask(lambda s: s.startswith("Optimizer.")) & host)
    gemm = np.flatnonzero(t.name_mask(lambda s: s in _GEMMS) & (t.kind == Kind.CPU_OP) & (t.thread == main))
    outside = iv.union(b_set, (t.ts_ns[opt], t.end_ns[opt]))
    fwd = gemm[iv.lengths_in_windows(outside, t.ts_ns[gemm], t.ts_ns[gemm] + 1) == 0]
    p2p = np.flatnonzero(t.name_mask(lambda s: s in P2P_OPS) & (t.kind == Kind.CPU_OP))
    at = np.concatenate([t.ts_ns[fwd], b_set[0], t.ts_ns[p2p]])
    end = np.concatenate([t.end_ns[fwd], b_set[1], t.end_ns[p2p]])
    token = np.repeat(np.arange(3, dtype=np.int8), [fwd.size, b_set[0].size, p2p.size])
    order = np.lexsort((token, at))
    return at[order], token[order], end[order]


def _from_compute(t, steps_of, main: int) -> tuple:
    """Actions from the compute's order (no annotations): a run of forward tokens is a forward,
    a run of autograd nodes a backward; a point-to-point op, a change of kind or of step ends a
    run. Micro-batches are numbered in order, as 1F1B and GPipe run them (the Gantt labels them
    only where the stages' orders are such a schedule's). A run spans from its first op's start
    to the latest end of its ops."""
    at, token, end = _tokens(t, main)
    if at.size == 0:
        return "compute", 0, _columns([])
    step = steps_of(at)
    new_run = np.concatenate([[True], (token[1:] != token[:-1]) | (step[1:] != step[:-1])])
    run_end = np.maximum.reduceat(end, np.flatnonzero(new_run))
    keep = ((token < 2) & (step >= 0))[new_run]          # of the runs: actions in analysed steps
    kind, step = token[new_run][keep], step[new_run][keep]
    return "compute", 0, (step.astype(np.int64), np.full(kind.size, -1, np.int32), kind.astype(np.int8),
                          _number_in_order(step, kind), at[new_run][keep], run_end[keep])


def _number_in_order(step: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... per (step, kind), in order of appearance."""
    key = step * 2 + kind
    order = np.argsort(key, kind="stable")
    first = np.searchsorted(key[order], key[order], side="left")
    out = np.empty(key.size, np.int32)
    out[order] = np.arange(key.size) - first
    return out


def read_rank(rt: RankTrace, w: Window, timeline: str, rc: RankComms) -> PPTrace:
    """The per-rank pass's reading of the pipeline: its actions and its point-to-point waits."""
    t = rt.events
    in_window = distinct(w.step_index[w.step_index >= 0])

    def steps_of(times: np.ndarray) -> np.ndarray:       # ProfilerStep number of in-window times, -1
        i = _step_of(w.steps, times)
        if len(w.steps) == 0:
            return i
        return np.where(np.isin(i, in_window), w.steps.number[np.maximum(i, 0)], -1)

    main = main_thread(t, np.flatnonzero(t.name_mask(lambda s: s.startswith("ProfilerStep"))
                                         & t.mask(Kind.CPU_OP, Kind.ANNOTATION)))
    source, overlapped, (step, stage, kind, mb, start, end) = \
        _annotated(t, steps_of) or _from_compute(t, steps_of, main)
    post_step, post_ns = _posts(t, steps_of, main)
    if step.size == 0:
        source = ""
    if timeline == "gpu":
        start, end = kernel_spans(t, w.rows[t.kind[w.rows] == Kind.COMPUTE], start, end)
    waits = gpu_waits(rc) if timeline == "gpu" else host_waits(rt, w, in_window, main)
    return PPTrace(source=source, overlapped=overlapped, act_step=step, act_stage=stage, act_kind=kind,
                   act_mb=mb, act_start_ns=start, act_end_ns=end, p2p=waits, post_step=post_step, post_ns=post_ns)


def host_gap_busy(t, rows: np.ndarray, busy: iv.Intervals, pp: PPTrace) -> iv.Intervals:
    """What covers the time between two actions on a host timeline: the rank's timeline (`busy`: every
    op, and the communication in it) less the transfers in flight, and the thread's waits for them. A
    send or receive gloo runs (`gloo:send`, `gloo:recv`) is recorded from its post until its wait
    returns: while one is outstanding the runtime's Python goes on beside it, and torch's multi-stage
    runtime leaves one outstanding across nearly every gap (read as busy, its gaps measured ~0.02 ms
    where the thread's own time there is ~0.3 ms: benchmarks/README.md). The wait for a transfer's data
    (P2PWaits) is the neighbour's time, not the runtime's, and stays busy. `rows`: the window's."""
    comm = rows[t.name_mask(lambda s: HOST_COMM_RE.match(s) is not None and s not in P2P_SPANS)[rows]]
    spans = rows[t.name_mask(lambda s: s in P2P_SPANS)[rows]]
    if spans.size == 0:
        return busy
    ops = rows[t.kind[rows] == Kind.CPU_OP]
    kept = iv.union(iv.merge(t.ts_ns[ops], t.end_ns[ops]), iv.merge(t.ts_ns[comm], t.end_ns[comm]))
    return iv.union(iv.intersect(busy, kept), iv.merge(pp.p2p.wait_lo, pp.p2p.wait_hi))


def action_gaps(pp: PPTrace, busy: iv.Intervals, timeline: Optional[iv.Intervals] = None) -> Optional[ActionGaps]:
    """The idle between consecutive actions of each step (results.ActionGaps): from the latest end of
    the step's actions so far to the next one's start, less what `busy` covers there (on a GPU every
    kernel, copy and set; on a host timeline host_gap_busy). `timeline`: the breakdown's busy set (every op
    and communication span), where it covers more than `busy` (a transfer in flight): the idle it leaves
    out is counted apart (in_flight_s). Actions of unknown span are left out; None where no step has two
    actions. The transfers posted in those steps are counted, with their median host span."""
    known = (pp.act_start_ns >= 0) & (pp.act_end_ns >= 0)
    lo, hi = [], []
    for s in distinct(pp.act_step[known]).tolist():
        sel = known & (pp.act_step == s)
        order = np.argsort(pp.act_start_ns[sel], kind="stable")
        start, end = pp.act_start_ns[sel][order], pp.act_end_ns[sel][order]
        lo.append(np.maximum.accumulate(end)[:-1])
        hi.append(start[1:])
    lo, hi = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (lo, hi))
    if lo.size == 0:
        return None
    hi = np.maximum(hi, lo)
    idle = float(np.clip((hi - lo) - iv.lengths_in_windows(busy, lo, hi), 0, None).sum())
    shown = idle if timeline is None else float(np.clip((hi - lo) - iv.lengths_in_windows(timeline, lo, hi),
                                                        0, None).sum())
    posts = pp.post_ns[np.isin(pp.post_step, pp.act_step[known])]      # in the steps whose gaps are read
    return ActionGaps(idle_s=idle * 1e-9, in_flight_s=max(idle - shown, 0.0) * 1e-9, gaps=int(lo.size),
                      actions=int(known.sum()), posts=int(posts.size),
                      post_median_s=float(np.median(posts)) * 1e-9 if posts.size else None)
