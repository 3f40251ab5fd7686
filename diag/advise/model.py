"""Step-time model of a 3D-parallel (TP x PP x DP, and context parallel: CP) GPT training step.

Problem: to predict what a configuration change buys (recommendations) and to test the
analyser against traces whose truth is known (synth.py), diag needs one model of where a
step's time goes. This module simulates, event by event, the programs schedule.py writes
for every rank: compute runs for its given time; a collective starts when all of its
group has arrived and each rank's op lasts from its own arrival to the end of the
transfer; a pipeline receive lasts from when the stage is ready until the data is there.
The result is a per-rank Timeline from which step time, bubble and overlap follow.
docs/model.md lists what the model assumes and what it ignores.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..analysis.bandwidth import bus_factor
from ..layout import RankGrid
from ..trace.columns import median
from ..trace.kinds import Coll
from .memory import ZERO_STAGES
from .schedule import POSTED_SCHEDULES, SCHEDULES, WEIGHT_SHARE, Engine, Place, StageCosts, step_program
from ..record import record

WARMUP_STEPS = 1      # simulated and dropped, so every kept step is in steady state
# The simulation's work: ranks x steps x micro-batches x layers per stage, each a few events in
# Python (about 4,000 of these units a second). Sizes come from traces, diag_run.json and flags, so a
# claimed 10^9 layers or 2^40 micro-batches would run for ever: past this, no simulation.
MAX_SIM_UNITS = 200_000


class ModelTooBig(ValueError):
    """A configuration past MAX_SIM_UNITS: the model does not simulate it."""


# The least ZeRO stage FSDP2 implements (ZeRO-2: reshard_after_forward=False; ZeRO-3: True): its own
# host time (Workload.fsdp_*) is paid from this stage up. ZeRO-1 is torch's ZeroRedundancyOptimizer
# or Megatron-LM's distributed optimizer, not FSDP2.
FSDP_MIN_ZERO = 2


def _units_per_pass(config: "Config") -> int:
    """At CP c each layer's backward also holds c permutes of dK and dV (one per ring step), so a
    layer pass counts 1 + c/4 units (a pass is about four events)."""
    return 1 + config.cp // 4 if config.cp > 1 else 1


def sim_units(workload: "Workload", config: "Config", steps: int, ranks: Optional[int] = None) -> int:
    """Layer passes to simulate (_units_per_pass each)."""
    return (ranks or config.grid.world_size) * (steps + WARMUP_STEPS) * config.num_micro_batches * \
        max(1, workload.num_layers // config.pp) * _units_per_pass(config)


@record(frozen=True)
class Workload:
    """What one step costs, calibrated for the unsharded model (TP = PP = 1)."""

    num_layers: int
    fwd_s_per_layer: float          # forward of one layer, one micro-batch, TP = 1
    bwd_ratio: float = 2.0          # backward / forward
    tp_bytes_per_layer: float = 0.0  # bytes of each TP all-reduce (2 in forward, 2 in backward per layer)
    cp_bytes_per_layer: float = 0.0  # CP: K and V of the whole sequence, one micro-batch, TP = 1: what each
                                     # layer all-gathers over the CP group (docs/model.md); / tp per rank
    cp_grad_bytes_per_layer: float = 0.0  # CP: dK and dV of the whole sequence, one micro-batch, TP = 1, in the
                                          # dtype torch passes them round the ring in; 0: twice cp_bytes_per_layer
                                          # (16-bit K and V, dK and dV accumulated in fp32: torch's default)
    p2p_bytes: float = 0.0          # activation bytes sent between stages per micro-batch
    grad_bytes: float = 0.0         # gradient bytes of the whole unsharded model
    optimizer_s: float = 0.0        # at TP = PP = 1; scales 1 / (tp * pp)
    launch_overhead_s: float = 0.0  # added to every compute kernel
    action_host_s: float = 0.0      # the pipelining runtime's time between two actions of a stage (its host
                                    # work where nothing else runs: analysis ActionGaps), paid before every
                                    # action but a step's first, with PP > 1: held per action when the
                                    # schedule or the micro-batches change
    post_host_s: float = 0.0        # torch's multi-stage runtime (schedule.POSTED_SCHEDULES) runs each transfer's
                                    # post (send or receive) as an action of its own: the thread's time to post
                                    # one, paid after each receive and before each send under those schedules
    recompute: str = "none"         # "none" | "full" (one more forward per micro-batch in backward)
    host_fixed_s_per_layer: float = 0.0  # host operators' fixed cost, one layer, one micro-batch, forward +
                                         # backward: the same at any micro-batch size and TP (CPU timelines)
    dtensor_s_per_layer: float = 0.0     # DTensor's dispatch, one layer, one micro-batch: paid at TP > 1 only
    fsdp_s_per_layer: float = 0.0        # FSDP2's own host time (its hooks and copies, collectives left out),
                                         # one layer, one micro-batch, forward + backward: paid under ZeRO-2/3,
                                         # which FSDP2 implements (reshard_after_forward False / True)
    fsdp_optimizer_s_per_layer: float = 0.0  # DTensor's dispatch in the optimizer step over FSDP2's sharded
                                             # parameters, one layer's, once a step: paid under ZeRO-2/3
    param_bytes: float = 0.0        # parameter bytes of the whole unsharded model as ZeRO all-gathers them;
                                    # 0: as many as the gradients (fp32 parameters)
    blocking_gathers: bool = False  # ZeRO-3's gathers and scatters hold the issuing thread (a host timeline:
                                    # gloo runs the collective in the call), so no prefetch hides them
    weight_share: float = WEIGHT_SHARE  # the weight gradients' share of a layer's backward: what the zero-
                                        # bubble schedule's W pass defers (analysis.backward measures it)
    split_backward_extra: float = 0.0   # zero bubble: what torch's split backward (input gradients, then weight
                                        # gradients: two autograd passes) takes over the fused backward, a share
                                        # of it, on a stage whose input needs a gradient (all but the first),
                                        # paid in the weight pass (the input pass costs the fused backward's
                                        # input share); measured on CPU (calibrate.SPLIT_BACKWARD_EXTRA), 0 where
                                        # unknown
    split_backward_host_s: float = 0.0  # zero bubble on a GPU: the host seconds torch's split backward adds a layer
                                        # and micro-batch on such a stage, where the GPU waits on the host
                                        # (calibrate.SPLIT_BACKWARD_HOST_S); 0 where kernels hide it
    # sequence parallelism (docs/model.md). A run that had it paid its collectives and its norms' gradient
    # reductions in what was measured; one switched to it (Config.sequence_parallel) pays them on top:
    sequence_parallel: bool = False  # the measured run had sequence parallelism
    sp_tp_factor: float = 1.0       # its all-gather and reduce-scatter against the all-reduce they replace, the
                                    # same bytes: 1 on NCCL's ring; 1.5 on gloo, whose reduce-scatter runs a
                                    # whole all-reduce (calibrate.SP_TP_FACTOR)
    sp_sync_call_s: float = 0.0     # one reduction of the norms' gradients, which SP leaves partial over TP: a
                                    # small TP all-reduce, latency-bound (calibrate); 0 where unknown
    sp_sync_calls_per_layer: float = 0.0   # such calls a step per layer (torch's DTensor: one per norm parameter
                                           # each time the optimizer reads its gradient)
    sp_sync_calls_per_stage: float = 0.0   # and per stage (Megatron-LM: its one coalesced all-reduce)
    sp_sync_calls_last_stage: float = 0.0  # and on the last stage only (the final norm's, under DTensor)
    shared_cores: bool = False      # the ranks' compute threads take every core of their host and gloo runs
                                    # the collectives on those cores (a CPU run, diag_run.json's host facts):
                                    # a DP reduction overlapped with backward takes its time from the compute,
                                    # so the model hides none of it (docs/model.md)

    def __post_init__(self) -> None:
        if not isinstance(self.num_layers, int) or self.num_layers < 1:
            raise ValueError(f"num_layers must be a positive integer, got {self.num_layers!r}")
        if not self.fwd_s_per_layer > 0 or not self.bwd_ratio > 0:
            raise ValueError("fwd_s_per_layer and bwd_ratio must be > 0")
        for name in ("tp_bytes_per_layer", "cp_bytes_per_layer", "cp_grad_bytes_per_layer", "p2p_bytes", "grad_bytes", "optimizer_s", "launch_overhead_s", "action_host_s", "post_host_s",
                     "host_fixed_s_per_layer", "dtensor_s_per_layer", "fsdp_s_per_layer",
                     "fsdp_optimizer_s_per_layer", "param_bytes", "split_backward_extra", "split_backward_host_s",
                     "sp_sync_call_s", "sp_sync_calls_per_layer", "sp_sync_calls_per_stage", "sp_sync_calls_last_stage"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 < self.weight_share < 1:
            raise ValueError(f"weight_share must be in (0, 1), got {self.weight_share!r}")
        if self.recompute not in ("none", "full"):
            raise ValueError(f"recompute must be 'none' or 'full', got {self.recompute!r}")
        if not self.sp_tp_factor >= 1:
            raise ValueError(f"sp_tp_factor must be >= 1, got {self.sp_tp_factor!r}")


@record(frozen=True)
class Config:
    """The parallel layout and schedule (Megatron-LM flags in docs/model.md)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    num_micro_batches: int = 1
    micro_batch_size: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    overlap_grad_reduce: bool = False
    bucket_bytes: float = 40e6
    zero: int = 0                   # ZeRO stage over the DP ranks (docs/model.md): 0 all-reduce, 1-2 reduce-
                                    # scatter + parameter all-gather, 3 per-layer all-gathers (FSDP)
    cp: int = 1                     # context parallel: the sequence split cp ways (--context-parallel-size);
                                    # gradients reduced over dp x cp ranks
    sequence_parallel: bool = False  # --sequence-parallel: priced where the measured run had none (Workload)

    @property
    def grad_ranks(self) -> int:
        """The ranks the gradients are reduced (or ZeRO-sharded) over: DP x CP (Megatron-LM's
        DATA_PARALLEL_GROUP_WITH_CP, torchtitan's dp_shard_cp / dp_cp)."""
        return self.dp * self.cp

    @property
    def optimizer_ranks(self) -> int:
        """The ranks one step's optimizer work (Workload.optimizer_s) is split over: TP x PP, and
        the gradient ranks too under ZeRO, whose optimizer states are sharded over them."""
        return self.tp * self.pp * (self.grad_ranks if self.zero and self.grad_ranks > 1 else 1)

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "num_micro_batches", "micro_batch_size", "virtual_stages", "cp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Config.{name} must be a positive integer, got {v!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError("virtual_stages > 1 needs the interleaved schedule")
        if not self.bucket_bytes > 0:
            raise ValueError(f"bucket_bytes must be > 0, got {self.bucket_bytes!r}")
        if self.zero not in ZERO_STAGES or isinstance(self.zero, bool):
            raise ValueError(f"Config.zero must be one of {ZERO_STAGES}, got {self.zero!r}")

    @property
    def grid(self) -> RankGrid:
        return RankGrid(tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp)

    def check(self, workload: Workload) -> None:
        chunks = self.pp * self.virtual_stages
        if workload.num_layers % chunks:
            raise ValueError(f"num_layers {workload.num_layers} is not divisible by pp x virtual stages = {chunks}")


