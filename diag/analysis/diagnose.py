"""The thin front: a loaded Job in, a Diagnosis out. Each analysis lives in its own module."""
from __future__ import annotations

import os
from collections import Counter
from typing import Optional

import numpy as np

from ..trace.job import Job
from ..trace.kinds import Kind
from ..trace.table import RankTrace
from .breakdown import analyse_timeline, exposed_comm_by_step
from .kernels import top_kernels
from .results import Diagnosis, Problem, RankResult, StepTime
from .steps import gpu_window, host_steps, host_window


def device_name(rt: RankTrace) -> Optional[str]:
    t = rt.events
    gpu = t.device[t.gpu_mask()]
    if gpu.size == 0:
        return None
    dev = int(Counter(gpu.tolist()).most_common(1)[0][0])
    for d in rt.devices:
        if isinstance(d, dict) and d.get("id") == dev and isinstance(d.get("name"), str):
            return d["name"]
    return f"GPU {dev} (no deviceProperties)"


def analyse_rank(rt: RankTrace, top_n: int = 10) -> RankResult:
    t = rt.events
    steps = host_steps(t)
    timeline = "gpu" if rt.has_gpu else "host"
    if timeline == "gpu":
        w = gpu_window(t, steps)
    else:
        host_rows = np.flatnonzero(t.mask(Kind.CPU_OP, Kind.ANNOTATION) & ~t.name_mask(lambda s: s.startswith("ProfilerStep")))
        w = host_window(t, host_rows, steps)
    breakdown, overlap = analyse_timeline(t, w, timeline)
    exposed = exposed_comm_by_step(t, w, timeline)
    in_window = set(np.unique(w.step_index[w.step_index >= 0]).tolist())
    step_list = [StepTime(number=int(steps.number[i]),
                          host_s=float(steps.end_ns[i] - steps.start_ns[i]) * 1e-9,
                          in_window=i in in_window, exposed_comm_s=exposed.get(i))
                 for i in range(len(steps))]
    notes = []
    if w.excluded_rows:
        notes.append(f"{w.excluded_rows} {timeline} events left out of the window: {w.excluded_why}")
    notes += [f"{n} {what}" for what, n in rt.skipped.items()]
    return RankResult(
        rank=int(rt.rank), file=rt.path, device=device_name(rt), timeline=timeline,
        breakdown=breakdown, overlap=overlap, steps=step_list,
        step_time_s=float(np.median([s.host_s for s in step_list])) if step_list else None,
        top_kernels=top_kernels(t, w.rows, top_n) if timeline == "gpu" else [],
        events=len(t), excluded_events=w.excluded_rows, notes=notes)


def diagnose(job: Job, top_n: int = 10) -> Diagnosis:
    ranks = [analyse_rank(rt, top_n) for rt in job.ranks]
    backends = {rt.backend for rt in job.ranks if rt.backend}
    notes = list(job.notes)
    return Diagnosis(
        source=os.path.abspath(job.source), world_size=job.world_size,
        backend=", ".join(sorted(backends)) or None, ranks=ranks,
        missing_ranks=job.missing_ranks,
        problems=[Problem(p.path, p.problem) for p in job.problems],
        other_runs=job.other_runs, notes=notes, run=job.run_meta)
