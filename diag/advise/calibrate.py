"""Calibrate the step-time model on a measured run, so that its predictions start from it.

Problem: a recommendation's predicted gain is only as good as the model's inputs. This
module derives them from a Diagnosis and the trainer's diag_run.json, not from constants:
per-layer forward time from the measured compute per stage per step, a per-kernel launch
overhead from the measured idle time, on a host (CPU) timeline the operators' fixed cost per
layer and micro-batch and DTensor's dispatch (analysis.hostops) apart from the compute that
scales with the micro-batch, the busbw of each axis from the collectives matched
across their group (basis "transfer"; else one rank's kernel time, which includes wait).
What it has to assume is said, in `Calibration.assumptions`.

Predictions keep the model's residual: predicted = measured + (model(new) - model(now)),
so time the model does not see (optimizer, data, host stalls) is held constant.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Optional

import numpy as np

from ..runmeta import RunFacts
from ..analysis.bandwidth import bus_factor
from ..analysis.results import Diagnosis, FindingKind, steps_in_window
from ..trace.columns import median
from ..trace.kinds import Coll, dtype_bytes
from .memory import zero_stage
from .model import FSDP_MIN_ZERO, Config, Links, ModelTooBig, Workload, allreduce_s, gather_s, step_time
from .schedule import WEIGHT_SHARE
from ..record import record

BWD_RATIO = 2.0
# The untraced steps' median must be this much shorter than the traced step for the profiler's cost
# to be fitted: closer, the difference is within the spread of a median of a few steps.
UNTRACED_MARGIN = 0.01
HALVES = 4            # compute kernels per layer per micro-batch in the model: 2 forward, 2 backward
RECOMPUTE_HALVES = 2  # and under full recompute the forward's 2 again, each paying a launch overhead
# torch's split backward (ScheduleInterleavedZeroBubble: the input gradients, then the weight gradients, in two
# autograd passes) over the fused backward on a stage past the first, on a host timeline: measured on CPU with torch
# 2.13, the trainer's zero-bubble job against its 1F1B job, backward over forward per step in six pairs of
# untraced runs, 1.10-1.18x (median 1.14); the first stage, whose input needs no gradient, 0.92-1.04x; a second
# machine, 1.07-1.12x (median 1.10, six pairs). It is paid in the weight passes (model.stage_costs): timed pass by
# pass, the input pass costs the fused backward's input share and the weight pass carries the rest
# (benchmarks/README.md). On a GPU: below.
SPLIT_BACKWARD_EXTRA = 0.14
# On a GPU the split's extra is host time: torch's two autograd passes take 1.6-2.8x the fused backward's wall time
# where the GPU waits on the host, 1.04-1.24x at h 4096-8192. Issued as a schedule issues them (F, I, then the
# previous micro-batch's W, no synchronisation between), they add 1.1-1.7 ms a layer and micro-batch where the
# GPU waits on the host (h 512-1024; the median, 1.45 ms, is priced there) and 0.1-0.5 ms (1-3% of the
# forward and backward) at h 4096-8192, where queued kernels hide it. Measured on an H200, torch 2.11, bf16
# (benchmarks/split_backward.py; benchmarks/README.md).
SPLIT_BACKWARD_HOST_S = 1.45e-3
# Sequence parallelism switched on (model.sp_costs). Its all-gather and reduce-scatter against the all-reduce
# they replace, at the same bytes: NCCL's ring moves (n-1)/n S in each, 2(n-1)/n S in the all-reduce (1);
# gloo's reduce-scatter runs a whole all-reduce (ProcessGroupGloo), so it pays an all-gather more: 1.5
# (2 ranks here: 1 MiB all-reduce 1.9-3.1 ms, reduce-scatter 1.9-3.2, all-gather 1.1-1.5; benchmarks/README.md).
SP_TP_FACTOR = {"gloo": 1.5, "nccl": 1.0, "rccl": 1.0}
SMALL_CALL_BYTES = 64 * 1024   # a TP collective this small or smaller costs its latency: the norms' reductions'
# The norms' gradients SP leaves partial over TP. torch's DTensor reduces a partial gradient each time an op
# reads it, and AdamW reads each three times (lerp_ once, addcmul_(grad, grad) twice): the trainer's TP 2 run
# made 54 such calls a step for its 18 norm parameters. Megatron-LM reduces them all in one coalesced call.
ADAMW_GRAD_READS = 3
IDLE_MIN = 0.10            # GPU (or host) idle, fraction of the step
SHORT_KERNEL_US = 50.0     # median compute kernel shorter than this: launch-bound on GPU
WAITING_HOST_MIN = 0.30    # with longer kernels, idle above this share: the GPU waits on the host


class CalibrationError(ValueError):
    """The diagnosis lacks what the model needs (said in the message)."""


# The schedules' names as runs and configs write them -> the step-time model's.
MODEL_SCHEDULES = {None: "1f1b", "1f1b": "1f1b", "gpipe": "gpipe", "interleaved": "interleaved",
                   "interleaved-1f1b": "interleaved", "interleaved_1f1b": "interleaved", "zb1p": "zb1p"}


def model_schedule(name) -> str:
    if name not in MODEL_SCHEDULES:
        raise CalibrationError(f"cannot calibrate the step-time model: it has no {name!r} schedule "
                               f"(it models {', '.join(sorted({v for v in MODEL_SCHEDULES.values()}))})")
    return MODEL_SCHEDULES[name]


@record(frozen=True)
class Calibration:
    """The step-time model fitted to the measured run."""

    workload: Workload
    config: Config
    links: Links
    stage_slowdown: dict
    measured_step_s: float
    model_step_s: float
    tokens_per_step: Optional[float]
    assumptions: tuple

    @property
    def fit_error(self) -> float:
        """|model - measured| / measured for the measured configuration."""
        return abs(self.model_step_s - self.measured_step_s) / self.measured_step_s

    def model(self, config: Config, workload: Optional[Workload] = None, slowdown: Optional[dict] = None) -> float:
        config, links = two_replicas(config, self.links)
        return step_time(workload or self.workload, config, links,
                         stage_slowdown=self.stage_slowdown if slowdown is None else slowdown)

    def predict(self, config: Config, workload: Optional[Workload] = None, slowdown: Optional[dict] = None) -> float:
        """Measured step time moved by the model's difference between the new and the measured config."""
        return max(self.measured_step_s + self.model(config, workload, slowdown) - self.model_step_s, 1e-9)

    def tokens_per_s(self, step_s: Optional[float]) -> Optional[float]:
        return self.tokens_per_step / step_s if self.tokens_per_step and step_s else None


def two_replicas(config: Config, links: Links) -> tuple[Config, Links]:
    """DP replicas run the same schedule, so simulate two: the simulation's cost grows with the
    ranks simulated. The DP links are slowed by the bus factor 2(n-1)/n of the real n (dp x cp ranks
    reduce the gradients) over that of the simulated 2 x cp, so an all-reduce over them takes exactly
    what it takes over n (nccl-tests: t = S * f(n) / busbw)."""
    if config.dp <= 2:
        return config, links
    slower = bus_factor(Coll.ALL_REDUCE, config.grad_ranks) / bus_factor(Coll.ALL_REDUCE, 2 * config.cp)
    return replace(config, dp=2), replace(links, dp=links.dp / slower)


