"""Pipeline bubble per stage, measured from the trace, next to the schedule's ideal.

Measured: per step, the time a stage's ranks spend in pipeline (PP) send/recv that is
not hidden behind compute: waiting for the neighbour's activations or gradients. The
ideal for a non-interleaved schedule (GPipe and 1F1B alike) is (p-1)/(m+p-1) of the
step; interleaved 1F1B with v virtual stages, (p-1)/(v·m+p-1) of the step (that is
(p-1)/(v·m) of the ideal compute time, as Megatron-LM states it).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..topology import RankGrid
from . import intervals as iv
from .collectives import AXES, RankComms
from .results import Pipeline, PipelineStage, RankResult

PP = AXES.index("pp")


def ideal_bubble(p: int, m: Optional[int], v: int = 1) -> Optional[float]:
    if not m or p < 1 or v < 1:
        return None
    return (p - 1) / (v * m + p - 1)


def _exposed_pp(rc: RankComms) -> float:
    sel = rc.axis == PP
    u = iv.merge(rc.start_ns[sel], rc.start_ns[sel] + rc.dur_ns[sel])
    return iv.length(iv.subtract(u, rc.compute)) * 1e-9


def pipeline(grid: Optional[RankGrid], meta: dict, ranks: list[RankResult],
             comms: list[RankComms]) -> Optional[Pipeline]:
    if grid is None or grid.pp < 2:
        return None
    m = meta.get("num_micro_batches")
    v = int(meta.get("virtual_pipeline_stages") or 1)
    sched = meta.get("pipeline_schedule")
    conv = ("(p-1)/(m+p-1) of the step (GPipe / 1F1B)" if v == 1
            else "(p-1)/(v·m+p-1) of the step, i.e. (p-1)/(v·m) of ideal compute (interleaved 1F1B)")
    out = Pipeline(p=grid.pp, m=m, v=v, schedule=sched, ideal_fraction=ideal_bubble(grid.pp, m, v), convention=conv)
    by_rank = {r.rank: (r, rc) for r, rc in zip(ranks, comms)}
    for stage in range(grid.pp):
        members = [r for r in by_rank if r < grid.world_size and grid.coords(r).pp_rank == stage]
        if not members:
            continue
        bubble, compute, fraction = [], [], []
        for r in members:
            res, rc = by_rank[r]
            steps = sum(s.in_window for s in res.steps) or 1
            b = _exposed_pp(rc) / steps
            bubble.append(b)
            compute.append(res.breakdown.compute_s / steps)
            if res.step_time_s:
                fraction.append(b / res.step_time_s)
        out.stages.append(PipelineStage(stage=stage, ranks=sorted(members), bubble_s=float(np.mean(bubble)),
                                        bubble_fraction=float(np.mean(fraction)) if fraction else None,
                                        compute_s=float(np.mean(compute))))
    return out
