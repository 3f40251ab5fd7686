"""The thin front: a loaded Job in, a Diagnosis out. Each analysis lives in its own module."""
from __future__ import annotations

import os
from typing import Optional

import msgspec

from .. import runmeta
from ..runmeta import RunFacts
from ..trace.job import Job
from ..trace.table import RankTrace
from .clocks import align
from .collectives import RankComms, attribute_axes
from .layoutfind import JobLayout, find_layout
from .shapes import infer_shape
from .commstats import axis_overlap, busbw_unknown_notes, op_stats, rank_comm
from .findings import findings
from .gloogroups import join_groups
from .gantt import pipeline_gantt
from .matching import match
from .memuse import memory_usage
from .pipeline import pipeline
from .rates import throughput
from .rankpass import RankSummary, summarize
from .results import CommAnalysis, Diagnosis, MemoryUsage, Problem, RankResult
from .stragglers import cannot_tell, collective_stragglers, file_host, rank_hosts, step_stragglers


def analyse_rank(rt: RankTrace, top_n: int = 10) -> RankResult:
    return summarize(rt, top_n).result


def summaries_of(job: Job, top_n: int = 10) -> list[RankSummary]:
    """The per-rank pass of each rank: made here from loaded traces, or already made (a Job of
    RankSummary, from analysis.collect) and cut to top_n kernels."""
    return [rt.with_top(top_n) if isinstance(rt, RankSummary) else summarize(rt, top_n) for rt in job.ranks]


def job_layout(job: Job, summaries: list[RankSummary], sizes: Optional[dict] = None,
               config: Optional[dict] = None) -> JobLayout:
    """The job's layout: process-group names in the traces, else sizes given (flags, then a
    framework config file, then the trainer's diag_run.json), else unknown (layoutfind)."""
    return find_layout([s.pg_config for s in summaries], job.world_size, flags=sizes, config=config,
                       meta=runmeta.given(job.run_meta) if job.run_meta else None)


def comm_analysis(comms: list[RankComms], ranks: list[RankResult], world: Optional[int],
                  device: Optional[str], link_gbps: Optional[float], bench=None,
                  unknown_axis_note: str = "", smaller_groups: bool = False,
                  clocks: tuple = (None, None)) -> CommAnalysis:
    """clocks: per comms entry, its host and its clock's 0 on the host's clock (matching.match)."""
    matched, inferred = match(comms, world, smaller_groups, *clocks)
    for rc, m in zip(comms, matched):        # carried with the comms: the timeline links each match
        rc.match_id = m.match_id
    steps = max((r.window_steps for r in ranks), default=0)
    ca = CommAnalysis(ops=op_stats(comms, matched, len(comms), device, link_gbps, bench),
                      axes=axis_overlap(comms, len(comms), steps), ranks=rank_comm(comms, matched))
    ca.stragglers = collective_stragglers(comms, matched, steps, rank_hosts(ranks, clocks[0])) + step_stragglers(ranks)
    ca.stragglers_unknown = cannot_tell(comms, matched, world)
    ca.clock = align(comms)
    ca.notes += busbw_unknown_notes(ca.ops)
    if inferred:
        ca.notes.append("the traces do not name the process group of some collectives: matched across all "
                        "ranks because every rank shows the same sequence of them")
    if any(a.axis == "unknown" for a in ca.axes):
        ca.notes.append(unknown_axis_note)
    return ca


def _shape_from_trace(summaries: list[RankSummary], meta: RunFacts, grid: JobLayout) -> tuple[RunFacts, list[str]]:
    """Fill the model-shape facts nobody gave from the GEMM shapes of the first rank that settles
    them (analysis.shapes); say so. A DTensor trace's linears carry the global weight: no TP factor."""
    if (meta.hidden_size and meta.num_layers) or not summaries:   # the run says its shape
        return meta, []
    for s in summaries:
        if not s.gemms:
            continue
        got = infer_shape({(op, tuple(map(tuple, dims))): n for op, dims, n in s.gemms},
                          tp=1 if s.dtensor else (grid.layout.tp if grid.layout is not None else None))
        tokens = got.pop("tokens_per_micro_batch", None)
        got.pop("ffn_hidden_size_per_rank", None)
        if tokens and meta.seq_length and not meta.micro_batch_size and tokens % meta.seq_length == 0:
            got["micro_batch_size"] = tokens // meta.seq_length
        new = {k: v for k, v in got.items() if k in runmeta.FIELDS and getattr(meta, k) is None}
        if not new:
            return meta, []
        return msgspec.structs.replace(meta, **new), [
            f"from the trace's GEMM shapes (rank {s.rank}): " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in new.items())]
    return meta, []


def _attention(summaries: list[RankSummary], meta: RunFacts) -> RunFacts:
    """The attention kind the traces show (shapes.attention_kind): eager if any rank keeps the
    scores, else fused if any rank runs fused attention; as given when no trace says."""
    kinds = {s.attention for s in summaries} - {None}
    if not kinds:
        return meta
    return msgspec.structs.replace(meta, attention="eager" if "eager" in kinds else "fused")


