"""One training step of every pipeline stage, reconstructed from the trace as segments.

Problem: a bubble percentage says how much a stage waits, not when or why. Drawing one
step of each stage as forward / backward / optimizer compute, pipeline send/recv and idle
shows the schedule as it ran: the warm-up and cool-down gaps of 1F1B, a stage that
computes longer than its neighbours, a receive that waits for a late stage.

Per rank and step, each instant of the step goes to the first of: compute (backward when
it runs inside an `autograd::engine::evaluate_function` span, or on a GPU was launched
from one; optimizer inside `Optimizer.step`; else forward) > pipeline send/recv > other
communication (TP/DP collectives) > idle. Communication under compute is hidden, so only
exposed communication shows. Times are seconds from the step's start on the rank's own
clock (hosts' clocks are not aligned, so stages are not placed on a shared axis).

Forward and backward compute inside a pipeline action's span (ppactions: `PP:2F3`, `Forward 3`,
or a run of forward / backward compute in a 1F1B or GPipe order) is labelled with the action,
`F3` / `B3` (`F3.1`: the rank's second model chunk); compute outside every action, and actions
whose micro-batch cannot be read, stay unlabelled.
"""
from __future__ import annotations

from dataclasses import field
from typing import Optional

import numpy as np

from ..trace.columns import distinct
from ..trace.kinds import Coll
from ..trace.table import RankTrace
from . import intervals as iv
from .breakdown import timeline_sets
from .collectives import AXES, RankComms, attribute_axes, gpu_comms, host_comms
from .layoutfind import JobLayout
from .backward import backward_compute
from .ppactions import SINGLE_STAGE, SOURCES, PPTrace, read_rank
from .steps import Window, window_of, work_spans
from ..record import record

KINDS = ("forward", "backward", "optimizer", "send/recv", "collective", "idle")
_OPTIMIZER = "Optimizer.step"
_P2P = (Coll.SEND, Coll.RECV, Coll.SEND_RECV)
NS = 1e-9


@record
class Segment:
    """One span of a stage's step in the pipeline chart."""

    kind: str                          # one of KINDS
    start_s: float                     # from the step's start
    end_s: float
    label: Optional[str] = None        # the pipeline action it runs ("F3", "B3", "F3.1"), None: not known


@record
class StageStep:
    """One step of one rank, as consecutive segments covering [0, step_s)."""

    rank: int
    stage: Optional[int]               # pp rank; None when the grid is unknown
    step: int                          # N of ProfilerStep#N
    step_s: float
    segments: list[Segment] = field(default_factory=list)
    start_us: Optional[float] = None   # the step's start on the rank's own trace clock (the file's ts, us)

    def total(self, kind: str) -> float:
        return sum(s.end_s - s.start_s for s in self.segments if s.kind == kind)


@record
class PipelineGantt:
    """The pipeline chart: one row per stage and step."""

    timeline: str                      # "gpu" | "host"
    rows: list[StageStep] = field(default_factory=list)
    # the same step of every other rank of each stage (tp/dp > 0): a viewer may show any rank of
    # a stage in place of its row
    others: list[StageStep] = field(default_factory=list)
    note: str = ("one rank per stage (tp 0, dp 0), the same ProfilerStep on each; times from each rank's "
                 "own step start; communication under compute is hidden and not drawn; idle gaps under "
                 "0.2% of the step drawn as their neighbours")
    labels: str = ""                   # where the bars' action labels come from, or why there are none

    def stage_ranks(self, stage: Optional[int]) -> int:
        """How many ranks of a stage are drawn here: its row (one rank, whichever a viewer shows) and
        the others."""
        return 1 + sum(r.stage == stage for r in self.others)


def _compute_parts(rt: RankTrace, w: Window, timeline: str, compute: iv.Intervals) -> dict:
    """forward / backward / optimizer interval sets that together make up `compute`."""
    bwd = backward_compute(rt, w, timeline, compute)
    opt = iv.subtract(backward_compute(rt, w, timeline, compute, lambda s: s.startswith(_OPTIMIZER)), bwd)
    return {"backward": bwd, "optimizer": opt, "forward": iv.subtract(compute, iv.union(bwd, opt))}


