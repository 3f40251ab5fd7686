"""What a host (CPU) timeline's operators cost apart from their data work.

Problem: on a CPU-only run the "compute" of a step is the host's operators themselves, and each
of them pays a fixed cost (dispatch, autograd bookkeeping, the profiler's own record) whatever
the size of its tensors. The step-time model scales compute with the micro-batch size; without
this fixed part it underprices every change that adds or removes operators (fewer, larger
micro-batches; dropping DTensor's tensor parallelism). Counted here, per rank, from its trace:

- the operators per step, and those inside `Optimizer.*` spans (torch.optim's profiler marks:
  paid once per step, not per micro-batch);
- the fixed cost of those outside the optimizer: ATen operators x the median self time of an ATen
  operator (its duration less its nested operators'; most ATen calls of a step are views,
  allocations and wrappers whose work is done by their children, so the median is what a call
  costs when it does little data work), plus the self time of the non-ATen operators (autograd
  nodes and engine calls, Python dispatch, DTensor's wrappers: their data work runs in the ATen
  calls nested in them, so what is left is fixed cost per call), as the sum of their self times.
  Not calls x each name's median (until 2026-11-27): their self times are skewed and often
  bimodal (DTensor's `Redistribute` 14 us at the 25th percentile, 85 at the median, 118 at the
  90th; `_FromTorchTensorBackward` 8, 10, 172 us), so the median left a third of them in the
  compute that scales, which TP 1 then paid twice over. A call the OS preempted does hold the
  lost time, but so does every other operator of that step: on a loaded machine (load ~5 on 2
  cores, the step 2.8x) the sum kept the fixed cost's share of the compute (47% against 55%
  quiet) where the medians let it fall from 36% to 15%;
- of that, DTensor's dispatch layer: when the trace has DTensor's marks (rankpass.DTENSOR_RE),
  the self time of its wrappers and of the subclass dispatch it runs in (DTENSOR_COST_RE), which
  a run without DTensor does not pay;
- and apart, Python dispatch modes (`PythonDispatchMode`: a TorchDispatchMode's Python call
  around each op it sees), paid at any TP while the mode is on. Until 2026-11-25 they were
  counted as DTensor's; in the traces at hand they were all the diag trainer's comm tap, which
  runs only in the profiled steps (calibrate leaves it out when diag_run.json says so).

- FSDP2's own host time, when the trace has its marks (`FSDP::pre_forward`, `FSDP::all_gather`,
  `FSDP::post_backward_reduce`, ... and its `fsdp::` copy operators: torch >= 2.4's
  `torch.distributed.fsdp.fully_shard`, which wraps only its own work in them, never the module's
  compute): the time its spans cover, less the time they hold the thread in communication (priced
  as traffic by the step-time model, at the DP axis's exposed time where that is more): inside the
  collectives' calls, and waiting for a collective that gloo runs on its worker thread
  (fsdp_waits: the breakdown counts those waits as communication, not compute); and DTensor's
  dispatch inside the optimizer's spans (FSDP2's sharded parameters are DTensors; a replicated
  run's optimizer steps plain tensors). The operators inside
  FSDP's spans are left out of the fixed cost above, which a run without FSDP still pays, and so is
  the time of FSDP's spans nested in a non-ATen operator (an autograd node whose hook unshards the
  layer for its backward: until 2026-11-28 its self time held them, wait included).
  FSDP1 (`FullyShardedDataParallel.*` marks, which enclose the module's forward) is not counted.

GPU timelines get none of this: there the fixed host cost per kernel shows as device idle, which
the step-time model already carries as its launch overhead.
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np

from ..trace.columns import distinct, median
from ..trace.commtable import HOST_COMM_RE
from ..trace.kinds import Kind
from ..trace.table import EventTable
from .intervals import intersect, length, lengths_in_windows, merge, subtract, union
from .results import HostOps
from .steps import Window

OPTIMIZER_RE = re.compile(r"^Optimizer\.")
FSDP_RE = re.compile(r"^(FSDP::|fsdp::)")      # FSDP2's record_function marks and its custom copy operators
ATEN_RE = re.compile(r"^aten::")
DTENSOR_COST_RE = re.compile(r"^(Redistribute|NestedRedistribute|PythonSubclass|RedistributeBackward|"
                             r"_FromTorchTensor|_ToTorchTensor|_FromTorchTensorBackward|_ToTorchTensorBackward)$")
# A TorchDispatchMode's Python call around each op it sees (CommDebugMode, FlopCounterMode, the diag
# trainer's comm tap): not DTensor's (DTensor dispatches as a subclass), and paid at any TP
MODE_RE = re.compile(r"^PythonDispatchMode$")


def nesting_parent(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per interval (one thread's calls, properly nested), the index of the innermost interval
    enclosing it, -1 at the top level. Vectorised per nesting depth."""
    n = start.size
    parent = np.full(n, -1, np.int64)
    if n == 0:
        return parent
    order = np.lexsort((-end, start))
    s, e = start[order], end[order]
    closed = np.searchsorted(np.sort(e), s, side="right")       # calls ended by each start
    depth = np.arange(n) - closed
    depth = np.maximum(depth, 0)
    for d in range(1, int(depth.max()) + 1):
        here, above = np.flatnonzero(depth == d), np.flatnonzero(depth == d - 1)
        k = np.searchsorted(above, here, side="right") - 1       # last enclosing call opened before
        ok = k >= 0
        parent[order[here[ok]]] = order[above[k[ok]]]
    return parent


