"""Typed, versioned analysis results. Every renderer takes a Diagnosis.

The JSON form (`diag analyze --format json`) is these dataclasses encoded as-is;
docs/schema.md documents every field. Times are seconds, ratios are 0..1, a value
the trace cannot give is null (None), never a guess.
"""
from __future__ import annotations

import enum
from dataclasses import field
from typing import Optional

from ..runmeta import RunFacts
from ..trace.columns import median
from ..record import record

SCHEMA_VERSION = "1.23"     # 1.1: stragglers as sets, typed findings, unmeasured wait is null; 1.2: run and facts typed (diag.runmeta), advice_basis, clock alignment; 1.3: flight_recorder; 1.4: memory, Gantt action labels, host_ops; 1.5: flight_recorder world_size, world_known, undumped, backend; 1.6: flight_recorder p2p, taken, verdict_kind, longest_wait_s, timeout_s; 1.7: host_ops' FSDP2 host time; 1.8: MemoryParts.sharding_buffers; 1.9: Straggler.others_wait_s; 1.10: MemoryParts.dp_buckets; 1.11: HostOps.dispatch_mode_per_step_s; 1.12: HostOps' non-ATen figures are self time added up, not calls x median; 1.13: RankResult.backward (BackwardSplit); 1.14: facts.grads_set_to_none, MemoryParts.grads 0 where none are alive at the peak; 1.15: HostOps' FSDP2 dispatch modes; FSDP2's waits for gloo's worker threads neither its own time nor compute; 1.16: facts.host_cpus, ranks_per_host, threads_per_rank; 1.17: RankResult.action_gaps; 1.18: ActionGaps.posts, post_median_s (the transfers' posts); 1.19: ActionGaps.in_flight_s, and on a host timeline its idle_s not covered by a transfer in flight; 1.20: facts.decoder_first/last_pipeline_num_layers (the uneven split); 1.21: facts.sequence_parallel_kind; 1.22: facts.tp_latency_s; 1.23: facts.sp_grad_sync_s


@record
class Breakdown:
    """Where the timeline's time goes. compute + comm + memory + other + idle = span."""

    timeline: str            # "gpu" (all streams merged) or "host" (CPU-only traces)
    window: str              # which events were counted, in words
    span_s: float            # first start to last end of the counted work
    compute_s: float         # covered by compute
    comm_s: float            # covered by communication and not by compute (exposed comm)
    memory_s: float          # memcpy/memset not under compute or comm
    other_s: float           # other GPU activity (sync-like kernels) not under the above
    idle_s: float            # nothing running

    def pct(self, seconds: float) -> float:
        return 100.0 * seconds / self.span_s if self.span_s > 0 else 0.0

    @property
    def non_compute_s(self) -> float:
        return self.comm_s + self.memory_s + self.other_s


@record
class Overlap:
    """How much communication hides behind compute (HTA's comm/comp overlap)."""

    comm_s: float                     # union of all communication
    overlapped_s: float               # communication under compute
    ratio: Optional[float]            # overlapped / comm; None without communication
    exposed_s: float                  # communication not under compute
    exposed_per_step_s: Optional[float]


@record
class StepTime:
    """One profiler step of a rank: its host and GPU time."""

    number: int                       # N of ProfilerStep#N
    host_s: float                     # wall time of the host's step span
    in_window: bool                   # counted in breakdown/overlap
    exposed_comm_s: Optional[float] = None


@record
class KernelStat:
    """One kernel name's count and time on a rank."""

    name: str
    kind: str
    count: int
    total_s: float
    share: float                      # of all kernel time in the window (sum of durations)
    mean_us: float


@record
class HostOps:
    """A host timeline's operators and their fixed cost per step (analysis.hostops)."""

    ops_per_step: float               # host operators (communication calls left out)
    optimizer_ops_per_step: float     # of which inside torch.optim's `Optimizer.*` spans
    aten_ops_per_step: float          # ATen operators outside the optimizer's spans
    aten_op_s: float                  # median self time of an ATen operator: its fixed cost
    framework_per_step_s: float       # non-ATen operators outside the optimizer's spans: their self time
    dtensor_per_step_s: float = 0.0   # of which DTensor's dispatch layer (0 without DTensor)
    dispatch_mode_per_step_s: float = 0.0  # of which Python dispatch modes' calls (PythonDispatchMode)
    # FSDP2's own host time (analysis.hostops), None where the trace has no FSDP2 marks: its spans less the time
    # they hold the thread in communication (its collectives' calls, its waits for those gloo runs on its
    # workers), and DTensor's dispatch inside the optimizer's spans (its sharded parameters)
    fsdp_per_step_s: Optional[float] = None
    fsdp_optimizer_dispatch_per_step_s: Optional[float] = None
    # Python dispatch modes' self time inside FSDP2's spans: of fsdp_per_step_s, and in the time the spans hold
    # the thread in communication (a mode's call around a collective's, inside the dispatcher's call of it)
    fsdp_dispatch_mode_per_step_s: Optional[float] = None
    fsdp_comm_dispatch_mode_per_step_s: Optional[float] = None

    @property
    def fixed_per_step_s(self) -> float:
        """Fixed cost of the operators outside the optimizer: ATen dispatch and framework self time."""
        return self.aten_ops_per_step * self.aten_op_s + self.framework_per_step_s