def _comm_parts(rc: RankComms, compute: iv.Intervals) -> dict:
    """Exposed pipeline send/recv and exposed other communication."""
    p2p = np.isin(rc.coll, np.asarray(_P2P, np.int8)) | (rc.axis == AXES.index("pp"))
    end = rc.start_ns + rc.dur_ns
    pp = iv.subtract(iv.merge(rc.start_ns[p2p], end[p2p]), compute)
    other = iv.subtract(iv.subtract(iv.merge(rc.start_ns[~p2p], end[~p2p]), compute), pp)
    return {"send/recv": pp, "collective": other}


@record
class GanttInput:
    """What the Gantt needs of one rank, made by its per-rank pass (no grid needed, so a rank can
    summarise itself): its in-window steps and how its compute splits into forward / backward /
    optimizer. Communication comes from the rank's RankComms, attributed to axes at the merge."""

    timeline: str                      # "gpu" | "host"
    number: np.ndarray                 # in-window steps, in order: N of ProfilerStep#N
    host_ns: np.ndarray                # host span length of each (picks the median step)
    lo_ns: np.ndarray                  # [lo, hi) of each on the timeline
    hi_ns: np.ndarray
    backward: iv.Intervals = iv.EMPTY
    optimizer: iv.Intervals = iv.EMPTY


def gantt_input(rt: RankTrace, w: Window, timeline: str, compute: iv.Intervals) -> GanttInput:
    idx, lo, hi = work_spans(rt.events, w)
    if timeline == "host":                 # the host's ProfilerStep spans
        lo, hi = w.steps.start_ns[idx].astype(np.int64), w.steps.end_ns[idx].astype(np.int64)
    parts = _compute_parts(rt, w, timeline, compute) if idx.size else {}
    return GanttInput(timeline=timeline, number=w.steps.number[idx].astype(np.int64),
                      host_ns=(w.steps.end_ns[idx] - w.steps.start_ns[idx]).astype(np.int64),
                      lo_ns=lo, hi_ns=hi,
                      backward=parts.get("backward", iv.EMPTY), optimizer=parts.get("optimizer", iv.EMPTY))


def step_segments(parts: dict, lo: int, hi: int, min_idle_s: float) -> list[Segment]:
    """Disjoint interval sets by (kind, label) -> consecutive segments over [lo, hi), gaps as idle;
    then an idle gap shorter than min_idle_s between two segments of one kind and label joins them
    (host traces are gaps of microseconds between operators), and neighbours of one kind and label
    merge (the first's start, the last's end). A gap between two actions stays a gap: a label never
    reaches past its action. In numpy: a step has a thousand or so operators' segments, which two
    loops once turned into records one by one (~4 ms a rank of diagnose on a 10 MB trace, in the
    serial tail of `diag analyze`); tests/test_gantt.py keeps those loops as the reference."""
    keys: dict = {("idle", None): 0}
    xs, ys, ks = [], [], []
    for key, v in parts.items():
        a, b = iv.clip(v, lo, hi)
        xs.append(a)
        ys.append(b)
        ks.append(np.full(a.size, keys.setdefault(key, len(keys)), np.int64))
    x, y, k = (np.concatenate(c).astype(np.int64) if c else np.zeros(0, np.int64) for c in (xs, ys, ks))
    order = np.lexsort((y, x))                      # stable, as list.sort by (x, y)
    x, y, k = x[order], y[order], k[order]
    at = np.maximum.accumulate(np.concatenate([[lo], y]))  # at[i]: where the segments before item i end
    gap = x > at[:-1]
    # the sequence: before each item the idle gap it leaves (where it leaves one), then the item; a
    # last idle up to hi
    n = x.size + int(gap.sum())
    start, end, key = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.int64)
    pos = np.arange(x.size) + np.cumsum(gap)        # each item's place, after its gap
    start[pos], end[pos], key[pos] = x, y, k
    gp = pos[gap] - 1
    start[gp], end[gp] = at[:-1][gap], x[gap]
    if hi > at[-1]:
        start, end, key = np.append(start, at[-1]), np.append(end, hi), np.append(key, 0)
    start_s, end_s = (start - lo) * NS, (end - lo) * NS
    # coalesce: a short idle gap between two of one kind and label becomes theirs, then runs of
    # one kind and label merge (the first's start, the last's end)
    short = (key == 0) & (end_s - start_s < min_idle_s)
    short[[0, -1] if key.size else []] = False
    inner = np.flatnonzero(short[1:-1]) + 1
    take = inner[key[inner - 1] == key[inner + 1]]
    eff = key.copy()
    eff[take] = key[take - 1]
    first = np.flatnonzero(np.concatenate([[True], eff[1:] != eff[:-1]])) if eff.size else eff
    last = np.append(first[1:] - 1, eff.size - 1) if eff.size else eff
    names = list(keys)
    return [Segment(names[c][0], a, b, names[c][1]) for c, a, b in
            zip(eff[first].tolist(), start_s[first].tolist(), end_s[last].tolist())]


