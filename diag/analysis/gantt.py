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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..trace.kinds import Coll, Kind
from ..trace.table import RankTrace
from . import intervals as iv
from .breakdown import timeline_sets
from .collectives import AXES, RankComms, attribute_axes, gpu_comms, host_comms
from .layoutfind import JobLayout
from .hostlink import enclosing, launches
from .steps import Window, window_of

KINDS = ("forward", "backward", "optimizer", "send/recv", "collective", "idle")
_BACKWARD = "autograd::engine::evaluate_function"
_OPTIMIZER = "Optimizer.step"
_P2P = (Coll.SEND, Coll.RECV, Coll.SEND_RECV)
NS = 1e-9


@dataclass
class Segment:
    kind: str                          # one of KINDS
    start_s: float                     # from the step's start
    end_s: float


@dataclass
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


@dataclass
class PipelineGantt:
    timeline: str                      # "gpu" | "host"
    rows: list[StageStep] = field(default_factory=list)
    # the same step of the stages' other ranks (tp/dp > 0), up to max_rows of them: a viewer may
    # show any rank of a stage in place of its row
    others: list[StageStep] = field(default_factory=list)
    note: str = ("one rank per stage (tp 0, dp 0), the same ProfilerStep on each; times from each rank's "
                 "own step start; communication under compute is hidden and not drawn; idle gaps under "
                 "0.2% of the step drawn as their neighbours")


def _spans(t, name_prefix: str) -> iv.Intervals:
    rows = np.flatnonzero(t.name_mask(lambda s: s.startswith(name_prefix)) & t.mask(Kind.CPU_OP, Kind.ANNOTATION))
    return iv.merge(t.ts_ns[rows], t.end_ns[rows])


def _compute_parts(rt: RankTrace, w: Window, timeline: str, compute: iv.Intervals) -> dict:
    """forward / backward / optimizer interval sets that together make up `compute`."""
    t = rt.events
    if timeline == "host":
        bwd = iv.intersect(compute, _spans(t, _BACKWARD))
        opt = iv.subtract(iv.intersect(compute, _spans(t, _OPTIMIZER)), bwd)
    else:
        rows = w.rows[t.kind[w.rows] == Kind.COMPUTE]
        lts, lth = launches(t, rows)
        in_bwd = enclosing(t, lts, lth, lambda s: s.startswith(_BACKWARD)) >= 0
        in_opt = enclosing(t, lts, lth, lambda s: s.startswith(_OPTIMIZER)) >= 0
        bwd = iv.merge(t.ts_ns[rows[in_bwd]], t.end_ns[rows[in_bwd]])
        opt = iv.subtract(iv.merge(t.ts_ns[rows[in_opt & ~in_bwd]], t.end_ns[rows[in_opt & ~in_bwd]]), bwd)
    return {"backward": bwd, "optimizer": opt, "forward": iv.subtract(compute, iv.merge(
        np.concatenate([bwd[0], opt[0]]), np.concatenate([bwd[1], opt[1]])))}


def _comm_parts(rc: RankComms, compute: iv.Intervals) -> dict:
    """Exposed pipeline send/recv and exposed other communication."""
    p2p = np.isin(rc.coll, np.asarray(_P2P, np.int8)) | (rc.axis == AXES.index("pp"))
    end = rc.start_ns + rc.dur_ns
    pp = iv.subtract(iv.merge(rc.start_ns[p2p], end[p2p]), compute)
    other = iv.subtract(iv.subtract(iv.merge(rc.start_ns[~p2p], end[~p2p]), compute), pp)
    return {"send/recv": pp, "collective": other}


@dataclass
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
    idx = np.unique(w.step_index[w.step_index >= 0])
    bounds = [step_bounds(rt, w, timeline, int(i)) for i in idx]
    parts = _compute_parts(rt, w, timeline, compute) if idx.size else {}
    return GanttInput(timeline=timeline, number=w.steps.number[idx].astype(np.int64),
                      host_ns=(w.steps.end_ns[idx] - w.steps.start_ns[idx]).astype(np.int64),
                      lo_ns=np.array([b[0] for b in bounds], np.int64), hi_ns=np.array([b[1] for b in bounds], np.int64),
                      backward=parts.get("backward", iv.EMPTY), optimizer=parts.get("optimizer", iv.EMPTY))


def step_bounds(rt: RankTrace, w: Window, timeline: str, i: int) -> tuple[int, int]:
    """[start, end) of step index i: the host's ProfilerStep span, or on a GPU the span of its kernels."""
    if timeline == "host":
        return int(w.steps.start_ns[i]), int(w.steps.end_ns[i])
    rows = w.rows[w.step_index == i]
    t = rt.events
    return int(t.ts_ns[rows].min()), int(t.end_ns[rows].max())