@record(frozen=True)
class Links:
    """nccl-tests bus bandwidth (bytes/s) per axis and a fixed latency per communication op."""

    tp: float = math.inf
    pp: float = math.inf
    dp: float = math.inf
    latency_s: float = 0.0
    cp: float = math.inf
    dp_latency_s: float = 0.0       # more per DP collective (ZeRO's gathers and scatters, the gradient buckets):
                                    # what a call costs beyond its bytes at the busbw (calibrate: as paid)

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Links.{name} busbw must be > 0 bytes/s, got {getattr(self, name)!r}")
        if not self.latency_s >= 0 or not self.dp_latency_s >= 0:
            raise ValueError("latency_s and dp_latency_s must be >= 0")


def allreduce_s(nbytes: float, n: int, busbw: float, latency_s: float = 0.0) -> float:
    """nccl-tests: busbw = S / t * 2(n-1)/n, so t = S * 2(n-1)/n / busbw (plus latency)."""
    if n <= 1:
        return 0.0
    return latency_s + nbytes * bus_factor(Coll.ALL_REDUCE, n) / busbw


def gather_s(nbytes: float, n: int, busbw: float, latency_s: float = 0.0) -> float:
    """All-gather or reduce-scatter of S bytes (the whole output / input, as nccl-tests counts):
    t = S * (n-1)/n / busbw (plus latency): half an all-reduce of the same S."""
    if n <= 1:
        return 0.0
    return latency_s + nbytes * bus_factor(Coll.ALL_GATHER, n) / busbw


