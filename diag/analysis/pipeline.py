"""Pipeline bubble per stage, measured from the trace, next to the schedule's ideal.

Measured: per step, the time a stage's ranks wait on their pipeline neighbours (ppwaits: on a
host timeline the main thread blocked in a pipeline send/recv or its wait, on a GPU timeline the
pipeline p2p kernels not under compute), averaged over the stage's ranks, and as a fraction of
the median step. The ideal comes from the schedule, m and v (ppschedule: read from the trace,
or given).

Which point-to-point ops are the pipeline's: those the trace ties to it (inside a pipelining
annotation, under a `diag:comm:pp` label, in a group named `pp` or the rank's pipeline group),
and, when the layout has pp > 1, those whose group the trace does not name, provided their
peer (where recorded) is a pipeline neighbour: torchtitan and Megatron-LM send point-to-point
only between pipeline stages, and gloo's `gloo:send`/`gloo:recv` spans name no group at all.

A stage whose traces show no such op, or no analysed step, has an unknown bubble with the
reason, never a measured 0.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..layout import UNKNOWN, axis_index
from . import intervals as iv
from .layoutfind import JobLayout
from .ppschedule import schedule_of
from .ppwaits import P2PWaits
from .rankpass import RankSummary
from .results import Pipeline, PipelineStage

PP = axis_index("pp")


def ideal_bubble(p: int, m: Optional[int], v: int = 1, name: Optional[str] = None) -> tuple[Optional[float], str]:
    """(the schedule's ideal bubble as a fraction of the step, the convention in words)."""
    v = v or 1
    if name in ("zbv", "dualpipev"):
        return 0.0, (f"{name}: no bubble in theory (equal forward, backward-input and backward-weight "
                     "times, m >= 2p); all of the measured bubble is excess")
    if not m or p < 1:
        return None, "unknown without the number of micro-batches m"
    if name == "zb1p":
        return (p - 1) / (3 * v * m + p - 1), ("(p-1)/(3·v·m+p-1) of the step: ZB-H1's bubble, a third of "
                                                "1F1B's with equal forward, backward-input and backward-weight times")
    if v > 1 or name in ("interleaved-1f1b", "looped-bfs"):
        return (p - 1) / (v * m + p - 1), ("(p-1)/(v·m+p-1) of the step, i.e. (p-1)/(v·m) of ideal compute "
                                            "(interleaved 1F1B, Megatron-LM; looped BFS alike)")
    return (p - 1) / (m + p - 1), "(p-1)/(m+p-1) of the step, i.e. (p-1)/m of ideal compute (GPipe / 1F1B)"


def is_pipeline(pw: P2PWaits, grid: JobLayout, rank: int) -> np.ndarray:
    """Per op of one rank: is it a transfer between pipeline stages?"""
    stage, own = grid.stage(rank), grid.group_of(rank, "pp")
    axis = np.array([grid.axis_of(g) if g is not None else UNKNOWN for g in pw.group], np.int64)
    in_pp_group = np.array([g is not None and own is not None and g == own[0] for g in pw.group], bool)
    unnamed = np.array([g is None for g in pw.group], bool) & (stage is not None)
    neighbour = (pw.peer < 0) | np.isin((pw.peer - (stage or 0)) % grid.pp, [1, grid.pp - 1])
    return pw.sure | (axis == PP) | in_pp_group | (unnamed & neighbour)


def _rank_bubble(s: RankSummary, grid: JobLayout) -> tuple[Optional[float], Optional[str]]:
    """(seconds per analysed step the rank waited on its pipeline neighbours, or None and why)."""
    steps = s.result.window_steps
    if not steps:
        return None, "no ProfilerStep in the analysis window: no step to measure the bubble in"
    ops = is_pipeline(s.pp.p2p, grid, s.result.rank)
    if not ops.any():
        return None, "no pipeline send/recv found in its traces"
    return iv.length(s.pp.p2p.waited(ops)) * 1e-9 / steps, None


def _stage(stage: int, members: list[RankSummary], grid: JobLayout, order: list[str]) -> PipelineStage:
    bubble, fraction, compute, why = [], [], [], []
    for s in members:
        res = s.result
        steps = res.window_steps or 1
        compute.append(res.breakdown.compute_s / steps)
        b, reason = _rank_bubble(s, grid)
        if b is None:
            why.append(reason)
            continue
        bubble.append(b)
        if res.step_time_s:
            fraction.append(b / res.step_time_s)
    return PipelineStage(stage=stage, ranks=sorted(s.result.rank for s in members),
                         bubble_s=float(np.mean(bubble)) if bubble else None,
                         bubble_fraction=float(np.mean(fraction)) if fraction else None,
                         compute_s=float(np.mean(compute)), unknown=None if bubble else why[0], order=order)


def pipeline(grid: Optional[JobLayout], meta: dict, summaries: list[RankSummary]) -> Optional[Pipeline]:
    """The pipeline section of a diagnosis; None without pipeline parallelism (pp < 2 or unknown)."""
    if grid is None or grid.pp < 2:
        return None
    by_stage: dict[int, list[RankSummary]] = {}
    for s in sorted(summaries, key=lambda s: s.result.rank):
        stage = grid.stage(s.result.rank)
        if stage is not None:
            by_stage.setdefault(stage, []).append(s)
    sched = schedule_of(grid.pp, {st: [s.pp for s in ss] for st, ss in by_stage.items()}, meta)
    v = sched.v or 1
    ideal, convention = ideal_bubble(grid.pp, sched.m, v, sched.name)
    out = Pipeline(p=grid.pp, m=sched.m, v=v, schedule=sched.name, ideal_fraction=ideal, convention=convention,
                   source=sched.source, unknown=sched.unknown)
    out.stages = [_stage(st, by_stage[st], grid, sched.orders.get(st, [])) for st in sorted(by_stage)]
    return out