def action_spans(pp: Optional[PPTrace], step: int, lo: int, hi: int, schedule: Optional[str]) -> list[tuple]:
    """The step's labelled pipeline actions as (start, end, label) within [lo, hi), in time order;
    actions sharing one span (DualPipeV's overlapped forward and backward) share a label, 'F1+B0'."""
    if pp is None or pp.act_start_ns.size == 0:
        return []
    labels, spans = pp.labels(schedule), {}
    for i in np.flatnonzero((pp.act_step == step) & (pp.act_start_ns >= 0)).tolist():
        a, b = max(lo, int(pp.act_start_ns[i])), min(hi, int(pp.act_end_ns[i]))
        if labels[i] is not None and b > a:
            spans.setdefault((a, b), []).append(labels[i])
    return [(a, b, "+".join(names)) for (a, b), names in sorted(spans.items())]


def _labelled(parts: dict, spans: list[tuple]) -> dict:
    """kind -> intervals  =>  (kind, label) -> intervals: forward and backward compute cut at the
    actions' spans (an instant under two spans goes to the earlier), the rest unlabelled."""
    if not spans:
        return {(kind, None): v for kind, v in parts.items()}
    lo = np.array([a for a, _, _ in spans], np.int64)
    hi = np.array([b for _, b, _ in spans], np.int64)
    lo = np.maximum(lo, np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(hi)[:-1]]))
    keep = hi > lo                                   # disjoint now: a later span loses what an earlier holds
    lo, hi, labels = lo[keep], hi[keep], [sp[2] for sp, k in zip(spans, keep.tolist()) if k]
    cuts = np.concatenate([lo, hi])
    out = {}
    for kind, (s, e) in parts.items():
        if kind not in ("forward", "backward") or s.size == 0:
            out[(kind, None)] = (s, e)
            continue
        i = np.maximum(np.searchsorted(s, cuts, side="right") - 1, 0)
        inside = distinct(cuts[(s[i] < cuts) & (cuts < e[i])])          # cut points strictly inside an interval
        starts, ends = np.sort(np.concatenate([s, inside])), np.sort(np.concatenate([inside, e]))
        j = np.searchsorted(lo, starts, side="right") - 1
        held = (j >= 0) & (starts < hi[np.maximum(j, 0)])
        out[(kind, None)] = (starts[~held], ends[~held])
        for k in distinct(j[held]).tolist():
            sel = held & (j == k)
            out[(kind, labels[k])] = iv.union(out.get((kind, labels[k]), iv.EMPTY), (starts[sel], ends[sel]))
    return out