def p2p_s(nbytes: float, busbw: float, latency_s: float = 0.0) -> float:
    return latency_s + nbytes * bus_factor(Coll.SEND, 2) / busbw


def _even(nbytes: float) -> int:
    """Whole bf16 elements: traces give sizes as element counts x 2 bytes."""
    return int(2 * round(nbytes / 2))


def dp_buckets(layers: int, bytes_per_layer: float, c: Config, links: Links) -> tuple:
    """Gradient buckets in backward order (last layer first): (closing layer, bytes, seconds);
    all-reduced over DP x CP, or reduce-scattered under ZeRO-1/2; none under ZeRO-3 (per layer instead)."""
    n = c.grad_ranks
    if n == 1 or c.zero >= 3:
        return ()
    sync = gather_s if c.zero else allreduce_s
    out, acc = [], 0.0
    for layer in range(layers):
        acc += bytes_per_layer
        if acc >= c.bucket_bytes or layer == layers - 1:
            b = _even(acc)
            out.append((layer, b, sync(b, n, links.dp, links.latency_s + links.dp_latency_s)))
            acc = 0.0
    return tuple(out)


def host_fixed_s(w: Workload, c: Config, zero: int) -> tuple[float, float]:
    """(forward, backward) fixed host seconds of one layer and micro-batch: the host operators'
    fixed cost, with DTensor's dispatch at TP > 1 and FSDP2's own time under ZeRO-2/3 (zero: the
    stage in effect), split between the passes as compute is."""
    fixed = w.host_fixed_s_per_layer + (w.dtensor_s_per_layer if c.tp > 1 else 0.0) \
        + (w.fsdp_s_per_layer if zero >= FSDP_MIN_ZERO else 0.0)
    return fixed / (1 + w.bwd_ratio), fixed * w.bwd_ratio / (1 + w.bwd_ratio)