def self_times_ns(t: EventTable, rows: np.ndarray, less: Optional[dict] = None) -> np.ndarray:
    """Each call's duration less the durations of the calls nested directly in it (per thread).
    `less` ({thread: merged intervals}): the time they cover on the call's thread outside its nested
    calls is taken out of its self time too (a nested call loses its own share): an autograd node
    whose hook runs FSDP2's `FSDP::pre_backward` holds that span's time, which is FSDP's, not the
    node's."""
    out = t.dur_ns[rows].astype(np.int64).copy()
    for th in distinct(t.thread[rows]):
        idx = np.flatnonzero(t.thread[rows] == th)
        r = rows[idx]
        parent = nesting_parent(t.ts_ns[r], t.end_ns[r])
        has = parent >= 0
        np.subtract.at(out, idx[parent[has]], t.dur_ns[r[has]])
        cover = (less or {}).get(th)
        if cover is not None and cover[0].size:
            covered = lengths_in_windows(cover, t.ts_ns[r], t.end_ns[r])
            out[idx] -= covered
            np.add.at(out, idx[parent[has]], covered[has])
    return np.maximum(out, 0)


def _inside(t: EventTable, rows: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Which of `rows` start inside one of `spans` (rows of annotations) on the same thread."""
    inside = np.zeros(rows.size, bool)
    for th in distinct(t.thread[spans]):
        sp = spans[t.thread[spans] == th]
        mine = t.thread[rows] == th
        lo = np.sort(t.ts_ns[sp])
        hi = t.end_ns[sp][np.argsort(t.ts_ns[sp])]
        reach = np.maximum.accumulate(hi)
        k = np.searchsorted(lo, t.ts_ns[rows[mine]], side="right") - 1
        inside[mine] = (k >= 0) & (t.ts_ns[rows[mine]] < reach[np.maximum(k, 0)])
    return inside


def self_sum_ns(selfs: np.ndarray, mask: np.ndarray) -> float:
    """The self times (ns) of the calls `mask` selects, added up."""
    return float(selfs[mask].sum(dtype=np.float64))


def host_ops(t: EventTable, w: Window, dtensor_re: re.Pattern) -> Optional[HostOps]:
    """Operator counts and fixed costs of a host timeline's window; None without operators."""
    in_step = w.step_index >= 0
    steps = len(set(w.step_index[in_step].tolist())) or 1
    rows = w.rows[in_step]
    calls = rows[t.kind[rows] == Kind.CPU_OP]
    if calls.size == 0:
        return None
    selfs = self_times_ns(t, calls)                   # communication calls nested in ops subtracted too
    work = ~t.name_mask(HOST_COMM_RE.match)[calls]
    spans = rows[np.isin(t.kind[rows], (Kind.ANNOTATION, Kind.CPU_OP))]
    optimizer = spans[t.name_mask(OPTIMIZER_RE.match)[spans]]
    in_opt = _inside(t, calls, optimizer) if optimizer.size else np.zeros(calls.size, bool)
    fsdp = spans[t.name_mask(FSDP_RE.match)[spans]]
    in_fsdp = _inside(t, calls, fsdp) if fsdp.size else np.zeros(calls.size, bool)
    aten = work & t.name_mask(ATEN_RE.match)[calls]
    framework = work & ~aten & ~in_opt & ~in_fsdp
    held = _fsdp_time(t, rows, fsdp) if fsdp.size else {}
    if held:                                          # FSDP's spans inside a framework call are FSDP's
        selfs = np.where(framework, self_times_ns(t, calls, {th: c for th, (c, _) in held.items()}), selfs)
    dispatch = t.name_mask(DTENSOR_COST_RE.match)[calls]
    dtensor = framework & dispatch if t.name_mask(dtensor_re.match)[rows].any() else np.zeros(calls.size, bool)
    mode = t.name_mask(MODE_RE.match)[calls]
    fsdp_s = opt_dispatch_s = fsdp_mode_s = fsdp_comm_mode_s = None
    if held:
        fsdp_s = sum(length(c) - length(b) for c, b in held.values()) * 1e-9 / steps
        modes = work & in_fsdp & ~in_opt & mode       # a dispatch mode's calls inside FSDP's spans
        free = self_sum_ns(self_times_ns(t, calls, {th: b for th, (_, b) in held.items()}), modes)
        fsdp_mode_s, fsdp_comm_mode_s = free * 1e-9 / steps, (self_sum_ns(selfs, modes) - free) * 1e-9 / steps
        opt_dispatch_s = self_sum_ns(selfs, work & in_opt & dispatch) * 1e-9 / steps
    return HostOps(
        ops_per_step=float(work.sum()) / steps,
        optimizer_ops_per_step=float((work & in_opt).sum()) / steps,
        aten_ops_per_step=float((aten & ~in_opt & ~in_fsdp).sum()) / steps,
        aten_op_s=float(median(selfs[aten])) * 1e-9 if aten.any() else 0.0,
        framework_per_step_s=self_sum_ns(selfs, framework) * 1e-9 / steps,
        dtensor_per_step_s=self_sum_ns(selfs, dtensor) * 1e-9 / steps,
        dispatch_mode_per_step_s=self_sum_ns(selfs, framework & mode) * 1e-9 / steps,
        fsdp_per_step_s=fsdp_s, fsdp_optimizer_dispatch_per_step_s=opt_dispatch_s,
        fsdp_dispatch_mode_per_step_s=fsdp_mode_s, fsdp_comm_dispatch_mode_per_step_s=fsdp_comm_mode_s)


def _comm_rows(t: EventTable, rows: np.ndarray) -> np.ndarray:
    return rows[t.name_mask(HOST_COMM_RE.match)[rows] | (t.kind[rows] == Kind.COMM)]


def fsdp_waits(t: EventTable, rows: np.ndarray, fsdp: Optional[np.ndarray] = None) -> dict:
    """{thread: (the time FSDP2's spans among `rows` cover on it, where in that time it waits for a
    collective)}, merged intervals; empty without FSDP2's marks. A wait: a collective runs on another
    thread of the rank (gloo runs FSDP2's all-gathers and reduce-scatters on its worker threads)
    while no operator of FSDP's own (one that starts inside its spans) runs on this one: the thread
    is in `Work.wait`, which records no operator, inside FSDP's span, and inside whatever operator
    encloses that span (an autograd node whose hook unshards the layer for its backward). `fsdp`:
    the FSDP spans among `rows`, where the caller has them."""
    if fsdp is None:
        spans = rows[np.isin(t.kind[rows], (Kind.ANNOTATION, Kind.CPU_OP))]
        fsdp = spans[t.name_mask(FSDP_RE.match)[spans]]
    if fsdp.size == 0:
        return {}
    comm = _comm_rows(t, rows)
    calls = np.setdiff1d(rows[t.kind[rows] == Kind.CPU_OP], comm)
    out = {}
    for th in distinct(t.thread[fsdp]).tolist():
        sp, elsewhere, mine = fsdp[t.thread[fsdp] == th], comm[t.thread[comm] != th], calls[t.thread[calls] == th]
        cover = merge(t.ts_ns[sp], t.end_ns[sp])
        own = mine[_inside(t, mine, sp)]
        running = subtract(merge(t.ts_ns[elsewhere], t.end_ns[elsewhere]), merge(t.ts_ns[own], t.end_ns[own]))
        out[th] = (cover, intersect(cover, running))
    return out


def _fsdp_time(t: EventTable, rows: np.ndarray, fsdp: np.ndarray) -> dict:
    """{thread: (the time FSDP's spans cover on it, where in it the thread is blocked in communication:
    inside a collective's call, or waiting for one that runs on another thread (fsdp_waits))}, merged
    intervals. FSDP's own time is the first less the second; the step-time model prices the second as
    ZeRO's traffic."""
    comm = _comm_rows(t, rows)
    out = {}
    for th, (cover, waits) in fsdp_waits(t, rows, fsdp).items():
        cm = comm[t.thread[comm] == th]
        out[th] = (cover, intersect(cover, union((t.ts_ns[cm], t.end_ns[cm]), waits)))
    return out