@record
class ActionGaps:
    """The idle between a rank's consecutive pipeline actions inside its steps (ppactions.action_gaps):
    the pipelining runtime's own host time per action where nothing else runs (its Python between one
    forward or backward and the next, on a GPU the device left waiting for it). The thread's waits for a
    transfer's data and the communication calls it is inside are not idle; a transfer in flight beside it
    is no cover (ppactions.host_gap_busy). The transfers' posts, the thread's host time to hand each send
    or receive to the backend, are counted apart (posts, post_median_s)."""

    idle_s: float                     # over the window's steps
    gaps: int                         # consecutive pairs of actions inside a step
    actions: int                      # actions in the window's steps
    posts: int = 0                    # transfers posted on the main thread in the window's steps
    post_median_s: Optional[float] = None   # the median host span of a post (ppactions._posts)
    in_flight_s: float = 0.0          # of idle_s, what a transfer in flight covered: the breakdown counts it as
                                      # communication, not idle (a host timeline; 0 on a GPU)

    @property
    def per_gap_s(self) -> Optional[float]:
        return self.idle_s / self.gaps if self.gaps else None



@record
class BackwardSplit:
    """The backward pass's compute and the parts of it that hold weight gradients, per step
    (analysis.backward): what the zero-bubble schedule's weight pass ("W") takes out of each backward."""

    backward_s: float                 # compute inside autograd nodes, per step
    weight_gemm_s: float              # of which inside the nodes of layers with a weight (backward.WEIGHT_GEMM_NODES)
    weight_only_s: float = 0.0        # of which inside nodes of weight gradients only (backward.WEIGHT_ONLY_NODES)

    @property
    def weight_share(self) -> Optional[float]:
        """The weight gradients' share of the backward: half the nodes of layers with a weight (their
        input and weight gradients are one GEMM each, of the same FLOPs) and the weight-only nodes;
        None without backward compute."""
        if self.backward_s <= 0:
            return None
        return (0.5 * self.weight_gemm_s + self.weight_only_s) / self.backward_s


@record
class RankResult:
    """Everything measured on one rank."""

    rank: int
    file: str
    device: Optional[str]
    timeline: str
    breakdown: Breakdown
    overlap: Overlap
    steps: list[StepTime] = field(default_factory=list)
    step_time_s: Optional[float] = None   # median host step time
    top_kernels: list[KernelStat] = field(default_factory=list)
    events: int = 0
    excluded_events: int = 0
    notes: list[str] = field(default_factory=list)
    host_ops: Optional[HostOps] = None    # host timelines only: operator counts and fixed costs
    backward: Optional[BackwardSplit] = None  # None where the trace has no autograd nodes' compute
    action_gaps: Optional[ActionGaps] = None  # None where the trace shows no pipeline actions

    @property
    def window_steps(self) -> int:
        """Steps of this rank inside the analysed window (the last step is left out, as HTA does)."""
        return sum(s.in_window for s in self.steps)

    @property
    def window_step_s(self) -> Optional[float]:
        """The median host time of the steps inside the window: what the per-step figures (idle,
        exposed communication) are shares of. The run's step time (`step_time_s`) also counts the
        last step, which the window leaves out; on a GPU trace of two profiled steps the window is the
        first alone, and dividing its idle by the median of both read as 105% of a step."""
        inside = [s.host_s for s in self.steps if s.in_window]
        return float(median(inside)) if inside else self.step_time_s


def steps_in_window(ranks: list[RankResult]) -> int:
    """The job's steps in the analysed window, at least 1: what every per-step figure divides by."""
    return max((r.window_steps for r in ranks), default=0) or 1