def sp_costs(w: Workload, c: Config, layers: int, stage: int) -> tuple[float, float]:
    """What switching to sequence parallelism (c.sequence_parallel, where the measured run had none) costs
    a rank of `stage` with `layers` layers: (the factor on each TP all-reduce's time, now an all-gather and a
    reduce-scatter of the same bytes; seconds a step reducing the norms' gradients, which SP leaves partial
    over TP, before the optimizer uses them). (1, 0) at TP 1, without the switch, or for a run that had it
    (its measured TP link and step hold both)."""
    if not (c.sequence_parallel and not w.sequence_parallel and c.tp > 1):
        return 1.0, 0.0
    calls = (w.sp_sync_calls_per_layer * layers + w.sp_sync_calls_per_stage
             + (w.sp_sync_calls_last_stage if stage == c.pp - 1 else 0.0))
    return w.sp_tp_factor, calls * w.sp_sync_call_s


def stage_costs(w: Workload, c: Config, links: Links, slowdown: float = 1.0, stage: int = 0) -> StageCosts:
    """One rank's costs. CP c splits the sequence: compute, the TP all-reduces and the pipeline
    messages are 1/c per rank; each layer all-gathers K and V over the CP group (cp_s) and, in backward,
    passes its shard of dK and dV round the ring in c permutes (cp_dkv_s each). Under the zero-bubble
    schedule a stage past the first pays torch's split backward's extra: Workload.split_backward_extra in its weight
    passes (the input pass, which the previous stage waits for, costs the fused backward's input share), and its host
    time where the GPU waits on the host, Workload.split_backward_host_s, shared by both passes as the backward is."""
    layers = w.num_layers // c.pp
    f = w.fwd_s_per_layer / (c.tp * c.cp) * slowdown
    zb = c.schedule == "zb1p" and stage > 0
    split, split_host = (w.split_backward_extra, w.split_backward_host_s) if zb else (0.0, 0.0)
    tp_bytes, pp_bytes = _even(w.tp_bytes_per_layer / c.cp), _even(w.p2p_bytes / c.cp)
    cp_bytes = _even(w.cp_bytes_per_layer / c.tp) if c.cp > 1 else 0
    dkv = (w.cp_grad_bytes_per_layer or 2.0 * w.cp_bytes_per_layer) / (c.tp * c.cp)
    cp_dkv = _even(dkv) if c.cp > 1 else 0
    n_grad = c.grad_ranks
    zero = c.zero if n_grad > 1 else 0
    hf, hb = host_fixed_s(w, c, zero)
    grad_layer = w.grad_bytes / (c.tp * w.num_layers)
    param_layer = (w.param_bytes or w.grad_bytes) / (c.tp * w.num_layers)
    ag_stage = _even(param_layer * layers) if zero in (1, 2) else 0
    ag_layer, rs_layer = (_even(param_layer), _even(grad_layer)) if zero >= 3 else (0, 0)
    gather = (lambda b: gather_s(b, n_grad, links.dp, links.latency_s + links.dp_latency_s) if b else 0.0)
    sp_tp, sp_sync = sp_costs(w, c, layers, stage)
    return StageCosts(
        layers=layers, fwd_half_s=(f + hf) / 2 + w.launch_overhead_s,
        bwd_half_s=(f * w.bwd_ratio + hb + split_host) / 2 + w.launch_overhead_s, weight_extra_s=f * w.bwd_ratio * split,
        recompute_s=f + hf + 2 * w.launch_overhead_s if w.recompute == "full" else 0.0,   # a forward: 2 kernels
        tp_ar_s=allreduce_s(tp_bytes, c.tp, links.tp, links.latency_s) * sp_tp, tp_bytes=tp_bytes,
        p2p_s=p2p_s(pp_bytes, links.pp, links.latency_s), p2p_bytes=pp_bytes,
        buckets=dp_buckets(layers, grad_layer, c, links),
        optimizer_s=w.optimizer_s / c.optimizer_ranks
        + (w.fsdp_optimizer_s_per_layer * layers if zero >= FSDP_MIN_ZERO else 0.0) + sp_sync, overlap_dp=c.overlap_grad_reduce and not w.shared_cores, tp=c.tp,
        chunks=c.virtual_stages, weight_share=w.weight_share, zero=zero, blocking_gathers=w.blocking_gathers, param_ag_s=gather(ag_stage), param_ag_bytes=ag_stage,
        layer_ag_s=gather(ag_layer), layer_ag_bytes=ag_layer, layer_rs_s=gather(rs_layer), layer_rs_bytes=rs_layer,
        cp=c.cp, cp_s=gather_s(cp_bytes, c.cp, links.cp, links.latency_s), cp_bytes=cp_bytes,
        cp_dkv_s=gather_s(cp_dkv, c.cp, links.cp, links.latency_s), cp_dkv_bytes=cp_dkv,
        action_s=w.action_host_s if c.pp > 1 else 0.0,
        post_s=w.post_host_s if c.pp > 1 and c.schedule in POSTED_SCHEDULES else 0.0)