def run_facts(job: Job, config: Optional[dict], shape: Optional[dict]) -> RunFacts:
    """The run's facts as given: diag_run.json < the framework config file < the flags, each
    validated by the one schema (diag.runmeta); a value that does not fit names its source."""
    return runmeta.merged(job.run_meta, runmeta.convert(config or {}, "--config"),
                          runmeta.convert(shape or {}, "the flags"))


def _with_layout(meta: RunFacts, grid: JobLayout) -> RunFacts:
    """The layout as found is a fact of the run, whoever said it."""
    if grid.layout is None:
        return meta
    sizes = {a: grid.layout.size(a) for a in ("tp", "pp", "cp", "ep", "dp_shard")
             if a in grid.layout.axes or getattr(meta, a) is None}      # ep is carved out of dp, not a dim
    sizes["dp"] = grid.layout.size("dp") * grid.layout.size("dp_shard")   # all data-parallel ways
    if meta.world_size is None:
        sizes["world_size"] = grid.layout.world_size
    return msgspec.structs.replace(meta, **sizes)


def _measured_memory(job: Job, summaries: list[RankSummary], grid: JobLayout,
                     meta: RunFacts) -> tuple[MemoryUsage, RunFacts]:
    """The measured memory per rank (memuse), and the facts with the job's peak: as given
    (diag_run.json first), else the largest the traces' memory events measured, said so."""
    given = meta.peak_memory_bytes
    source = None if not given else "diag_run.json" if job.run_meta and job.run_meta.peak_memory_bytes \
        else "--config or the flags"
    usage, peak = memory_usage([(s.result.rank, s.memory) for s in summaries], grid.stage, given, source)
    if peak and not given:
        meta = msgspec.structs.replace(meta, peak_memory_bytes=peak)
    return usage, meta


def _smaller_groups(summaries: list[RankSummary], world: Optional[int]) -> bool:
    """Does any rank belong to a process group smaller than the world?"""
    return any(len(ranks) < (world or 0) for s in summaries for _, _, ranks in s.pg_config)


def _unknown_axis_note(grid: JobLayout) -> str:
    if grid.layout is not None or grid.axis_of_key:
        return ("parallel axis unknown for some communication: its process group is not one of the layout's "
                f"({grid.describe()}) or the trace does not say which group it ran in")
    return ("parallel axis unknown for some communication: the traces name no process group by axis "
            "(pg_config descriptions such as mesh_tp) and no layout was given: --tp/--pp (and --cp/--ep/"
            "--dp-shard), or --config with the job's Megatron-LM arguments or torchtitan TOML")


def diagnose(job: Job, top_n: int = 10, tp: Optional[int] = None, pp: Optional[int] = None,
             link_gbps: Optional[float] = None, peak_tflops: Optional[float] = None,
             shape: Optional[dict] = None, bench=None, sizes: Optional[dict] = None,
             config: Optional[dict] = None) -> Diagnosis:
    """sizes: axis sizes given by the user (layoutfind.SIZE_KEYS: cp, ep, dp_shard beside tp, pp);
    config: facts from a framework config file (runconfig.load_config);
    shape: run facts given by the user (Megatron names, e.g. global_batch_size) over diag_run.json;
    bench: a `diag bench` busbw curve (analysis.benchcurve) to set each collective against."""
    meta = run_facts(job, config, shape)
    summaries = summaries_of(job, top_n)
    config = dict(config or {})
    notes = list(job.notes) + list(config.pop("notes", []) or [])
    grid = job_layout(job, summaries, {"tp": tp, "pp": pp, **(sizes or {})}, config)
    meta, shape_notes = _shape_from_trace(summaries, meta, grid)
    meta = _attention(summaries, meta)
    notes += grid.notes + shape_notes
    meta = _with_layout(meta, grid)
    memory, meta = _measured_memory(job, summaries, grid, meta)
    ranks = [s.result for s in summaries]
    comms = [s.comms for s in summaries]
    for rc in comms:
        attribute_axes(rc, grid)
    join_groups(comms, [s.pg_config for s in summaries], grid)
    devices = [r.device for r in ranks if r.device]
    ca = comm_analysis(comms, ranks, job.world_size, devices[0] if devices else None, link_gbps, bench,
                       _unknown_axis_note(grid), _smaller_groups(summaries, job.world_size),
                       ([file_host(s.path, s.host) for s in summaries],
                        [s.start_epoch_ns for s in summaries])) \
        if any(len(rc) for rc in comms) else None
    backends = {rt.backend for rt in job.ranks if rt.backend}
    d = Diagnosis(
        source=os.path.abspath(job.source), world_size=job.world_size,
        backend=", ".join(sorted(backends)) or None, ranks=ranks,
        missing_ranks=job.missing_ranks, missing_count=job.missing_count,
        problems=[Problem(p.path, p.problem) for p in job.problems],
        other_runs=job.other_runs, notes=notes, run=job.run_meta, layout=grid.describe(), facts=meta,
        layout_dims=[[a, n] for a, n in grid.layout.dims] if grid.layout is not None else None, comm=ca, findings=findings(ranks, ca),
        pipeline=pipeline(grid, meta, summaries), throughput=throughput(ranks, meta, job.world_size, peak_tflops))
    d.memory = memory
    d.gantt = pipeline_gantt([(s.gantt, s.comms, s.pp) for s in summaries], grid,
                             schedule=d.pipeline.schedule if d.pipeline else None)
    return d
