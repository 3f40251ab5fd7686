"""The thin front: a loaded Job in, a Diagnosis out. Each analysis lives in its own module."""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

from ..topology import RankGrid
from ..trace.job import Job
from ..trace.table import RankTrace
from .collectives import GridIndex, RankComms, attribute_axes
from .commstats import axis_overlap, op_stats, rank_comm
from .findings import findings
from .gantt import pipeline_gantt
from .matching import match
from .pipeline import pipeline
from .rates import throughput
from .rankpass import RankSummary, summarize
from .results import CommAnalysis, Diagnosis, Problem, RankResult
from .stragglers import collective_stragglers, step_stragglers


def analyse_rank(rt: RankTrace, top_n: int = 10) -> RankResult:
    return summarize(rt, top_n).result


def summaries_of(job: Job, top_n: int = 10) -> list[RankSummary]:
    """The per-rank pass of each rank: made here from loaded traces, or already made (a Job of
    RankSummary, from analysis.collect) and cut to top_n kernels."""
    return [rt.with_top(top_n) if isinstance(rt, RankSummary) else summarize(rt, top_n) for rt in job.ranks]


def job_grid(job: Job, tp: Optional[int], pp: Optional[int]) -> Optional[RankGrid]:
    """The TP x PP x DP grid: given sizes, else the trainer's diag_run.json, else unknown."""
    meta = job.run_meta or {}
    tp = tp or meta.get("tp")
    pp = pp or meta.get("pp")
    world = job.world_size or meta.get("world_size")
    if not (tp and pp and world):
        return None
    return RankGrid.from_world(int(world), int(tp), int(pp))


def comm_analysis(comms: list[RankComms], ranks: list[RankResult], world: Optional[int],
                  device: Optional[str], link_gbps: Optional[float], bench=None) -> CommAnalysis:
    matched, inferred = match(comms, world)
    steps = max((sum(s.in_window for s in r.steps) for r in ranks), default=0)
    ca = CommAnalysis(ops=op_stats(comms, matched, len(comms), device, link_gbps, bench),
                      axes=axis_overlap(comms, len(comms), steps), ranks=rank_comm(comms, matched))
    ca.stragglers = collective_stragglers(comms, matched, steps) + step_stragglers(ranks)
    if inferred:
        ca.notes.append("the traces do not name the process group of some collectives: matched across all "
                        "ranks because every rank shows the same sequence of them")
    if any(a.axis == "unknown" for a in ca.axes):
        ca.notes.append("parallel axis unknown for some communication: the trace has no diag:comm labels; "
                        "give --tp and --pp (or a diag_run.json) to attribute groups to TP/PP/DP")
    return ca


def diagnose(job: Job, top_n: int = 10, tp: Optional[int] = None, pp: Optional[int] = None,
             link_gbps: Optional[float] = None, peak_tflops: Optional[float] = None,
             shape: Optional[dict] = None, bench=None) -> Diagnosis:
    """shape: run facts given by the user (Megatron names, e.g. global_batch_size) over diag_run.json;
    bench: a `diag bench` busbw curve (analysis.benchcurve) to set each collective against."""
    meta = {**(job.run_meta or {}), **{k: v for k, v in (shape or {}).items() if v is not None}}
    grid = job_grid(job, tp, pp)
    summaries = summaries_of(job, top_n)
    ranks = [s.result for s in summaries]
    comms = [s.comms for s in summaries]
    index = GridIndex.of(grid) if grid else None
    for rc in comms:
        attribute_axes(rc, index)
    devices = [r.device for r in ranks if r.device]
    ca = comm_analysis(comms, ranks, job.world_size, devices[0] if devices else None, link_gbps, bench) \
        if any(len(rc) for rc in comms) else None
    backends = {rt.backend for rt in job.ranks if rt.backend}
    notes = list(job.notes)
    d = Diagnosis(
        source=os.path.abspath(job.source), world_size=job.world_size,
        backend=", ".join(sorted(backends)) or None, ranks=ranks,
        missing_ranks=job.missing_ranks,
        problems=[Problem(p.path, p.problem) for p in job.problems],
        other_runs=job.other_runs, notes=notes, run=job.run_meta, comm=ca, findings=findings(ranks, ca),
        pipeline=pipeline(grid, meta, ranks, comms), throughput=throughput(ranks, meta, job.world_size, peak_tflops))
    d.gantt = pipeline_gantt([(s.gantt, s.comms) for s in summaries], grid)
    from ..advise.recommend import recommend     # imported here: the recommender is not the analyser's cost
    try:
        d.recommendations = recommend(d)
    except Exception as e:                       # noqa: BLE001 - advice must not cost the diagnosis
        d.notes.append(f"recommendations could not be computed ({type(e).__name__}: {e}); "
                       "the diagnosis above is complete")
    return d