def place(grid: RankGrid, rank: int) -> Place:
    co = grid.coords(rank)
    def nb(s): return grid.rank(tp=co.tp_rank, cp=co.cp_rank, pp=s, dp=co.dp_rank) if 0 <= s < grid.pp else None
    return Place(rank=rank, stage=co.pp_rank, stages=grid.pp, tp_group=tuple(grid.group_of(rank, "tp")),
                 dp_group=tuple(grid.group_of(rank, ("dp", "cp"))), pp_group=tuple(grid.group_of(rank, "pp")),
                 prev_rank=nb(co.pp_rank - 1), next_rank=nb(co.pp_rank + 1), cp_group=tuple(grid.group_of(rank, "cp")))


def _merge(starts, ends) -> list:
    """Union of intervals as a sorted list of disjoint [start, end)."""
    out: list = []
    for s, e in sorted(zip(starts, ends)):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _overlap(a: list, b: list) -> float:
    """Length of the intersection of two disjoint, sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@record(frozen=True)
class RankOps:
    """One rank's GPU operations, columnar, in start order, with its step boundaries."""

    rank: int
    start_s: np.ndarray
    dur_s: np.ndarray
    kind: tuple                     # "compute" | "comm"
    name: tuple
    axis: tuple                     # "tp" | "cp" | "pp" | "dp" | None
    op: tuple                       # "all_reduce" | "all_gather" | "reduce_scatter" | "send" | "recv" | None
    nbytes: np.ndarray
    group: tuple                    # member ranks of the op's process group
    step: np.ndarray
    stream: tuple                   # "main" | "dp" | "ag" | "rs" (schedule.STREAMS)
    step_start_s: np.ndarray        # steps + 1 values: each step's start, then the last step's end

    def __post_init__(self) -> None:
        n = self.start_s.size
        if any(len(c) != n for c in (self.dur_s, self.kind, self.name, self.axis, self.op,
                                     self.nbytes, self.group, self.step, self.stream)):
            raise ValueError("RankOps columns differ in length")
        if np.any(np.diff(self.step_start_s) < 0):
            raise ValueError("step boundaries must not decrease")

    @classmethod
    def from_rows(cls, rank: int, rows: list, bounds: list) -> "RankOps":
        cols = list(zip(*rows)) if rows else [()] * 10
        return cls(rank, np.array(cols[0], float), np.array(cols[1], float), tuple(cols[2]), tuple(cols[3]),
                   tuple(cols[4]), tuple(cols[5]), np.array(cols[6], np.int64), tuple(cols[7]),
                   np.array(cols[8], np.int64), tuple(cols[9]), np.array(bounds, float))

    def __len__(self) -> int:
        return int(self.start_s.size)

    def step_durations(self) -> np.ndarray:
        return np.diff(self.step_start_s)

    def select(self, steps=None, kind=None, axis=None) -> np.ndarray:
        """Boolean mask of ops in `steps` (all if None) of a kind and axis (any if None)."""
        m = np.ones(len(self), bool) if steps is None else np.isin(self.step, list(steps))
        if kind is not None:
            m &= np.array([k == kind for k in self.kind], bool)
        if axis is not None:
            m &= np.array([a == axis for a in self.axis], bool)
        return m

    def pp_time_per_step(self, steps=None) -> float:
        m = self.select(steps, "comm", "pp")
        return float(self.dur_s[m].sum()) / (len(set(self.step[self.select(steps)].tolist())) or 1)

    def hidden_fraction(self, axis=None, steps=None) -> Optional[float]:
        """|comm ∩ compute| / |comm| (HTA's comm/comp overlap); None without communication."""
        c, x = self.select(steps, "comm", axis), self.select(steps, "compute")
        comm = _merge(self.start_s[c], self.start_s[c] + self.dur_s[c])
        total = sum(e - s for s, e in comm)
        if total <= 0:
            return None
        return _overlap(comm, _merge(self.start_s[x], self.start_s[x] + self.dur_s[x])) / total