def with_micro_batch(w: Workload, old: int, new: int) -> Workload:
    """Compute and message sizes scale with the micro-batch; the per-kernel launch overhead and the
    host operators' fixed cost do not."""
    k = new / old
    return replace(w, fwd_s_per_layer=w.fwd_s_per_layer * k, tp_bytes_per_layer=w.tp_bytes_per_layer * k,
                   p2p_bytes=w.p2p_bytes * k, cp_bytes_per_layer=w.cp_bytes_per_layer * k,
                   cp_grad_bytes_per_layer=w.cp_grad_bytes_per_layer * k)


def _need(meta: RunFacts, d: Diagnosis, key: str):
    v = getattr(meta, key)
    if v is None:
        raise CalibrationError(f"cannot calibrate the step-time model: {key} unknown (not in diag_run.json, "
                               f"--config or --{key.replace('_', '-')}, nor readable from the trace)")
    return v


def _steps(d: Diagnosis) -> int:
    return steps_in_window(d.ranks)


def _per_step(what: str) -> Callable:
    """A rank's breakdown.<what> per step of its window: the figure _per_stage usually takes."""
    return lambda r: getattr(r.breakdown, what) / max(r.window_steps, 1)


def _per_stage(d: Diagnosis, pp: int, of: Callable) -> list[float]:
    """Per pipeline stage, the mean over its ranks of `of(rank)`, a per-step figure of the rank
    (_per_step for its breakdown's)."""
    if d.pipeline and d.pipeline.stages:
        stage_of = {r: st.stage for st in d.pipeline.stages for r in st.ranks}
    else:                                        # one stage, or the Megatron order as the facts say
        tp = int(d.facts.tp or 1)
        dp = max(1, (d.world_size or len(d.ranks)) // (tp * pp))
        stage_of = {r.rank: r.rank // (tp * dp) for r in d.ranks}
    by_stage: dict[int, list] = {}
    for r in d.ranks:                            # by the ranks present: a claimed PP costs nothing
        s = stage_of.get(r.rank)
        if s is not None and 0 <= s < pp:
            by_stage.setdefault(s, []).append(of(r))
    if len(by_stage) < pp:
        raise CalibrationError("cannot calibrate the step-time model: a pipeline stage has no trace here")
    return [float(np.mean(by_stage[s])) for s in range(pp)]


def _host_ops(d: Diagnosis) -> list:
    """Every rank's HostOps; empty unless each rank has them (host timelines only)."""
    ranks = [r.host_ops for r in d.ranks if r.host_ops is not None]
    return ranks if ranks and len(ranks) == len(d.ranks) else []


def _weight_share(d: Diagnosis, notes: list) -> float:
    """The weight gradients' share of a layer's backward (the zero-bubble schedule's W pass): the mean
    over the ranks that show their backward (RankResult.backward, analysis.backward), else half."""
    shares = [r.backward.weight_share for r in d.ranks if r.backward and r.backward.weight_share]
    if not shares:
        notes.append(f"weight gradients {WEIGHT_SHARE:.0%} of each layer's backward (assumed: no autograd nodes "
                     "in the trace; a torch.profiler trace with its host operators shows them)")
        return WEIGHT_SHARE
    share = min(max(float(np.mean(shares)), 0.01), 0.99)
    notes.append(f"weight gradients {share:.0%} of each layer's backward: half the compute in its weighted layers' "
                 "autograd nodes and all of its weight-only nodes' (embeddings, gradient accumulation), over all of "
                 f"the backward's ({len(shares)} rank{'s' * (len(shares) > 1)} mean)")
    return share


def window_step(d: Diagnosis) -> Optional[float]:
    """The measured step the model is fitted to: the mean over ranks of each rank's steps inside the
    analysed window, the steps its compute, communication and idle come from. Not the run's step
    time (Throughput.step_time_s, the median of every ProfilerStep): the last ProfilerStep, left out
    of the window (HTA's convention), is the one the profiler stops in, and on the trainer's CPU runs
    it read 10-20% longer than the others (tp_layout's job: 338 and 354 ms against 306 and 292),
    time the model's inputs do not hold and the predictions would carry. The run's step time where
    no rank has a step in the window (a whole-trace window)."""
    inside = [float(np.mean([s.host_s for s in r.steps if s.in_window])) for r in d.ranks if r.window_steps]
    if inside and len(inside) == len(d.ranks):
        return float(np.mean(inside))
    return d.throughput.step_time_s if d.throughput else None


def _untraced_tap(d: Diagnosis, notes: list) -> tuple[float, float, float]:
    """Seconds per step of the diag trainer's comm tap (a Python dispatch mode) in the traced steps,
    where its diag_run.json says the tap ran only in the profiled steps: the steps the run is
    measured and predicted by do not pay it. Three parts (HostOps): in the host operators' fixed
    cost (outside FSDP2's spans), in FSDP2's own time, and in the time FSDP2's spans are held in
    communication (its call around a collective's, inside the dispatcher's call of it); all three
    out of the measured step, the first two out of the compute (the third is not in it). Zeros
    otherwise (a mode on in every step is the run's cost)."""
    ranks = _host_ops(d)
    profile = d.facts.profile if d.facts else None
    if not ranks or profile is None or profile.comm_tap != "profiled_steps":
        return 0.0, 0.0, 0.0
    tap = float(np.mean([h.dispatch_mode_per_step_s for h in ranks]))
    own = float(np.mean([h.fsdp_dispatch_mode_per_step_s or 0.0 for h in ranks]))
    comm = float(np.mean([h.fsdp_comm_dispatch_mode_per_step_s or 0.0 for h in ranks]))
    if tap + own + comm > 0:
        inside = f", {(own + comm) * 1e3:.3g} ms of it inside FSDP2 spans" if own + comm else ""
        notes.append(f"the trainer's comm tap {(tap + own + comm) * 1e3:.3g} ms per step (its Python dispatch "
                     f"mode's self time{inside}) "
                     "left out of the measured step and its compute: diag_run.json says it ran only in "
                     "the profiled steps, so the run's other steps do not pay it")
    return tap, own, comm


def _untraced_shorter(d: Diagnosis, step: float) -> Optional[float]:
    """The run's untraced steps' median (diag_run.json's profile.untraced_step_s) where it is shorter than the
    traced `step` by UNTRACED_MARGIN; None otherwise (another program's trace does not say)."""
    profile = d.facts.profile if d.facts else None
    untraced = profile.untraced_step_s if profile is not None else None
    if not untraced or untraced >= step * (1 - UNTRACED_MARGIN):
        return None
    return float(untraced)


def _untraced_step(d: Diagnosis, step: float) -> Optional[float]:
    """_untraced_shorter on a host timeline with every rank's operators counted (HostOps): the profiler's own
    cost per recorded operator is then fitted (calibrate). None otherwise: on a GPU timeline the operators are
    not counted (_untraced_on_gpu says so)."""
    untraced = _untraced_shorter(d, step)
    return untraced if untraced is not None and _host_ops(d) else None


def _untraced_on_gpu(d: Diagnosis, step: float, notes: list) -> None:
    """On a GPU timeline whose run says its untraced steps are shorter than the traced one (diag_run.json's
    profile.untraced_step_s, by UNTRACED_MARGIN), said: the calibration does not take the profiler's cost out
    there (its host operators are counted on host timelines only), so the predictions are of traced steps. Where
    the GPU waits on the host the profiler's host callbacks are in the idle the launch overhead is read from
    (on the H200 recompute job the traced step was 2.3x the untraced one: benchmarks/README.md)."""
    untraced = None if d.host_timeline else _untraced_shorter(d, step)
    if untraced is None:
        return
    waiting = waits_on_host(d)
    notes.append(f"the run's untraced steps' median {untraced * 1e3:.4g} ms (diag_run.json) is "
                 f"{100 * (1 - untraced / step):.0f}% shorter than the traced step {step * 1e3:.4g} ms"
                 + (": the GPU waits on the host, so torch.profiler's host callbacks are in the idle between its "
                    "kernels that the launch overhead is read from" if waiting else "")
                 + ". The profiler's cost is taken out on host timelines only: these predictions are of traced "
                   "steps, and a change's share of an untraced step can differ")


def _fit_profiler(model_at, k_max: float, target: float) -> float:
    """k in [0, k_max] (seconds per recorded operator) at which model_at(k), falling as k grows,
    comes to `target`: bisection to a millionth of the target; k_max where even that stays above it."""
    if model_at(k_max) >= target:
        return k_max
    lo, hi = 0.0, k_max
    for _ in range(40):
        mid = (lo + hi) / 2
        value = model_at(mid)
        if abs(value - target) <= 1e-6 * target:
            return mid
        lo, hi = (mid, hi) if value > target else (lo, mid)
    return (lo + hi) / 2


def _host_fixed(d: Diagnosis, tp: int, per_stage_mb_layers: int, compute: list,
                recompute: bool, notes: list, tap: float = 0.0) -> tuple[float, float]:
    """(host fixed s, DTensor dispatch s) per layer per micro-batch from the ranks' HostOps; zeros
    on GPU timelines and traces without them. The fixed part of the measured run's compute is
    taken out of what scales with the micro-batch. `tap`: the untraced steps' comm tap per step
    (_untraced_tap), already out of `compute`, taken out of the fixed cost too."""
    ranks = _host_ops(d)
    if not ranks:
        return 0.0, 0.0
    fixed = float(np.mean([h.fixed_per_step_s for h in ranks])) - tap
    dtensor = float(np.mean([h.dtensor_per_step_s for h in ranks])) if tp > 1 else 0.0
    if fixed >= min(compute):
        notes.append("host operators' fixed cost not modelled: it exceeds the measured compute of a stage")
        return 0.0, 0.0
    per_layer = per_stage_mb_layers * (1.0 + recompute / (1.0 + BWD_RATIO))   # a recomputed forward pays again
    host, dtensor = (fixed - dtensor) / per_layer, dtensor / per_layer
    h = ranks[0]
    notes.append(f"host operators' fixed cost {host * 1e3:.3g} ms per layer per micro-batch (forward + backward, "
                 f"held at any micro-batch size and TP): {h.aten_ops_per_step:,.0f} ATen calls per step x "
                 f"{h.aten_op_s * 1e6:.3g} us (their median self time) + {h.framework_per_step_s * 1e3:.3g} ms "
                 f"of non-ATen operators (their self time; rank {d.ranks[0].rank}, the mean "
                 f"over ranks used), outside "
                 f"torch.optim's spans{', less the comm tap' if tap else ''}; small-GEMM inefficiency is not in it")
    if not any(r.optimizer_ops_per_step for r in ranks):
        notes.append("no torch.optim `Optimizer.*` spans in the trace: the optimizer's operators, if any, are "
                     "counted in the fixed cost per micro-batch (an overestimate that shrinks with more micro-batches)")
    if dtensor > 0:
        notes.append(f"DTensor dispatch {dtensor * 1e3:.3g} ms per layer per micro-batch, from its wrappers and "
                     f"subclass dispatch (their self time, per step {dtensor * per_layer * 1e3:.3g} ms): "
                     f"paid at TP > 1 only")
    return host, dtensor


def _action_host(d: Diagnosis, pp: int, idle: list, notes: list) -> tuple[float, list, float]:
    """(seconds between two actions of a stage, per stage the idle per step less those gaps, a transfer
    post's seconds in the multi-stage runtime: _post_host): the
    pipelining runtime's host time between a stage's consecutive forwards and backwards where nothing
    else runs (analysis ActionGaps: on a host timeline its Python, on a GPU the device waiting for it),
    per action, so that a schedule with more actions a step (interleaved, zero bubble, more micro-batches)
    pays it more often; the rest of the idle stays the per-kernel launch overhead. With PP > 1 and every
    rank's actions read only; else (0, idle, 0), the gaps left in the launch overhead, as before."""
    gaps = [r.action_gaps for r in d.ranks]
    if pp < 2 or not all(g is not None and g.gaps for g in gaps):
        return 0.0, idle, 0.0
    # what the breakdown's idle holds of the gaps (a transfer in flight it counts as communication, not idle)
    per_step = _per_stage(d, pp, lambda r: (r.action_gaps.idle_s - r.action_gaps.in_flight_s) / max(r.window_steps, 1))
    if any(g > i * (1 + 1e-9) for g, i in zip(per_step, idle)):    # cannot be: a part of the idle
        return 0.0, idle, 0.0
    per_gap = float(np.mean([g.per_gap_s for g in gaps]))
    n = round(float(np.mean([g.gaps for g in gaps])) / _steps(d))
    whole, flying = (float(np.mean([getattr(r.action_gaps, k) / max(r.window_steps, 1) for r in d.ranks]))
                     for k in ("idle_s", "in_flight_s"))      # a step, mean over ranks
    notes.append(f"pipelining runtime's host time {per_gap * 1e3:.3g} ms between two actions of a stage, from the idle "
                 f"between consecutive forwards and backwards ({whole * 1e3:.3g} ms a step over ~{n} gaps, mean over "
                 "ranks" + (f"; {flying * 1e3:.3g} ms of it beside a transfer in flight, which the breakdown counts as "
                            "communication" if flying > 1e-6 else "") + "): paid before each action but a step's "
                 "first, so more often with more actions a step (interleaving, zero bubble, micro-batches); taken out "
                 "of the idle the launch overhead is read from")
    return per_gap, [max(i - g, 0.0) for i, g in zip(idle, per_step)], _post_host(d, gaps, notes)


def _post_host(d: Diagnosis, gaps: list, notes: list) -> float:
    """Seconds of host time the rank's thread takes to post one transfer (a send or a receive handed to
    the backend: ActionGaps.post_median_s, the innermost point-to-point op's host span), the mean over
    ranks of their medians; 0 where a rank's trace shows none. Paid at each send and receive of the
    schedules torch runs on its multi-stage runtime (schedule.POSTED_SCHEDULES), where each post is an
    action of its own between the compute actions. A host timeline only: on a GPU the device waits for
    the host's posts only where it waits on the host, which this does not price."""
    if not d.host_timeline or not all(g.post_median_s for g in gaps):
        return 0.0
    post = float(np.mean([g.post_median_s for g in gaps]))
    n = round(sum(g.posts for g in gaps) / len(gaps) / _steps(d))
    notes.append(f"a transfer's post {post * 1e3:.3g} ms of the rank's thread (the median host span of its "
                 f"point-to-point calls, ~{n} a step a rank, mean over ranks): paid at each send and receive of the "
                 "interleaved and zero-bubble schedules, which torch's multi-stage runtime posts as actions of "
                 "their own between the compute actions")
    return post


def _optimizer(d: Diagnosis, pp: int, tap: float, notes: list) -> list[float]:
    """Per stage, the optimizer's compute per step: the compute inside torch.optim's `Optimizer.step`
    spans (on a GPU, the kernels launched from inside one) in the pipeline Gantt's step of each rank
    (analysis.gantt: the window's median step), mean over the stage's ranks; less the comm tap's share
    where the tap is left out of the step (`tap`, _untraced_tap: apportioned by the optimizer's share of
    the host operators). The optimizer runs once a step, after the pipeline's flush: spread over the
    layers' passes it would lengthen every pipeline action, and so the bubble that more micro-batches,
    interleaving or the zero-bubble schedule remove (measured on the trainer's PP 2 jobs: those levers
    were overpriced by 1-2 points of the step). Zeros where a rank shows no such span (another
    framework's optimizer, a trace without host events): then it stays in the layers' compute, said.
    Used with a pipeline only (calibrate): at PP 1 there is no bubble to distort, and held apart it
    would re-price only ZeRO and DP changes, where what sets an optimizer's time over FSDP2's DTensors
    (their dispatch per parameter: 19 ms sharded against 9 ms replicated on the trainer's ZeRO-3 job)
    is not in a replicated run's trace."""
    g = d.gantt
    by_rank = {row.rank: row.total("optimizer") for row in g.rows + g.others} if g is not None else {}
    if not all(by_rank.get(r.rank) for r in d.ranks):
        notes.append("no torch.optim `Optimizer.step` compute seen on every rank: the optimizer, if any, is "
                     "folded into the layers' compute (each pipeline action, and so the bubble, longer by its share)")
        return [0.0] * pp

    def tap_share(r) -> float:
        h = r.host_ops
        return tap * h.optimizer_ops_per_step / h.ops_per_step if tap and h is not None and h.ops_per_step else 0.0

    return [max(o, 0.0) for o in _per_stage(d, pp, lambda r: by_rank[r.rank] - tap_share(r))]


def _axis_link(d: Diagnosis, axis: str, notes: list) -> tuple[float, Optional[float]]:
    """(busbw bytes/s, median message bytes) of the axis's most time-consuming op with a busbw."""
    ops = [o for o in (d.comm.ops if d.comm else []) if o.axis == axis and o.busbw_median_gbps]
    if not ops:
        return math.inf, None
    transfer = [o for o in ops if o.busbw_basis == "transfer"]
    o = max(transfer or ops, key=lambda o: o.time_s)
    basis = "matched transfer time" if transfer else "one rank's kernel time (includes waiting: pessimistic)"
    notes.append(f"{axis.upper()} busbw {o.busbw_median_gbps:.3g} GB/s from {axis}:{o.op} {o.size_bucket} ({basis})")
    return o.busbw_median_gbps * 1e9, o.median_bytes


def _tp_as_paid(d: Diagnosis, busbw: float, call_bytes: float, tp: int, calls: int, notes: list) -> float:
    """The TP link as the step pays it: the model's `calls` TP all-reduces of `call_bytes` a step
    take the TP collectives' measured transfer time per step (matched across the group: waits for a
    late rank are not in it), so what the model does not count one by one (the embedding's and the
    loss's collectives, DTensor's redistributions, a median call's busbw against the mean's tail)
    goes with TP when a change removes or shrinks it, instead of staying in the held residual.
    `busbw` (the median call's) where nothing is measured or the model has no TP bytes."""
    if tp < 2 or not calls or not call_bytes or not math.isfinite(busbw):
        return busbw
    ops = [o for o in (d.comm.ops if d.comm else []) if o.axis == "tp" and o.busbw_basis == "transfer"]
    calls_s = sum(o.time_s for o in ops) / _steps(d)
    axis = next((a for a in (d.comm.axes if d.comm else []) if a.axis == "tp"), None)
    exposed = (axis.exposed_per_step_s or 0.0) if axis is not None and ops else 0.0
    per_step = max(calls_s, exposed)
    if per_step <= 0:
        return busbw
    paid = calls * call_bytes * bus_factor(Coll.ALL_REDUCE, tp) / per_step
    what = (f"{exposed * 1e3:.3g} ms per step of exposed TP communication (the TP calls' own time "
            f"{calls_s * 1e3:.3g} ms: the rest is the issuing thread blocked on them, as a host timeline's "
            "wait_tensor, or their wrappers)" if exposed > calls_s else
            f"{per_step * 1e3:.3g} ms per step of TP collectives (their calls' time, matched)")
    notes.append(f"TP as the step pays it: {what} over the model's {calls} all-reduces of {call_bytes / 1024:.4g} "
                 f"KiB: {paid / 1e9:.3g} GB/s effective, against {busbw / 1e9:.3g} GB/s for the median call")
    return paid


def _fsdp_host(d: Diagnosis, zero: int, tp: int, mb_layers: int, stage_layers: int,
               notes: list, tap: float = 0.0) -> tuple[float, float]:
    """(FSDP2's own host s per layer per micro-batch, its optimizer's DTensor dispatch s per layer
    per step) from the ranks' HostOps: what going below ZeRO-2 (which FSDP2 implements, as ZeRO-3)
    takes off a host timeline besides its traffic. Zeros where the run is not ZeRO-2/3, or its
    trace has no FSDP2 marks (then said). `tap`: the comm tap inside FSDP2's spans that the untraced
    steps do not pay (_untraced_tap), already out of the compute, taken out of FSDP2's time too."""
    ranks = _host_ops(d) if zero >= FSDP_MIN_ZERO else []
    if not ranks:
        return 0.0, 0.0
    if any(h.fsdp_per_step_s is None for h in ranks):
        notes.append(f"ZeRO-{zero}'s own host time (hooks, copies) unknown: no FSDP2 `FSDP::` marks in the trace "
                     "(FSDP1 or another framework); only its traffic is priced, so lowering it is underpriced")
        return 0.0, 0.0
    own = max(float(np.mean([h.fsdp_per_step_s for h in ranks])) - tap, 0.0)
    opt = float(np.mean([h.fsdp_optimizer_dispatch_per_step_s or 0.0 for h in ranks])) if tp == 1 else 0.0
    notes.append(f"FSDP2's own host time {own * 1e3:.3g} ms per step (its `FSDP::` spans less the time they hold "
                 f"the thread in its collectives' calls and waits{', and less the comm tap' if tap else ''}), "
                 f"{own / mb_layers * 1e3:.3g} ms per layer per micro-batch, paid under ZeRO-2/3 (FSDP2) only"
                 + (f"; DTensor's dispatch in the optimizer step over its sharded parameters {opt * 1e3:.3g} ms "
                    "per step, gone with it" if opt else "")
                 + ("; at TP > 1 the optimizer's DTensor dispatch stays with TP's DTensor parameters" * (tp > 1)))
    return own / mb_layers, opt / stage_layers


def _zero_as_paid(d: Diagnosis, w: Workload, c: Config, links: Links, slowdown: dict, notes: list,
                  tap: float = 0.0) -> Links:
    """ZeRO's collectives as the step pays them on a host timeline, where each one holds the issuing
    thread (Workload.blocking_gathers): the DP axis's exposed time per step (its collectives' calls, and
    the waits for those gloo runs on its worker threads, hostops.fsdp_waits), against the model's DP
    collectives at the busbw of the median call. Where they took longer, the rest is a cost per call,
    not per byte (a call preempted on a loaded host, a late peer waited for, gloo's hand-off to its
    worker: on bench_tune's ZeRO-3 job the 0.8 MB calls' mean took 2.5x their median, while the
    replicated run's one 3.5 MB all-reduce ran at the median's busbw), so it is taken as the DP link's
    latency per message, fitted so that the model's DP collectives take what they were measured to
    take: a change that drops calls (zero_down) drops it with them, and the gradient buckets that
    replace them pay it once each. `tap`: the comm tap's time in those calls that the untraced steps
    do not pay (_untraced_tap), left out. `links` unchanged otherwise, and under ZeRO-0/1, whose
    gradients the model reduces in buckets after the backward as before."""
    if not (c.zero >= FSDP_MIN_ZERO and c.grad_ranks > 1 and w.blocking_gathers):
        return links
    name = _dp_axis(d, c.zero, c.cp)
    axis = next((a for a in (d.comm.axes if d.comm else []) if a.axis == name), None)
    if axis is None or not axis.exposed_per_step_s:
        return links
    paid = axis.exposed_per_step_s - tap

    def model(k: Links) -> float:
        return step_time(w, *two_replicas(c, k), stage_slowdown=slowdown)

    now, probe = model(links), 1e-3
    modelled = now - model(replace(links, dp=math.inf))
    calls = (model(replace(links, dp_latency_s=probe)) - now) / probe    # DP collectives a step, each on the path
    if calls < 0.5 or paid <= modelled:
        return links
    latency = (paid - modelled) / calls
    notes.append(f"ZeRO's collectives as the step pays them: {paid * 1e3:.3g} ms per step of exposed {name.upper()} "
                 "communication (their calls, and the waits for the collectives gloo runs on its worker threads"
                 f"{', less the comm tap' if tap else ''}), the model's {calls:.3g} DP collectives "
                 f"{modelled * 1e3:.3g} ms at the median call's busbw: the rest, {latency * 1e3:.3g} ms a call, is "
                 "taken as the DP link's latency per message (a cost per call, not per byte: gone with the calls "
                 "a change drops, paid once by each gradient bucket)")
    return replace(links, dp_latency_s=latency)


def _dp_axis(d: Diagnosis, zero: int, cp: int = 1) -> str:
    """The axis the DP gradients travel on: FSDP's shard axis under ZeRO when the trace has it; with
    CP the group that folds it in (dp_shard_cp, dp_cp) when the trace names it."""
    axes = {o.axis for o in (d.comm.ops if d.comm else [])}
    order = (("dp_shard_cp",) * (cp > 1) + ("dp_shard",)) * bool(zero) + ("dp_cp",) * (cp > 1)
    return next((a for a in order if a in axes), "dp")


def _sized(d: Diagnosis, axis: str, op: str) -> list:
    """The run's ops of one axis and collective with a measured message size."""
    return [o for o in (d.comm.ops if d.comm else []) if o.axis == axis and o.op == op and o.median_bytes]


def _cp_exchange(d: Diagnosis, meta: RunFacts, cp: int, tp: int, mbs: int, width: int, links: dict,
                 notes: list) -> tuple[float, float]:
    """(K and V, dK and dV) bytes of a layer for one micro-batch at TP 1 (Workload.cp_bytes_per_layer,
    cp_grad_bytes_per_layer). K and V: the measured CP all-gathers' size x TP, else 2 x b x s x (h x query
    groups / heads) x dtype from the model's shape. dK and dV: the measured CP all-to-alls' size (one
    rank's shard, permuted round the ring) x CP x TP, else K and V's in fp32 (torch accumulates them
    in fp32 by default). Unknown bandwidth or size is an error, never a free exchange."""
    if cp <= 1:
        return 0.0, 0.0
    if math.isinf(links["cp"]):
        raise CalibrationError(f"cannot calibrate the step-time model: the layout has CP {cp} but no collective on "
                               "the cp axis with a bus bandwidth was measured, so the CP exchange's cost is unknown "
                               "(not priced as free)")
    kv = _cp_kv_bytes(d, meta, tp, mbs, width, notes)
    if a2a := _sized(d, "cp", "all_to_all"):
        o = max(a2a, key=lambda o: o.time_s)
        notes.append(f"CP backward: dK, dV {o.median_bytes * cp * tp / 1e6:.4g} MB per layer per micro-batch at TP 1, "
                     f"from the cp all-to-alls' median size {o.median_bytes / 1e6:.4g} MB (a rank's shard) x CP {cp} "
                     f"x TP {tp}, permuted {cp} times round the ring")
        return kv, float(o.median_bytes) * cp * tp
    notes.append(f"CP backward: dK, dV in fp32, {4 / width:g}x K and V's bytes, permuted {cp} times round the ring "
                 "(torch's context_parallel default; no cp all-to-all measured"
                 + ("; K and V taken as 16-bit: the run's dtype is unknown)" if not meta.dtype else ")"))
    return kv, kv * 4.0 / width


def _cp_kv_bytes(d: Diagnosis, meta: RunFacts, tp: int, mbs: int, width: int, notes: list) -> float:
    """Bytes of a layer's K and V for one micro-batch at TP 1, `width` bytes an element (see _cp_exchange)."""
    if ops := _sized(d, "cp", "all_gather"):
        o = max(ops, key=lambda o: o.time_s)
        notes.append(f"CP exchange {o.median_bytes * tp / 1e6:.4g} MB of K and V per layer per micro-batch at TP 1: "
                     f"the cp all-gathers' median size {o.median_bytes / 1e6:.4g} MB x TP {tp}")
        return float(o.median_bytes) * tp
    seq, h = meta.seq_length, meta.hidden_size
    if not (seq and h):
        raise CalibrationError("cannot calibrate the step-time model: the CP exchange's size is unknown (no cp "
                               "all-gather in the trace, and seq_length or hidden_size unknown)")
    groups, heads = meta.num_query_groups, meta.num_attention_heads
    kv = h * groups / heads if groups and heads else h
    nbytes = 2.0 * mbs * seq * kv * width
    notes.append(f"CP exchange {nbytes / 1e6:.4g} MB per layer per micro-batch at TP 1, from the shape: K and V, "
                 f"2 x {mbs} x {seq} x {kv:g} x {width} B (no cp all-gather measured)")
    return nbytes


def _grad_bytes(d: Diagnosis, meta: RunFacts, shards: int, zero: int, m: int, notes: list) -> float:
    """Whole-model gradient bytes: fp32 per parameter, else what the DP all-reduces (under ZeRO the
    reduce-scatters, ZeRO-3's once per micro-batch) carried per step."""
    if meta.parameter_count:
        notes.append("gradients fp32: 4 bytes per parameter of diag_run.json's parameter_count")
        return 4.0 * float(meta.parameter_count)
    axis, op = _dp_axis(d, zero, int(meta.cp or 1)), "reduce_scatter" if zero else "all_reduce"
    ops = _sized(d, axis, op)
    per_rank = sum(o.median_bytes * o.calls / max(o.ranks, 1) for o in ops) / _steps(d) / (m if zero >= 3 else 1)
    if ops:
        notes.append(f"gradients {per_rank * shards / 1e6:.4g} MB per step: the {axis.upper()} {op.replace('_', '-')}s' "
                     f"bytes{' per micro-batch' * (zero >= 3)} x TP x PP")
    return per_rank * shards


def _schedule(meta: RunFacts, d: Diagnosis, notes: list) -> dict:
    """The model's schedule and virtual stages for the run's: one chunk per rank is plain 1F1B. Where the
    run's facts do not name the schedule, the one the trace shows (analysis.ppschedule: torch's PP:<action>
    annotations, or the order of the compute), with its v, said; 1F1B where neither does."""
    name, v = meta.pipeline_schedule, meta.virtual_pipeline_stages
    seen = d.pipeline.schedule if d.pipeline else None
    if not name and seen:
        name, v = seen, v or d.pipeline.v
        if seen != "1f1b":
            notes.append(f"schedule {seen}" + (f", v = {d.pipeline.v}" if (d.pipeline.v or 1) > 1 else "")
                         + f" as the trace shows it ({d.pipeline.source}): the run's facts do not name it")
    sched, v = model_schedule(name), int(v or 1)
    if sched == "zb1p" and v > 1:
        raise CalibrationError(f"cannot calibrate the step-time model: it has the zero-bubble schedule with one "
                               f"stage a rank only, not {v} (interleaved zero bubble)")
    if sched != "interleaved" or v < 2:
        return {"schedule": "1f1b" if sched == "interleaved" else sched, "virtual_stages": 1}
    return {"schedule": sched, "virtual_stages": v}


def _without_profiler(d: Diagnosis, pp: int, w: Workload, c: Config, links: Links, compute: list, fixed: float,
                      scaling, traced: float, untraced: float, model_traced: float,
                      notes: list) -> tuple[Workload, dict, float, float]:
    """The model moved from the traced step to the untraced steps (_untraced_step). torch.profiler
    pays a host callback at each operator it records, which the run's other steps do not: k seconds
    per recorded operator (HostOps.ops_per_step), fitted so that the model falls by what the traced
    step takes over the untraced median (the model's residual against the traced step, time it does
    not see, is held as in every prediction). It is taken first from the gaps between operators
    (the launch overhead the model holds per kernel, so per micro-batch: where the callbacks between
    operators land), then from the compute that scales with the micro-batch; the operators' fixed
    cost (hostops) is kept. Left in, a change of micro-batches would be priced by the traced steps'
    gaps. Where the optimizer is held apart (Workload.optimizer_s, Config.optimizer_ranks x a stage's), its
    operators' share of what the compute pays (HostOps.optimizer_ops_per_step over ops_per_step)
    comes out of it.
    Returns (workload, stage slowdowns, the model's step, the measured step: the untraced one)."""
    ops = float(np.mean(_per_stage(d, pp, lambda r: r.host_ops.ops_per_step)))
    opt_ops = float(np.mean(_per_stage(d, pp, lambda r: r.host_ops.optimizer_ops_per_step))) if w.optimizer_s else 0.0
    halves = modelled_kernels(c.num_micro_batches, w.num_layers, pp, w.recompute)
    gaps = w.launch_overhead_s * halves                  # per stage per step
    optimizer = w.optimizer_s / c.optimizer_ranks        # per stage per step

    def refit(k: float) -> tuple[Workload, dict, float, float, float]:
        cost = k * ops                                   # per stage per step
        from_gaps = min(cost, gaps)
        from_opt = min((cost - from_gaps) * opt_ops / ops, optimizer) if ops > 0 else 0.0
        fwd, slowdown = scaling([x - (cost - from_gaps - from_opt) for x in compute])
        return (replace(w, fwd_s_per_layer=fwd, launch_overhead_s=(gaps - from_gaps) / halves,
                        optimizer_s=(optimizer - from_opt) * c.optimizer_ranks), slowdown,
                from_gaps, cost - from_gaps - from_opt, from_opt)

    def model_at(k: float) -> float:
        w2, slowdown = refit(k)[:2]
        return step_time(w2, *two_replicas(c, links), stage_slowdown=slowdown)

    # at most: all the gaps, and each stage's scaling compute kept at a tenth of itself
    k_max = (gaps + 0.9 * min(x - fixed for x in compute)) / ops if ops > 0 else 0.0
    k = _fit_profiler(model_at, k_max, model_traced - (traced - untraced)) if k_max > 0 else 0.0
    w2, slowdown, from_gaps, from_compute, from_opt = refit(k)
    model = step_time(w2, *two_replicas(c, links), stage_slowdown=slowdown)
    notes.append(f"torch.profiler's own cost {k * 1e6:.3g} us per recorded host operator ({ops:,.0f} a step per "
                 f"stage), fitted so that the model falls by what the traced step ({traced * 1e3:.4g} ms) takes "
                 f"over the run's untraced steps' median ({untraced * 1e3:.4g} ms, diag_run.json), and left out: "
                 "per stage per step "
                 f"{from_gaps * 1e3:.3g} ms from the gaps between operators, {from_compute * 1e3:.3g} ms from the "
                 "compute" + (f" and {from_opt * 1e3:.3g} ms from the optimizer (its {opt_ops:,.0f} operators' "
                              "share)" if from_opt else "") + ". The predictions are for untraced steps")
    return w2, slowdown, model, untraced


def modelled_kernels(m: int, layers: int, pp: int, recompute: str) -> int:
    """The compute kernels a stage runs a step in the model, each paying the launch overhead: HALVES a layer
    and micro-batch, and RECOMPUTE_HALVES more under full recompute (model.stage_costs prices them so)."""
    return m * (HALVES + (RECOMPUTE_HALVES if recompute == "full" else 0)) * layers // pp


def median_kernel_us(d: Diagnosis) -> Optional[float]:
    """The median mean duration of the ranks' top compute kernels; None without them."""
    kernels = sorted(k.mean_us for r in d.ranks for k in r.top_kernels if k.kind == "compute")
    return kernels[len(kernels) // 2] if kernels else None


def idle_waits_on_host(d: Diagnosis, idle: float, med: float) -> bool:
    """Whether idle, `idle` of the step, between compute kernels of a median `med` us is the device waiting on
    the host (the micro-batch rule's launch-bound evidence): IDLE_MIN of the step between kernels under
    SHORT_KERNEL_US; between longer ones WAITING_HOST_MIN, and no straggler to explain it better."""
    if med < SHORT_KERNEL_US:
        return idle >= IDLE_MIN
    return idle >= WAITING_HOST_MIN and not (d.comm and d.comm.stragglers)


def waits_on_host(d: Diagnosis) -> Optional[tuple[float, float]]:
    """(idle share of the step, median top compute kernel in us) where a GPU timeline waits on the host between
    its kernels (idle_waits_on_host); None elsewhere (a host timeline, no kernels, too little idle, or a share
    over 1: step marks that do not bound the work)."""
    if d.host_timeline:
        return None
    idle = max((f.share_of_step or 0.0 for f in d.findings if f.kind == FindingKind.IDLE), default=0.0)
    med = median_kernel_us(d)
    if med is None or idle > 1.0 or not idle_waits_on_host(d, idle, med):
        return None
    return idle, med


def shared_cores(d: Diagnosis) -> Optional[bool]:
    """Whether the ranks' compute threads take every core of their host, so that gloo's threads, which
    run the collectives, share the compute's cores (a host timeline; facts.host_cpus, ranks_per_host and
    threads_per_rank, from diag_run.json, --config or the flags): True or False where the facts say,
    None where a fact is missing (a GPU timeline: False, NCCL runs on the device)."""
    if not d.host_timeline:
        return False
    f = d.facts
    if not (f.host_cpus and f.ranks_per_host and f.threads_per_rank):
        return None
    return f.ranks_per_host * f.threads_per_rank >= f.host_cpus


def host_words(f) -> str:
    """The host facts (RunFacts f) as the notes say them: "2 ranks x 1 thread take the host's 2 cores"."""
    return (f"{f.ranks_per_host} ranks x {f.threads_per_rank} thread{'s' * (f.threads_per_rank > 1)} take the "
            f"host's {f.host_cpus} core{'s' * (f.host_cpus > 1)}")


def small_tp_call(d: Diagnosis) -> tuple[Optional[float], str]:
    """(seconds, where from) of one small all-reduce over the TP group, which costs its latency: the run's
    own TP collectives of SMALL_CALL_BYTES or fewer (the median call's transfer, matched across the group),
    else facts.tp_latency_s (the trainer timed a few partial DTensors' at its start, schema 1.22); (None, what
    would make it known). Under torch's DTensor sequence parallelism _sp_switch prefers facts.sp_grad_sync_s."""
    small = [o for o in (d.comm.ops if d.comm else []) if o.axis == "tp" and o.busbw_basis == "transfer"
             and o.median_bytes and o.median_bytes <= SMALL_CALL_BYTES and o.busbw_median_gbps and o.group_size]
    if small:
        o = min(small, key=lambda o: o.median_bytes)
        secs = (allreduce_s if o.op == "all_reduce" else gather_s)(o.median_bytes, o.group_size,
                                                                   o.busbw_median_gbps * 1e9)
        return secs, f"the run's TP {o.op} of {o.median_bytes / 1024:.3g} KiB (median call, matched)"
    if d.facts.tp_latency_s:
        return float(d.facts.tp_latency_s), "a small TP reduction timed at the run's start (diag_run.json, tp_latency_s)"
    return None, (f"unknown: the run has no TP collective of {SMALL_CALL_BYTES // 1024} KiB or less, and no "
                  "sp_grad_sync_s in diag_run.json (the instrumented trainer times its optimizer's at its start)")


def _sp_switch(d: Diagnosis, meta: RunFacts, tp: int, notes: list) -> dict:
    """Workload fields pricing a switch to sequence parallelism (model.sp_costs), said in a note; only
    Workload.sequence_parallel where the run had it (its measured link and step hold it) or has no TP."""
    if meta.sequence_parallel or tp < 2:
        return {"sequence_parallel": bool(meta.sequence_parallel)}
    backend = (meta.backend or d.backend or "").lower() or None
    factor = SP_TP_FACTOR.get(backend, 1.0)
    megatron = meta.sequence_parallel_kind == "megatron"
    per_norm = 1 if meta.swiglu else 2          # RMSNorm (weight) with SwiGLU models, else LayerNorm (+ bias)
    timed = not megatron and bool(meta.sp_grad_sync_s)
    # the unit priced: a parameter, where the optimizer's own path was timed (every reduction its reads make,
    # however many: AdamW's 3, one under the trainer's ZeRO-1, and DTensor's time around them); else one call,
    # reads of them a parameter (AdamW's, assumed)
    reads = 1 if megatron or timed else ADAMW_GRAD_READS
    if timed:
        call = float(meta.sp_grad_sync_s)
        source = ("the run's optimizer, timed at its start with partial gradients against replicated ones "
                  "(diag_run.json, sp_grad_sync_s: every reduction its reads make, DTensor's time around them)")
    else:
        call, source = small_tp_call(d)
        if call and not megatron:
            source += ("; the collective alone: DTensor's host time around each read is not in it, so this is a "
                       "lower bound (the instrumented trainer times the optimizer's own path: sp_grad_sync_s)")
    out = {"sp_tp_factor": factor, "sp_sync_call_s": call or 0.0,
           "sp_sync_calls_per_stage": 1.0 if megatron else 0.0,
           "sp_sync_calls_per_layer": 0.0 if megatron else 2.0 * per_norm * reads,
           "sp_sync_calls_last_stage": 0.0 if megatron else float(per_norm * reads)}
    how = ("its all-gathers and reduce-scatters priced as the all-reduces they replace (the same bytes on "
           f"{backend or 'an unknown backend'}'s ring)" if factor == 1.0 else
           f"its all-gathers and reduce-scatters priced at {factor:g}x the all-reduces they replace ({backend}'s "
           "reduce-scatter runs a whole all-reduce)")
    kind = "RMSNorm" if per_norm == 1 else "LayerNorm"
    if megatron:
        norms = "Megatron-LM's one coalesced reduction of the norms' gradients a stage"
    elif timed:
        norms = (f"{2 * per_norm} norm parameters a layer ({kind}) whose gradients it leaves partial over TP, "
                 "each reduced by the optimizer as torch's DTensor does, at a cost a parameter")
    else:
        norms = (f"{2 * per_norm * reads} reductions of the norms' gradients a layer ({2 * per_norm} norm parameters, "
                 f"{kind}, each gradient left partial over TP and reduced each of the {reads} times AdamW reads it, "
                 "as torch's DTensor does)")
    notes.append(f"sequence parallelism, where switched on: {how}; {norms}, "
                 + (f"{call * 1e3:.3g} ms each, from {source}" if call else f"not priced: their time is {source}"))
    return out


def calibrate(d: Diagnosis) -> Calibration:
    meta = d.facts
    tp, pp, cp = int(meta.tp or 1), int(meta.pp or (d.pipeline.p if d.pipeline else 1)), int(meta.cp or 1)
    dp = int(meta.dp or max(1, (d.world_size or 1) // (tp * pp * cp)))
    layers, mbs = int(_need(meta, d, "num_layers")), int(_need(meta, d, "micro_batch_size"))
    m = int(_need(meta, d, "num_micro_batches"))
    step = window_step(d)
    if not step:
        raise CalibrationError("cannot calibrate the step-time model: no measured step time (no ProfilerStep marks)")
    notes = [f"backward / forward = {BWD_RATIO} (assumed: the trace does not separate them)"]
    run_step = d.throughput.step_time_s if d.throughput else None
    if run_step and abs(step / run_step - 1) > 0.005:
        notes.append(f"measured step {step * 1e3:.4g} ms: the mean of the analysed window's steps, whose compute, "
                     f"communication and idle the model holds (the run's step time, {run_step * 1e3:.4g} ms, is the "
                     "median of every ProfilerStep, the last one too, which the window leaves out)")
    tap, fsdp_tap, fsdp_comm_tap = _untraced_tap(d, notes)
    compute = [c - tap - fsdp_tap for c in _per_stage(d, pp, _per_step("compute_s"))]
    step -= tap + fsdp_tap + fsdp_comm_tap
    idle = _per_stage(d, pp, _per_step("idle_s"))
    action, idle, post = _action_host(d, pp, idle, notes)
    per_stage_halves = m * HALVES * layers // pp
    recompute = "full" if meta.recompute_granularity == "full" else "none"    # one more forward in backward
    kernels = modelled_kernels(m, layers, pp, recompute)
    launch = float(median(idle)) / kernels
    mb_layers = m * (layers // pp)
    host, dtensor = _host_fixed(d, tp, mb_layers, compute, recompute == "full", notes, tap)
    zero = zero_stage(meta)
    fsdp, fsdp_opt = _fsdp_host(d, zero, tp, mb_layers, layers // pp, notes, fsdp_tap)
    fixed = mb_layers * (host + dtensor) * (1 + (recompute == "full") / (1 + BWD_RATIO))
    fsdp_fixed = mb_layers * fsdp + (layers // pp) * fsdp_opt
    if fsdp_fixed and fixed + fsdp_fixed >= min(compute):
        notes.append("FSDP2's own host time not modelled: with the fixed cost it exceeds the measured compute of a stage")
        fsdp = fsdp_opt = fsdp_fixed = 0.0
    fixed += fsdp_fixed
    # with a pipeline, the optimizer apart, once a step (FSDP2's dispatch in it is in `fixed` already); the
    # model runs optimizer_s / Config.optimizer_ranks
    opt = [max(o - (layers // pp) * fsdp_opt, 0.0) for o in _optimizer(d, pp, tap, notes)] if pp > 1 else [0.0] * pp
    if any(opt) and (zero >= FSDP_MIN_ZERO or tp > 1 and any(h.dtensor_per_step_s for h in _host_ops(d))):
        notes.append("the optimizer stays in the layers' compute: it steps DTensors (FSDP2, DTensor TP), whose "
                     "dispatch per parameter, not the shard's size, sets its time, which the model's optimizer_s / "
                     "(tp pp dp) would misprice")
        opt = [0.0] * pp
    elif any(fixed + o >= x for x, o in zip(compute, opt)):
        notes.append("the optimizer not held apart: with the fixed cost it exceeds the measured compute of a stage")
        opt = [0.0] * pp

    sched = _schedule(meta, d, notes)
    rec = float(recompute == "full")
    extra = SPLIT_BACKWARD_EXTRA if d.host_timeline else 0.0     # the model's price of torch's split backward
    # a zero-bubble run's stages past the first ran torch's split backward, dearer than the fused one the
    # model's units count: their compute is read less it (the model adds it back), not as a slower stage
    split = extra if sched["schedule"] == "zb1p" else 0.0
    units = [1.0] + [(1 + BWD_RATIO * (1 + split) + rec) / (1 + BWD_RATIO + rec)] * (pp - 1)
    if split and pp > 1:
        notes.append(f"a zero-bubble run: the compute of its stages past the first read less torch's split backward's "
                     f"{split:.0%} extra on their backward (the model adds it back), not as slower stages")

    def scaling(compute: list) -> tuple[float, dict]:
        """(forward s per layer per micro-batch at TP 1, stage slowdowns) from the stages' compute."""
        scaled = [(c - fixed - o) / u for c, o, u in zip(compute, opt, units)]   # per stage: what scales with the micro-batch
        mean_c = float(np.mean(scaled))
        return (mean_c * tp * cp / (mb_layers * (1 + BWD_RATIO + rec)),
                {s: c / mean_c for s, c in enumerate(scaled)} if pp > 1 else {})

    fwd, slowdown = scaling(compute)
    notes.append(f"forward {fwd * 1e3:.3g} ms per layer per micro-batch at TP=1{' and CP=1' * (cp > 1)}, from "
                 f"{float(np.mean(compute)) * 1e3:.3g} ms compute per stage per step (embedding and loss "
                 "folded in)" + (f" less {fixed * 1e3:.3g} ms of host operators' fixed cost"
                                 + " and FSDP2's own time" * bool(fsdp or fsdp_opt) if fixed else "")
                 + (f" less the optimizer's {float(np.mean(opt)) * 1e3:.3g} ms (once a step, after the "
                    "pipeline's flush: held apart, per stage " + ", ".join(f"{o * 1e3:.3g}" for o in opt)
                    + " ms, their mean run on every stage)" if any(opt) else ""))
    notes.append(f"launch overhead {launch * 1e6:.3g} us per compute kernel, from {median(idle) * 1e3:.3g} ms "
                 f"idle per step{' (less the gaps between actions)' * (action > 0)} over {kernels} modelled kernels"
                 + (" (the recomputed forward's among them)" if recompute == "full" else "")
                 + " (held per kernel when sizes change)")
    busbw = {"tp": _axis_link(d, "tp", notes)[0], "pp": _axis_link(d, "pp", notes)[0],
             "dp": _axis_link(d, _dp_axis(d, zero, cp), notes)[0],
             "cp": _axis_link(d, "cp", notes)[0] if cp > 1 else math.inf}
    width = dtype_bytes(meta.dtype or "bf16") or 2     # bytes an activation element (16-bit unless said)
    cp_bytes, cp_grad_bytes = _cp_exchange(d, meta, cp, tp, mbs, width, busbw, notes)
    act = mbs * int(meta.seq_length or 0) * int(meta.hidden_size or 0) * width
    busbw["tp"] = _tp_as_paid(d, busbw["tp"], act / cp, tp, per_stage_halves, notes)
    links = Links(**busbw)
    grad = _grad_bytes(d, meta, tp * pp, zero, m, notes)
    notes.append("latency per message 0 (busbw measured at this message size); DP bucket = ddp_bucket_size x 4 B (fp32 gradients)")
    host_timeline = d.host_timeline
    c = Config(tp=tp, pp=pp, dp=dp, num_micro_batches=m, micro_batch_size=mbs,
               **sched,
               overlap_grad_reduce=bool(meta.overlap_grad_reduce),
               bucket_bytes=4.0 * float(meta.ddp_bucket_size or 1e7), zero=zero, cp=cp,
               sequence_parallel=bool(meta.sequence_parallel) and tp > 1)
    w = Workload(num_layers=layers, fwd_s_per_layer=fwd, bwd_ratio=BWD_RATIO, tp_bytes_per_layer=act,
                 cp_bytes_per_layer=cp_bytes, cp_grad_bytes_per_layer=cp_grad_bytes,
                 p2p_bytes=act, grad_bytes=grad, launch_overhead_s=launch, action_host_s=action, post_host_s=post,
                 recompute=recompute,
                 optimizer_s=float(np.mean(opt)) * c.optimizer_ranks,
                 host_fixed_s_per_layer=host, dtensor_s_per_layer=dtensor, fsdp_s_per_layer=fsdp,
                 fsdp_optimizer_s_per_layer=fsdp_opt, blocking_gathers=host_timeline,
                 weight_share=_weight_share(d, notes if pp > 1 else []), shared_cores=bool(shared_cores(d)),
                 split_backward_extra=extra,
                 split_backward_host_s=SPLIT_BACKWARD_HOST_S if waits_on_host(d) else 0.0,
                 **_sp_switch(d, meta, tp, notes))
    if w.shared_cores and c.grad_ranks > 1:
        notes.append(f"{host_words(meta)} (the run's facts): gloo's threads run the collectives on the compute's "
                     "cores, so a DP reduction overlapped with backward is priced as if it were not (no idle core "
                     "to hide it on)")
    if cp > 1:
        notes.append(f"CP {cp}: the sequence split {cp} ways, so compute, TP all-reduces and pipeline messages are "
                     f"1/{cp} per rank (causal attention load-balanced, as Megatron-LM and torchtitan split it); each "
                     "layer all-gathers K and V over the CP group in forward and in backward and permutes its dK, dV "
                     f"shard {cp} times round the ring (torch's all-gather rotate method and its backward), exposed "
                     "on the main stream; gradients reduced over "
                     f"DP x CP = {dp * cp} ranks")
    if zero:
        notes.append(f"ZeRO-{zero} ({meta.data_parallel_sharding_strategy or 'distributed optimizer'}): "
                     + ("each layer's parameters all-gathered before its forward and its backward, one layer "
                        "ahead, its gradients reduce-scattered after its backward, every micro-batch (FSDP)"
                        if zero >= 3 else "gradient buckets reduce-scattered, the parameters all-gathered "
                        "after the optimizer (Megatron-LM's distributed optimizer), fp32 parameters assumed"))
    if zero >= 3 and host_timeline:
        notes.append("ZeRO-3's all-gathers and reduce-scatters hold the issuing thread (a host timeline: gloo runs "
                     "each collective in its call), so no prefetch hides them")
    tokens = d.throughput.tokens_per_step if d.throughput else None
    try:
        links = _zero_as_paid(d, w, c, links, slowdown, notes, fsdp_comm_tap)
        model_now = step_time(w, *two_replicas(c, links), stage_slowdown=slowdown)   # = the full grid's
        if (untraced := _untraced_step(d, step)) is not None:
            w, slowdown, model_now, step = _without_profiler(d, pp, w, c, links, compute, fixed + max(opt),
                                                             scaling, step, untraced, model_now, notes)
        else:
            _untraced_on_gpu(d, step, notes)
    except ModelTooBig as e:
        raise CalibrationError(f"cannot calibrate the step-time model: {e}") from None
    notes.append(f"model {model_now * 1e3:.4g} ms per step for the measured configuration, measured "
                 f"{step * 1e3:.4g} ms ({100 * (model_now / step - 1):+.0f}%)")
    return Calibration(w, c, links, slowdown, step, model_now, tokens, tuple(notes))