def step_row(gi: GanttInput, rc: RankComms, pp: Optional[PPTrace] = None, step: Optional[int] = None,
             grid: Optional[JobLayout] = None, min_idle_fraction: float = 0.0,
             schedule: Optional[str] = None) -> Optional[StageStep]:
    """One step of one rank as segments; step is a ProfilerStep number (default: the median-length
    step in the analysis window). None when the rank has no such step. rc: the rank's
    communication, attributed to axes with the grid; pp: its pipeline actions, which label the
    compute (see action_spans; schedule: the job's, diag's name). Idle gaps shorter than
    min_idle_fraction of the step are drawn as their neighbours (see coalesce)."""
    if gi.number.size == 0:
        return None
    if step is None:
        i = int(np.argsort(gi.host_ns, kind="stable")[(gi.number.size - 1) // 2])
    else:
        hits = np.flatnonzero(gi.number == step)
        if hits.size == 0:
            return None
        i = int(hits[0])
    compute = rc.compute
    bwd, opt = gi.backward, gi.optimizer
    fwd = iv.subtract(compute, iv.union(bwd, opt))
    parts = {"backward": bwd, "optimizer": opt, "forward": fwd, **_comm_parts(rc, compute)}
    lo, hi = int(gi.lo_ns[i]), int(gi.hi_ns[i])
    stage = grid.stage(rc.rank) if grid is not None else None
    parts = _labelled({k: iv.clip(v, lo, hi) for k, v in parts.items()}, action_spans(pp, int(gi.number[i]), lo, hi, schedule))
    segs = step_segments(parts, lo, hi, min_idle_fraction * (hi - lo) * NS)
    return StageStep(rank=rc.rank, stage=stage, step=int(gi.number[i]), step_s=(hi - lo) * NS, segments=segs,
                     start_us=rc.clock0_us + lo / 1000.0)


def rank_step(rt: RankTrace, step: Optional[int] = None, grid: Optional[JobLayout] = None,
              min_idle_fraction: float = 0.0, schedule: Optional[str] = None) -> Optional[StageStep]:
    """step_row of one loaded trace (its per-rank pass made here)."""
    timeline, w = window_of(rt)
    sets = timeline_sets(rt.events, w, timeline)
    rc = (gpu_comms if timeline == "gpu" else host_comms)(rt, w, sets.compute)
    rc.rank = int(rt.rank or 0)
    attribute_axes(rc, grid)
    pp = read_rank(rt, w, timeline, rc)
    return step_row(gantt_input(rt, w, timeline, sets.compute), rc, pp, step, grid, min_idle_fraction, schedule)


def pipeline_gantt(ranks: list, grid: Optional[JobLayout], max_rows: int = 16,
                   min_idle_fraction: float = 0.002, schedule: Optional[str] = None) -> PipelineGantt:
    """One step of one rank per pipeline stage (tp 0, dp 0 where loaded), and the same step of
    every other rank of each stage; the first max_rows loaded ranks when the grid is unknown. All
    rows show the same ProfilerStep number.

    ranks: (GanttInput, RankComms, PPTrace) per rank, the comms attributed to axes with `grid`;
    schedule: the job's pipeline schedule (diag's name), which says whether compute-order
    micro-batch numbers can label the bars."""
    by_rank = {int(rc.rank): (gi, rc, pp) for gi, rc, pp in ranks}
    staged = grid is not None and (grid.layout is not None or grid.pp > 1)
    others: list[int] = []
    if staged:                       # the lowest loaded rank of each stage: tp 0, dp 0 where loaded
        by_stage: dict = {}          # (over the loaded ranks, not the pp a flag or file claims)
        for r in sorted(by_rank):
            s = grid.stage(r)
            if s is not None:
                by_stage.setdefault(s, []).append(r)
        picks = [by_stage[s][0] for s in sorted(by_stage)]
        others = [r for s in sorted(by_stage) for r in by_stage[s][1:]]
    else:
        picks = sorted(by_rank)[:max_rows]
    timeline = "gpu" if any(by_rank[r][0].timeline == "gpu" for r in picks) else "host"
    out = PipelineGantt(timeline=timeline, labels=_labels_note(grid, [by_rank[r][2] for r in picks], schedule))
    if not staged:
        out.note = out.note.replace("one rank per stage (tp 0, dp 0)", f"the first {max_rows} ranks (grid unknown)")
    kw = {"grid": grid, "min_idle_fraction": min_idle_fraction, "schedule": schedule}
    first = step_row(*by_rank[picks[0]], **kw) if picks else None
    if first is None:
        return out
    out.rows.append(first)
    for r in picks[1:]:
        row = step_row(*by_rank[r], step=first.step, **kw) or step_row(*by_rank[r], **kw)
        if row is not None:
            out.rows.append(row)
    out.others = [row for r in others if (row := step_row(*by_rank[r], step=first.step, **kw)) is not None]
    return out


def _labels_note(grid: Optional[JobLayout], traces: list, schedule: Optional[str]) -> str:
    """Where the bars' labels come from, or why the bars have none."""
    if grid is None or grid.pp < 2:
        return "Bars not labelled with pipeline actions: no pipeline parallelism known (PP = 1, or give --pp)"
    sources = sorted({pp.source for pp in traces if pp is not None and pp.source})
    if not sources:
        return ("Bars not labelled with pipeline actions: the traces show none (no PP:<action> or Forward i "
                "annotations, no forward/backward compute between pipeline sends/receives)")
    if sources == ["compute"] and schedule not in SINGLE_STAGE:
        return ("Bars not labelled with pipeline actions: without annotations the micro-batches are numbered "
                "from the compute's order, which only a 1F1B or GPipe schedule runs in order, and the "
                f"schedule here is {schedule or 'unknown'}")
    return (f"Bars labelled with the pipeline action they run (F3: forward of micro-batch 3, B backward, I/W "
            f"backward input/weight; .1: the rank's second model chunk), read from {'; '.join(SOURCES[s] for s in sources)}; "
            "compute outside every action unlabelled")