@record(frozen=True)
class Timeline:
    """Every rank's operations over `steps` steady-state steps."""

    ranks: tuple
    grid: RankGrid
    steps: int

    def __post_init__(self) -> None:
        if len(self.ranks) != self.grid.world_size:
            raise ValueError("one RankOps per rank of the grid")

    @property
    def step_time_s(self) -> float:
        """Median step duration of the slowest rank (in steady state all ranks agree)."""
        return float(max(median(r.step_durations()) for r in self.ranks))

    def stage_bubble(self) -> dict:
        """Per stage: mean over its ranks of PP send/recv time per step / step time."""
        out = {}
        for s in range(self.grid.pp):
            rs = [r for r in self.ranks if self.grid.coords(r.rank).pp_rank == s]
            out[s] = float(np.mean([r.pp_time_per_step() / median(r.step_durations()) for r in rs]))
        return out


def simulate(workload: Workload, config: Config, links: Links, steps: int = 1,
             stage_slowdown: Optional[dict] = None, rank_delay: Optional[dict] = None,
             fold_tp: bool = False) -> Timeline:
    """Timeline of `steps` steady-state steps of every rank (one warm-up step is run and dropped).

    stage_slowdown {stage: factor} scales a stage's compute (imbalance); rank_delay {rank: s}
    holds one rank back by s seconds at the start of each step (a straggler), or by s[k % len(s)]
    at the start of step k when s is a sequence (ranks taking turns being late).
    fold_tp: simulate one rank of each TP group and of each CP group (the Timeline's grid has tp 1 and
    cp 1), its TP all-reduces and CP exchanges lasting what they last over config.tp and config.cp (and
    its gradient reductions what they last over dp x cp): the members of a TP or CP group run the same
    program and arrive together, so the step is the same (tests/test_model.py, tests/test_cp.py) at
    1/(tp cp) of the cost. Not with rank_delay.
    """
    config.check(workload)
    if steps < 1:
        raise ValueError("steps must be >= 1")
    if fold_tp and rank_delay:
        raise ValueError("fold_tp needs every TP and CP member alike: no rank_delay")
    grid = RankGrid(tp=1, pp=config.pp, dp=config.dp) if fold_tp else config.grid
    units = sim_units(workload, config, steps, grid.world_size)
    if units > MAX_SIM_UNITS:
        raise ModelTooBig(f"the step-time model would simulate {units:,} layer passes ({grid.world_size:,} "
                         f"ranks x {steps + WARMUP_STEPS} steps x {config.num_micro_batches:,} micro-batches x "
                         f"{max(1, workload.num_layers // config.pp):,} layers per stage"
                         f"{f' x {_units_per_pass(config)} for CP {config.cp} ring steps' if config.cp > 1 else ''}), past its limit of "
                         f"{MAX_SIM_UNITS:,}: not simulated")
    slow, delay = stage_slowdown or {}, rank_delay or {}
    costs = {s: stage_costs(workload, config, links, slow.get(s, 1.0), s) for s in range(config.pp)}
    programs = {}
    for r in range(grid.world_size):
        pl = place(grid, r)
        streams: dict = {}
        for k in range(-WARMUP_STEPS, steps):
            prog = step_program(config.schedule, config.num_micro_batches, pl, costs[pl.stage], k,
                                _delay_at(delay.get(r, 0.0), k))
            for name, ins in prog.items():
                streams.setdefault(name, []).extend((k, i) for i in ins)
        programs.update({(r, name): ins for name, ins in streams.items()})
    records, marks, ends = Engine(programs).run()
    return _timeline(grid, steps, records, marks, ends)