def segments(parts: dict, lo: int, hi: int) -> list[Segment]:
    """Disjoint interval sets by kind -> consecutive segments over [lo, hi), gaps as idle."""
    found = []
    for kind, s in parts.items():
        a, b = iv.clip(s, lo, hi)
        found += [(int(x), int(y), kind) for x, y in zip(a, b)]
    found.sort()
    out, at = [], lo
    for x, y, kind in found:
        if x > at:
            out.append(Segment("idle", (at - lo) * NS, (x - lo) * NS))
        out.append(Segment(kind, (x - lo) * NS, (y - lo) * NS))
        at = max(at, y)
    if hi > at:
        out.append(Segment("idle", (at - lo) * NS, (hi - lo) * NS))
    return out


def coalesce(segs: list[Segment], min_idle_s: float) -> list[Segment]:
    """Idle gaps shorter than min_idle_s between two segments of one kind join them (host traces
    are gaps of microseconds between operators), then neighbours of one kind merge."""
    out: list[Segment] = []
    for i, s in enumerate(segs):
        short_gap = (s.kind == "idle" and s.end_s - s.start_s < min_idle_s and 0 < i < len(segs) - 1
                     and segs[i - 1].kind == segs[i + 1].kind)
        kind = segs[i - 1].kind if short_gap else s.kind
        if out and out[-1].kind == kind:
            out[-1].end_s = s.end_s
        else:
            out.append(Segment(kind, s.start_s, s.end_s))
    return out


def step_row(gi: GanttInput, rc: RankComms, step: Optional[int] = None, grid: Optional[JobLayout] = None,
             min_idle_fraction: float = 0.0) -> Optional[StageStep]:
    """One step of one rank as segments; step is a ProfilerStep number (default: the median-length
    step in the analysis window). None when the rank has no such step. rc: the rank's
    communication, attributed to axes with the grid. Idle gaps shorter than min_idle_fraction of
    the step are drawn as their neighbours (see coalesce)."""
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
    fwd = iv.subtract(compute, iv.merge(np.concatenate([bwd[0], opt[0]]), np.concatenate([bwd[1], opt[1]])))
    parts = {"backward": bwd, "optimizer": opt, "forward": fwd, **_comm_parts(rc, compute)}
    lo, hi = int(gi.lo_ns[i]), int(gi.hi_ns[i])
    stage = grid.stage(rc.rank) if grid is not None else None
    segs = coalesce(segments(parts, lo, hi), min_idle_fraction * (hi - lo) * NS)
    return StageStep(rank=rc.rank, stage=stage, step=int(gi.number[i]), step_s=(hi - lo) * NS, segments=segs,
                     start_us=rc.clock0_us + lo / 1000.0)


def rank_step(rt: RankTrace, step: Optional[int] = None, grid: Optional[JobLayout] = None,
              min_idle_fraction: float = 0.0) -> Optional[StageStep]:
    """step_row of one loaded trace (its per-rank pass made here)."""
    timeline, w = window_of(rt)
    sets = timeline_sets(rt.events, w, timeline)
    rc = (gpu_comms if timeline == "gpu" else host_comms)(rt, w, sets.compute)
    rc.rank = int(rt.rank or 0)
    attribute_axes(rc, grid)
    return step_row(gantt_input(rt, w, timeline, sets.compute), rc, step, grid, min_idle_fraction)


def pipeline_gantt(ranks: list, grid: Optional[JobLayout], max_rows: int = 16,
                   min_idle_fraction: float = 0.002) -> PipelineGantt:
    """One step of one rank per pipeline stage (tp 0, dp 0 where loaded); every loaded rank
    (up to max_rows) when the grid is unknown. All rows show the same ProfilerStep number.

    ranks: (GanttInput, RankComms) per rank, the comms attributed to axes with `grid`."""
    by_rank = {int(rc.rank): (gi, rc) for gi, rc in ranks}
    staged = grid is not None and (grid.layout is not None or grid.pp > 1)
    others: list[int] = []
    if staged:                       # the lowest loaded rank of each stage: tp 0, dp 0 where loaded
        by_stage: dict = {}          # (over the loaded ranks, not the pp a flag or file claims)
        for r in sorted(by_rank):
            s = grid.stage(r)
            if s is not None:
                by_stage.setdefault(s, []).append(r)
        picks = [by_stage[s][0] for s in sorted(by_stage)]
        others = [r for s in sorted(by_stage) for r in by_stage[s][1:]][:max_rows]
    else:
        picks = sorted(by_rank)[:max_rows]
    timeline = "gpu" if any(by_rank[r][0].timeline == "gpu" for r in picks) else "host"
    out = PipelineGantt(timeline=timeline)
    if not staged:
        out.note = out.note.replace("one rank per stage (tp 0, dp 0)", f"the first {max_rows} ranks (grid unknown)")
    kw = {"grid": grid, "min_idle_fraction": min_idle_fraction}
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