WHOLE_TRACE = "whole trace (fewer than two ProfilerSteps)"   # the window convention without step bounds
UNBOUNDED_SPAN = 1.5   # a whole-trace window this many times its steps' length is not made of them


def window_is_steps(ranks: list[RankResult]) -> bool:
    """Whether the per-step figures are per step: every rank's window has ProfilerSteps and they
    bound its work. With fewer than two steps the window is the whole trace; where the work runs
    far past the one step (a host trace whose gloo threads go on for a second after it), the
    figures are the window's, and a share of the step would read as 525%."""
    for r in ranks:
        inside = [s.host_s for s in r.steps if s.in_window]
        if not inside:
            return False
        if r.breakdown.window == WHOLE_TRACE and r.breakdown.span_s > UNBOUNDED_SPAN * sum(inside):
            return False
    return True


def per_what(ranks: list[RankResult]) -> str:
    """"step" or "window": what the per-step figures are per (see `window_is_steps`)."""
    return "step" if window_is_steps(ranks) else "window"


@record
class Problem:
    """A file not analysed, and why."""

    file: str
    problem: str


@record
class Diagnosis:
    """The job's results: what every view and the recommender read (docs/schema.md)."""

    source: str
    world_size: Optional[int]
    backend: Optional[str]
    ranks: list[RankResult]
    missing_ranks: list[int] = field(default_factory=list)   # the first 4,096 (trace.job.MISSING_LISTED)
    missing_count: int = 0                                   # all of them
    problems: list[Problem] = field(default_factory=list)
    other_runs: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    run: Optional[RunFacts] = None        # diag_run.json as written, when the trainer wrote one
    layout: Optional[str] = None          # "layout pp2 × dp2 × tp2, from process-group names"; None: unknown
    layout_dims: Optional[list] = None    # [[axis, size], ...] outermost first, when the grid is known
    facts: RunFacts = field(default_factory=RunFacts)   # the run's facts as used: diag_run.json < --config < flags
                                                # < the trace (GEMM shapes, layout): Megatron names
    comm: Optional["CommAnalysis"] = None
    findings: list["Finding"] = field(default_factory=list)
    pipeline: Optional["Pipeline"] = None
    throughput: Optional["Throughput"] = None
    recommendations: list = field(default_factory=list)   # diag.advise.results.Recommendation, best first
    advice_basis: Optional[object] = None  # diag.advise.results.Basis: what they rest on (set with them)
    gantt: Optional[object] = None        # analysis.gantt.PipelineGantt: one step of every stage
    flight_recorder: Optional["FlightRecord"] = None   # analysis.frresults: hang and timings from FR dumps
    memory: Optional["MemoryUsage"] = None   # measured peak per rank and over time (analysis.memuse)
    schema_version: str = SCHEMA_VERSION
    tool: str = "diag"

    @property
    def host_timeline(self) -> bool:
        """Every rank's timeline is the host's (a CPU-only trace: no GPU activity)."""
        return bool(self.ranks) and all(r.timeline != "gpu" for r in self.ranks)


@record
class CommOpStat:
    """One parallel axis × collective × message-size bucket, over all ranks analysed."""

    axis: str                          # tp | pp | dp | unknown
    op: str                            # all_reduce, all_gather, ...
    size_bucket: str                   # "1-16MiB", or "unknown"
    calls: int                         # instances summed over ranks
    ranks: int
    median_bytes: Optional[float]
    time_s: float                      # per rank (mean over ranks), whole window
    exposed_s: float                   # per rank, not hidden behind compute
    wait_s: Optional[float]            # per rank, waiting for the last rank; None: no instance matched
    busbw_median_gbps: Optional[float]  # GB/s (1e9 B/s), nccl-tests busbw
    busbw_p95_gbps: Optional[float]
    busbw_basis: Optional[str]         # "transfer" (matched across the group) or "kernel (includes wait)"
    link: Optional[str] = None
    link_peak_gbps: Optional[float] = None
    efficiency: Optional[float] = None  # busbw_median / link peak
    achievable_gbps: Optional[float] = None  # `diag bench` busbw at this axis, op and message size
    bench_efficiency: Optional[float] = None  # busbw_median / achievable: in-training link efficiency
    plateau_gbps: Optional[float] = None      # the highest busbw `diag bench` measured for this axis and op
    plateau_bytes: Optional[float] = None     # the smallest measured size reaching 90% of it
    group_size: Optional[int] = None          # n of the bus factor (median): the trace's, else a complete match's


