"""The per-rank pass: one rank's trace in, a compact RankSummary out.

Everything `diagnose` needs of a rank that does not depend on the other ranks is computed
here, from that rank's trace alone: its breakdown, overlap, steps and top kernels
(RankResult), its communication instances with their exposure (RankComms), the inputs of its
pipeline-Gantt row (GanttInput) and its measured memory (RankMemory). The merge (diagnose)
combines the summaries of all ranks and never looks at a trace again, so a summary can be
computed anywhere: in a worker process, on the node that wrote the trace (`diag summarize`), or
by the trainer itself when its profiler finishes. Summaries are about 150 times smaller than their traces (see summary_file).
"""
from __future__ import annotations

import re
from dataclasses import field
from typing import Optional

from ..trace.columns import distinct, median
from ..trace.table import RankTrace
from .breakdown import analyse_timeline, exposed_comm_by_step, timeline_sets
from .collectives import RankComms, gpu_comms, host_comms
from .gantt import GanttInput, gantt_input
from .backward import backward_split
from .hostops import host_ops
from .kernels import top_kernels
from .memuse import RankMemory, compute_device, rank_memory
from .layoutfind import compact_pg_config
from .ppactions import PPTrace, action_gaps, host_gap_busy, read_rank
from .results import RankResult, StepTime
from .shapes import attention_kind
from .steps import stub_last, window_of
from ..record import record

# DTensor's dispatch marks: its aten::linear carries the global (unsharded) weight, its local
# GEMMs run nested inside with the sharded one.
DTENSOR_RE = re.compile(r"^(Redistribute|NestedRedistribute|PythonSubclass)$")

# Kernels kept per rank in a summary written to disk: `--top` up to this can use the summary.
KEEP_KERNELS = 50


@record
class RankSummary:
    """One rank's share of a diagnosis, and what the job-level merge needs to know of its file."""

    path: str                          # the trace it was made from, as given then
    rank: Optional[int]                # from distributedInfo; None when the trace lacks it
    world_size: Optional[int]
    backend: Optional[str]
    start_epoch_us: Optional[float]    # wall-clock start: tells two runs in one folder apart
    top_n: int                         # kernels kept in result.top_kernels (at most)
    result: RankResult
    comms: RankComms
    gantt: GanttInput
    pg_config: list = field(default_factory=list)   # layoutfind.compact_pg_config of its trace
    pp: PPTrace = field(default_factory=PPTrace)    # its pipeline actions and p2p waits (ppactions)
    gemms: list = field(default_factory=list)       # [[op, input dims, count]]: shapes.infer_shape's input
    dtensor: bool = False                           # GEMMs dispatched by DTensor: their shapes are global
    attention: Optional[str] = None                 # shapes.attention_kind: fused | eager; None: not seen
    memory: RankMemory = field(default_factory=RankMemory)   # measured peak and curve (memuse)
    host: Optional[str] = None                      # its trace header's host_name (RankTrace.host)
    start_epoch_ns: Optional[int] = None            # RankTrace.start_epoch_ns: the host's clock to the ns

    def set_rank(self, rank: int) -> None:
        """The rank a trace without distributedInfo is shown as (chosen by the merge)."""
        self.rank = self.result.rank = self.comms.rank = int(rank)

    def with_top(self, n: int) -> "RankSummary":
        if n < len(self.result.top_kernels):
            self.result.top_kernels = self.result.top_kernels[:n]
        self.top_n = min(self.top_n, n)
        return self


def device_name(rt: RankTrace) -> Optional[str]:
    dev = compute_device(rt)
    if dev is None:
        return None
    for d in rt.devices:
        if isinstance(d, dict) and d.get("id") == dev and isinstance(d.get("name"), str):
            return d["name"]
    return f"GPU {dev} (no deviceProperties)"


def summarize(rt: RankTrace, top_n: int = 10) -> RankSummary:
    """The per-rank pass. A pure function of the one trace: no grid, no other rank."""
    t = rt.events
    rank = int(rt.rank) if rt.rank is not None else -1     # set by the merge when unknown
    timeline, w = window_of(rt)
    steps = w.steps
    sets = timeline_sets(t, w, timeline)
    breakdown, overlap = analyse_timeline(sets, w, timeline)
    exposed = exposed_comm_by_step(t, w, sets)
    in_window = set(distinct(w.step_index[w.step_index >= 0]).tolist())
    step_list = [StepTime(number=int(steps.number[i]),
                          host_s=float(steps.end_ns[i] - steps.start_ns[i]) * 1e-9,
                          in_window=i in in_window, exposed_comm_s=exposed.get(i))
                 for i in range(len(steps))]
    notes = []
    timed = step_list
    if stub_last(t, steps):
        timed = step_list[:-1]
        notes.append(f"ProfilerStep#{step_list[-1].number} ({step_list[-1].host_s * 1e3:.3g} ms) holds no operator: "
                     "a stub the profiler opened as it stopped, left out of the step time")
    if w.excluded_rows:
        notes.append(f"{w.excluded_rows} {timeline} events left out of the window: {w.excluded_why}")
    notes += [f"{n} {what}" for what, n in rt.skipped.items()]
    comms = (gpu_comms if timeline == "gpu" else host_comms)(rt, w, sets.compute)
    comms.rank = rank
    pp = read_rank(rt, w, timeline, comms)
    busy = sets.busy()
    result = RankResult(
        rank=rank, file=rt.path, device=device_name(rt), timeline=timeline,
        breakdown=breakdown, overlap=overlap, steps=step_list,
        step_time_s=float(median([s.host_s for s in timed])) if timed else None,
        top_kernels=top_kernels(t, w.rows, top_n) if timeline == "gpu" else [],
        events=len(t), excluded_events=w.excluded_rows, notes=notes,
        host_ops=host_ops(t, w, DTENSOR_RE) if timeline == "host" else None,
        backward=backward_split(rt, w, timeline, sets.compute),
        action_gaps=action_gaps(pp, busy) if timeline == "gpu" else
        action_gaps(pp, host_gap_busy(t, w.rows, busy, pp), busy))
    return RankSummary(path=rt.path, rank=rt.rank, world_size=rt.world_size, backend=rt.backend,
                       start_epoch_us=rt.start_epoch_us, top_n=top_n, result=result, comms=comms,
                       gantt=gantt_input(rt, w, timeline, sets.compute),
                       pg_config=compact_pg_config(rt.pg_config), pp=pp,
                       gemms=[[op, [list(d) for d in dims], int(n)] for (op, dims), n in rt.gemms.items()],
                       dtensor=bool(t.name_mask(DTENSOR_RE.match).any()), memory=rank_memory(rt, w, timeline),
                       attention=attention_kind(t.symbols.names), host=rt.host, start_epoch_ns=rt.start_epoch_ns)