def _delay_at(delay, k: int) -> float:
    """A rank's delay at step k (negative in warm-up): the same every step, or its turn in a cycle."""
    return float(delay) if np.isscalar(delay) else float(delay[k % len(delay)])


def _timeline(grid: RankGrid, steps: int, records, marks, ends) -> Timeline:
    t0 = min(marks[r][WARMUP_STEPS] for r in marks)
    ranks = []
    for r in range(grid.world_size):
        rows = sorted(x for x in records[r] if x[8] >= 0)
        bounds = [m - t0 for m in marks[r][WARMUP_STEPS:]] + [ends[r] - t0]
        ranks.append(RankOps.from_rows(r, [(x[0] - t0,) + x[1:] for x in rows], bounds))
    return Timeline(ranks=tuple(ranks), grid=grid, steps=steps)


def step_time(workload: Workload, config: Config, links: Links, **kw) -> float:
    """Seconds per steady-state step (one rank of each TP and CP group simulated where they are alike)."""
    return simulate(workload, config, links, steps=2, fold_tp=not kw.get("rank_delay"), **kw).step_time_s


def bubble_fraction(workload: Workload, config: Config, links: Links, **kw) -> dict:
    """Per pipeline stage: time in PP send/recv (waiting on neighbours, not computing) / step."""
    return simulate(workload, config, links, steps=2, **kw).stage_bubble()