@record
class AxisOverlap:
    """Communication on one parallel axis, and how much of it compute hides."""

    axis: str
    comm_s: float                      # per rank
    exposed_s: float                   # per rank
    hidden_ratio: Optional[float]
    exposed_per_step_s: Optional[float]


@record
class RankComm:
    """One rank's communication time, and what of it waited for others."""

    rank: int
    comm_s: float
    exposed_s: float
    wait_s: Optional[float]            # None: none of its instances matched, so its wait is unmeasured
    matched: int                       # instances matched with their group
    arrived_last: int                  # of those, how often this rank was the last to arrive


class StragglerBasis(str, enum.Enum):
    """What a straggler was found from."""

    COLLECTIVES = "collectives"        # it arrives last at matched collectives
    STEPS = "steps"                    # its median step time stands out


class StragglerKind(str, enum.Enum):
    """The shape of the set of ranks the others wait for."""

    RANK = "rank"                      # one rank
    TURNS = "turns"                    # a few ranks taking turns arriving last
    NODE = "node"                      # every analysed rank of one host (from the trace file names)
    BLOCK = "block"                    # consecutive ranks, their hosts unknown: one node?


@record
class Straggler:
    """A rank, or a set of ranks, that the others waited for."""

    rank: int                          # the member the others waited for most (the only one for kind "rank")
    reason: str                        # in words: "arrives last at collectives", "slow steps", ...
    evidence: str
    ranks: list[int] = field(default_factory=list)   # every member, ascending; [rank] for one rank
    kind: StragglerKind = StragglerKind.RANK
    basis: StragglerBasis = StragglerBasis.COLLECTIVES
    who: str = ""                      # the set in words: "rank 2", "ranks 3 and 6", "ranks 8-15 (node h1)"
    node: Optional[str] = None         # the host, for kind "node"
    # basis "collectives": [rank, ts_us, dur_us] of the members' arrivals at the collectives they
    # delayed, on each member's own trace clock (the file's ts, us): the largest delays, up to 200
    arrivals: list = field(default_factory=list)
    # basis "collectives": what the ranks outside the set lost waiting for it, mean per rank over
    # the window (s); "Where the time goes" shows it per step. None for basis "steps"
    others_wait_s: Optional[float] = None

    def __post_init__(self) -> None:
        self.ranks = self.ranks or [self.rank]
        self.who = self.who or f"rank {self.rank}"


@record
class CommAnalysis:
    """The job's collectives: per op, per axis, per rank, and who was waited for."""

    ops: list[CommOpStat] = field(default_factory=list)
    axes: list[AxisOverlap] = field(default_factory=list)
    ranks: list[RankComm] = field(default_factory=list)
    stragglers: list[Straggler] = field(default_factory=list)
    stragglers_unknown: Optional[str] = None   # why collectives cannot tell who is late (nothing matched)
    notes: list[str] = field(default_factory=list)
    clock: Optional["ClockAlignment"] = None   # the ranks' clocks set against each other (analysis.clocks)


@record
class ClockShift:
    """How one rank's trace clock is moved onto the reference rank's."""

    rank: int
    offset_ns: Optional[int]           # added to the rank's trace times; None: nothing tied it to the reference
    via: Optional[int] = None          # the rank whose clock it was set against (itself for the reference)
    instances: int = 0                 # matched collectives the offset is the median over
    spread_ns: Optional[int] = None    # their median absolute deviation from it: how well the ends agree


@record
class ClockAlignment:
    """Hosts' clocks are not aligned: each rank's offset, from the ends of matched collectives."""

    reference: Optional[int]           # the rank whose clock the others are moved onto; None: none aligned
    shifts: list[ClockShift] = field(default_factory=list)
    basis: str = ("a collective ends at the same moment on every rank of its group (its start differs by "
                  "the wait): per pair of ranks, the median over matched instances of the difference of "
                  "their ends; pairs chained from the reference along the most-matched collectives first, "
                  "pipeline send/recv only where no collective reaches a rank")
    unknown: Optional[str] = None      # why some or all ranks keep their raw clocks


class FindingKind(str, enum.Enum):
    """What a Finding measures, for the rules to test (its `what` is for people)."""

    IDLE = "idle"                      # GPU (or host) idle
    MEMORY = "memory"                  # memory copies not hidden
    COMM = "comm"                      # exposed communication of one axis
    STRAGGLER = "straggler"            # the others waiting for a rank or a set of ranks


@record
class Finding:
    """One way a step loses time, in seconds per step: the report leads with the biggest."""

    what: str                          # "exposed DP communication", "GPU idle", ...
    seconds_per_step: float
    share_of_step: Optional[float]     # of the median step in the window; None when steps are unknown
    detail: str
    kind: FindingKind
    ranks: list[int] = field(default_factory=list)   # kind "straggler": the ranks waited for


@record
class PipelineStage:
    """One pipeline stage: its ranks, time and bubble."""

    stage: int                         # pp rank
    ranks: list[int]
    bubble_s: Optional[float]          # per step: waiting on pipeline neighbours; None: the trace cannot show it
    bubble_fraction: Optional[float]   # of the step
    compute_s: float                   # per step, busy computing (for balance between stages)
    unknown: Optional[str] = None      # why bubble_s is None
    order: list[str] = field(default_factory=list)   # one step's actions as torch names them: "2F0", "B1"


@record
class Pipeline:
    """The pipeline: its schedule, stages and bubble."""

    p: int
    m: Optional[int]                   # micro-batches per step
    v: int                             # virtual stages per rank (1 = not interleaved)
    schedule: Optional[str]            # diag's names: 1f1b, gpipe, interleaved-1f1b, looped-bfs, zb1p, zbv, dualpipev
    ideal_fraction: Optional[float]    # of the step
    convention: str
    stages: list[PipelineStage] = field(default_factory=list)
    measured: str = ("time a stage's ranks wait on their pipeline neighbours, per step, as a fraction of "
                     "the step: on a GPU timeline the pipeline send/recv kernels not under compute; on a "
                     "host timeline the main thread blocked in a pipeline send/recv or in its wait")
    source: Optional[str] = None       # where schedule, m and v came from
    unknown: list[str] = field(default_factory=list)   # what could not be read, and why


@record
class Throughput:
    """Step time, tokens per second and MFU, where known."""

    step_time_s: Optional[float]
    gpus: Optional[int]
    tokens_per_step: Optional[float]
    tokens_per_s_per_gpu: Optional[float]
    model_flops_per_step: Optional[float]
    mfu: Optional[float]
    peak_flops: Optional[float]
    peak_source: Optional[str]
    convention: str = "model FLOPs = 6·N·tokens + 12·L·h·s·tokens (PaLM / torchtitan), N without input embedding"
    unknown: list[str] = field(default_factory=list)


@record
class RankPeak:
    """One rank's peak memory as its trace's memory events measured it."""

    rank: int
    stage: Optional[int]               # pp rank; None when the layout is unknown
    peak_bytes: Optional[int]          # the largest `Total Allocated` in the window; None: unknown (why)
    device: Optional[str]              # whose allocator: "GPU 0", "CPU"
    events: int                        # memory events of that device in the window
    why: Optional[str] = None          # why peak_bytes is unknown
    lower_bound: bool = False          # the CPU allocator counts only what was allocated while profiling


@record
class MemoryCurve:
    """Allocated bytes over time on one rank: one line per pipeline stage in the charts."""

    stage: Optional[int]               # None: the layout is unknown, the rank stands for the job
    rank: int                          # the stage's rank with the highest peak
    t_s: list[float]                   # seconds after the rank's first step starts (or first memory event)
    allocated_bytes: list[int]         # the largest `Total Allocated` in each time bucket: the peak is a point


@record
class MemoryParts:
    """What the memory model (diag.advise.memory) says one stage's peak is made of, bytes."""

    stage: int
    weights: float
    grads: float
    optimizer: float
    activations: float
    total: float
    other: float = 0.0                 # calibrated: measured - modelled peak, held (any sign)
    sharding_buffers: float = 0.0      # ZeRO-3 (FSDP2): gathered weights and deferred unsharded gradients
    dp_buckets: float = 0.0            # replicated DP's gradient buckets beside the gradients (DDP's default)


@record
class MemoryUsage:
    """Measured memory: the peak per rank, its curve per stage, and where the job's peak
    (facts.peak_memory_bytes, what the memory model is calibrated on) came from."""

    peak_source: Optional[str]         # "diag_run.json", "trace memory events", ...; None: unknown
    ranks: list[RankPeak] = field(default_factory=list)
    curves: list[MemoryCurve] = field(default_factory=list)
    unknown: Optional[str] = None      # why the peak is not known: what would make it known
    model: list[MemoryParts] = field(default_factory=list)   # per stage, set with the recommendations
    model_basis: Optional[str] = None  # how the model was calibrated, or why it was not
