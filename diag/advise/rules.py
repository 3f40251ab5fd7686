"""One small function per way a step loses time, each proposing the change that wins it back.

Problem: a diagnosis says where time goes; a user wants the next configuration to try and
what it will buy. Each rule reads one measured number (the evidence), fires only above its
threshold, writes the change as trainer / Megatron-LM flags, and lets the calibrated model
(calibrate.py) price candidate configurations; the best candidate is proposed. Rules never
recommend without evidence, and drop changes the model prices under MIN_GAIN.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Optional

from ..analysis.results import Finding, FindingKind, StragglerKind
from ..layout import stage_layer_counts
from .propose import SPLIT_FLAGS, Context, Recommendation, ev
from .calibrate import (IDLE_MIN, SHORT_KERNEL_US, WAITING_HOST_MIN, host_words, idle_waits_on_host,
                        median_kernel_us, shared_cores, waits_on_host, window_step, with_micro_batch)
from .memory import run_split, zero_flags

BUBBLE_MIN = 0.10          # measured bubble, fraction of the step
DP_EXPOSED_MIN = 0.05      # exposed DP communication, fraction of the step
TP_EXPOSED_MIN = 0.10      # exposed TP communication, fraction of the step
CP_EXPOSED_MIN = 0.10      # exposed CP communication, fraction of the step
HOST_FIXED_MIN = 0.10      # host operators' fixed cost (CPU timelines), fraction of the step
IMBALANCE_MIN = 1.10       # slowest / fastest stage compute
FP32_MIN = 0.30            # fp32 GEMM share of compute kernel time
STRAGGLER_MIN = 0.05      # the others' wait for one rank, fraction of the step
GPUS_PER_NODE = 8
FP32_GEMM = re.compile(r"sgemm|gemm.*(f32f32|fp32|_f32_)|cutlass.*_s\d+gemm", re.I)
HALF = re.compile(r"bf16|f16|fp16|h\d+gemm|hgemm|tf32", re.I)


DP_CURVE_SHARE = 0.7         # DP messages getting under 70% of the curve's plateau busbw
# The run's DP collectives overlapped one another on a rank (their transfers add up to this many times the wall
# time the axis communicated): gloo runs the buckets it is handed on its worker threads, while `diag bench` times
# its calls one at a time, so the curve's latency is not what the run paid (on the trainer's CPU job: 1.8-1.9x,
# priced -28% from the curve, -2..-5% measured; NCCL's buckets, one stream: 1.0x; benchmarks/README.md)
DP_CONCURRENT = 1.25
# The instrumented trainer runs the interleaved schedule (--pipeline-schedule interleaved-1f1b
# --num-layers-per-virtual-pipeline-stage, torch.distributed.pipelining's ScheduleInterleaved1F1B).
INTERLEAVED_RUNNABLE = True
GRAD_BYTES = 4               # the trainer keeps fp32 gradients (calibrate.py assumes the same)
# The instrumented trainer has no context parallelism (torch's `context_parallel` has no CPU attention
# sharding strategy): cp_down gives Megatron-LM's flag, with no re-run command.
CP_RUNNABLE = False


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def bubble(ctx: Context) -> list[Recommendation]:
    """Large measured bubble -> more micro-batches at the same global batch (smaller micro-batch)."""
    p, c = ctx.d.pipeline, ctx.cal.config if ctx.cal else None
    if not p or p.p < 2 or c is None:
        return []
    worst = max(p.stages, key=lambda s: s.bubble_fraction or 0.0)
    if (worst.bubble_fraction or 0.0) < BUBBLE_MIN:
        return []
    e = [ev(f"pipeline bubble, stage {worst.stage} (ideal {100 * (p.ideal_fraction or 0):.1f}%)",
            worst.bubble_fraction, BUBBLE_MIN, "fraction of step", "Pipeline bubble per stage")]
    cands = []
    for mbs in _divisors(c.micro_batch_size)[:-1]:
        m = c.num_micro_batches * c.micro_batch_size // mbs
        cands.append((replace(c, micro_batch_size=mbs, num_micro_batches=m),
                      with_micro_batch(ctx.cal.workload, c.micro_batch_size, mbs), {"--micro-batch-size": str(mbs)}))
    out = ctx.best("bubble", cands, e, lambda k: f"{k.num_micro_batches} micro-batches of {k.micro_batch_size} "
                   f"instead of {c.num_micro_batches} of {c.micro_batch_size} (same global batch)",
                   prefer=lambda k: k.num_micro_batches,
                   why=f"with p={c.pp} stages the 1F1B/GPipe bubble is (p-1)/(m+p-1) of the step; more "
                       "micro-batches shrink it, smaller ones cost more launch overhead per sample",
                   assumptions=["compute per micro-batch proportional to its size, but for the host operators' "
                                "fixed cost where the trace shows it (CPU): small GEMMs run less efficiently, "
                                "which is not priced, so the fewest micro-batches within 80% of the best "
                                "predicted gain are proposed"])
    return out + interleave(ctx, e) + zero_bubble(ctx, e)


def zero_bubble(ctx: Context, e: list) -> list[Recommendation]:
    """The zero-bubble schedule (ZB1P, torch.distributed.pipelining's ScheduleInterleavedZeroBubble
    with one stage a rank), simulated on the model: the backward split into input and weight
    gradients, the weight passes filling 1F1B's waits, the same messages; min(m, p) micro-batches in
    flight on every stage."""
    c, host = ctx.cal.config, _schedule_caveat(ctx)
    rounds = max(1, c.num_micro_batches // c.pp)
    if c.schedule != "1f1b" or c.num_micro_batches % rounds:
        return []
    # one stage a rank, said: the trainer's zb1p runs two a rank unless told the layers per stage
    flags = {"--pipeline-schedule": "zb1p",
             "--num-layers-per-virtual-pipeline-stage": str(ctx.cal.workload.num_layers // c.pp)}
    return ctx.best("zero_bubble", [(replace(c, schedule="zb1p"), None, flags)], e,
                    lambda k: "the zero-bubble schedule (ZB1P) instead of 1F1B",
                    why="splitting each backward into its input and weight gradients lets the weight passes run "
                        "while a stage would wait for its neighbours: the bubble shrinks from (p-1)(F+B+W) to "
                        "(p-1)(F+B-W) (Qi et al. 2023, ZB-H1); every stage then holds min(m, p) micro-batches, as the "
                        "first does under 1F1B (the deferred weight passes keep their layers' inputs)",
                    assumptions=[f"weight gradients {ctx.cal.workload.weight_share:.0%} of each layer's backward "
                                 "(model calibration)", _split_words(ctx),
                                 "torchtitan: --parallelism.pipeline_parallel_schedule InterleavedZeroBubble; "
                                 "Megatron-LM has no zero-bubble schedule"] + ([host] if host else []),
                    confidence="low" if host else None)


def _split_words(ctx: Context) -> str:
    """What the zero-bubble price holds of torch's split backward's extra cost over the fused one: a share of the
    backward on a host timeline, host time where a GPU waits on the host, nothing where kernels hide it."""
    w, what = ctx.cal.workload, "torch's split backward (input, then weight gradients: two autograd passes)"
    if w.split_backward_extra:
        return (f"{what} priced {w.split_backward_extra:.0%} dearer than the fused one on every stage past the first "
                "(measured on CPU, torch 2.13: 7-18% over twelve pairs of runs on two machines, the first stage's "
                "unchanged), paid in its weight passes: the input pass, which the stage before waits for, measured "
                "at the fused backward's input share (benchmarks/README.md)")
    if w.split_backward_host_s:
        waiting = waits_on_host(ctx.d)     # what set it in the calibration; None only for another diagnosis's
        seen = f" ({waiting[0]:.0%} idle between kernels of {waiting[1]:.3g} us median)" if waiting else ""
        return (f"{what} priced {w.split_backward_host_s * 1e3:.3g} ms of host time a layer and micro-batch over the "
                f"fused one on every stage past the first, paid in full: the GPU waits on the host{seen}. Measured on "
                "an H200 (torch 2.11, bf16, h 512-1024, issued as the schedule issues them): 1.1-1.7 ms a layer and "
                "micro-batch, the two passes 1.6-2.8x the fused backward's time (benchmarks/split_backward.py)")
    return (f"{what} priced as dear as the fused one: on a GPU its extra is host time, which queued kernels hide "
            "where the GPU does not wait on the host (measured on an H200, torch 2.11, bf16: 0.1-0.5 ms a layer and "
            "micro-batch, 1-3% of the forward and backward, at h 4096-8192; 1.1-1.7 ms where it waits, at h "
            "512-1024: benchmarks/split_backward.py)")


def _host_schedule_caveat(ctx: Context) -> Optional[str]:
    """On a host (CPU) timeline a pipeline schedule's change costs the runtime's host work per action:
    the model prices what the run's trace shows (Workload.action_host_s between actions, Workload.post_host_s
    a post, paid at each transfer the multi-stage runtime posts as an action of its own), but not that
    runtime's other work per action, nor the slower operators measured under interleaving
    (benchmarks/README.md): said, and the confidence low."""
    if not ctx.d.host_timeline:
        return None
    return ("on a CPU timeline the pipelining runtime's host time is priced at what this trace shows: between actions, "
            "and a post at each send and receive, which torch's multi-stage runtime (interleaved 1F1B, ZB1P) runs as "
            "actions of their own; that runtime's other host work per action is not priced (~0.6 against 1F1B's "
            "~0.33 ms a gap, untraced). Where actions take a few ms it can outweigh the bubble removed (measured on CPU, "
            "~2 ms actions, two sessions: interleaved 1F1B -16..+53%, ZB1P -11..+27%); with 20-100 ms "
            "actions ZB1P measured -13.2% against -13.1% predicted and interleaved 1F1B -8.3% against -11.9% (the "
            "median over 84 and 97 pairs of runs of fourteen readings, priced at this code): interleaving's gain "
            "over-priced there, its runs' operators ~3% slower than their 1F1B pairs' (the compute per layer "
            "calibrated on each), which a 1F1B trace does not show (benchmarks/README.md, "
            "benchmarks/tune_record.py)")


def _gpu_schedule_caveat(ctx: Context) -> Optional[str]:
    """On a GPU timeline that waits on the host between its kernels (calibrate.waits_on_host, the
    micro-batch rule's launch-bound evidence), the multi-stage runtime's extra host time per action
    lands on the step, and the model does not price it (measured on the H200 sample: sample_traces/README.md): said, and
    the confidence low."""
    waiting = waits_on_host(ctx.d)
    if waiting is None:
        return None
    idle, med = waiting
    return (f"the GPU waits on the host ({idle:.0%} idle between kernels of {med:.3g} us median), where torch's "
            "multi-stage pipelining runtime (interleaved 1F1B, ZB1P) spends more host time per action than 1F1B's "
            "single-stage one, which is not priced: on one H200, a PP2 job of this kind (sample_traces/"
            "h200_pp2_memory) took 120-126 ms a step under interleaved 1F1B and the zero-bubble schedule with two "
            "stages a rank against 62-65 ms under 1F1B (untraced steps)")


def _schedule_caveat(ctx: Context) -> Optional[str]:
    """What the schedule levers' price leaves out on this timeline, if anything (host or GPU)."""
    return _host_schedule_caveat(ctx) or _gpu_schedule_caveat(ctx)


def _host_overlap_caveat(ctx: Context) -> Optional[str]:
    """On a host (CPU) timeline gloo runs an overlapped all-reduce on threads of its own, which need a
    core the backward may be using. Where the run's facts say the ranks leave a core idle the model's
    hiding stands; where they say the ranks take every core the model hides none (calibrate.shared_cores,
    and the rule declines); where they do not say, it is said, and the confidence low."""
    if shared_cores(ctx.d) is not None:
        return None
    return ("on a CPU timeline gloo's threads run the overlapped all-reduce on a core of the host: the model hides all "
            "of it, as where a core is idle; whether one is is unknown (the host's cores, ranks per host and threads "
            "per rank: diag_run.json, or --host-cpus, --ranks-per-host, --threads-per-rank). With every core taken, "
            "the trainer's 2-rank jobs on 2 cores measured -3..+5% against -5..-8% predicted (benchmarks/README.md)")


def interleave(ctx: Context, e: list) -> list[Recommendation]:
    """Interleaved virtual stages (Megatron-LM's interleaved 1F1B), simulated on the model: the
    bubble shrinks to (p-1)/(v·m) of ideal compute, the pipeline sends grow v-fold."""
    c = ctx.cal.config
    per_stage = ctx.cal.workload.num_layers // c.pp
    if c.schedule != "1f1b" or per_stage < 2 or c.num_micro_batches % c.pp:
        return []
    cands = [(replace(c, schedule="interleaved", virtual_stages=v), None,
              {"--pipeline-schedule": "interleaved-1f1b",
               "--num-layers-per-virtual-pipeline-stage": str(per_stage // v)})
             for v in _divisors(per_stage)[1:]]
    host = _schedule_caveat(ctx)
    return ctx.best("interleave", cands, e, lambda k: f"interleaved 1F1B with {k.virtual_stages} virtual stages "
                    f"per rank ({per_stage // k.virtual_stages} layer{'s' * (per_stage // k.virtual_stages > 1)} each)", prefer=lambda k: k.virtual_stages,
                    why="interleaving divides the bubble by v (Megatron-LM: (p-1)/(v·m) of ideal compute) at the "
                        "price of v times more pipeline messages, which the model prices on the measured PP link and, on "
                        "a host timeline, at the thread's measured time to post each",
                    assumptions=["the fewest virtual stages within 80% of the best predicted gain are proposed"]
                    + ([host] if host else []),
                    runnable=INTERLEAVED_RUNNABLE, confidence="low" if host else None)


def recompute_off(ctx: Context) -> list[Recommendation]:
    """Full activation recompute on, and the memory model says the run fits without it on this
    device -> turn it off: one forward per micro-batch less (selective recompute if only that fits)."""
    if ctx.cal is None or ctx.cal.workload.recompute != "full" or not (ctx.memory and ctx.capacity):
        return []
    cfg = ctx.mem_config
    for mode in ("none", "selective"):
        peak = ctx.memory.peak(replace(cfg, recompute=mode)).total
        if peak <= ctx.capacity:
            break
    else:
        return []
    e = [ev(f"modelled peak memory with {mode} recompute / device memory", peak / ctx.capacity, 1.0, "ratio",
            "docs/memory.md")]
    w = replace(ctx.cal.workload, recompute="none")          # the model has no selective recompute: its
    return ctx.best("recompute", [(ctx.cal.config, w, {"--recompute-granularity": None if mode == "none" else mode})],
                    e, lambda k: "no activation recompute" if mode == "none" else "selective instead of full recompute",
                    why="full recompute runs every layer's forward again in backward (a third more compute) to "
                        "save activation memory this run does not need",
                    assumptions=[] if mode == "none" else ["selective recompute's attention recompute not priced"],
                    memory={"recompute": mode})


def zero_down(ctx: Context) -> list[Recommendation]:
    """Parameters, gradients or optimizer states sharded over DP (ZeRO-1/2/3), and the memory model
    says the run fits on this device with less sharding -> the least that fits: ZeRO-3's per-layer
    all-gathers (or ZeRO-1/2's parameter all-gather) dropped, priced on the measured DP link."""
    if ctx.cal is None or not ctx.cal.config.zero or not (ctx.memory and ctx.capacity):
        return []
    c, cfg = ctx.cal.config, ctx.mem_config
    peaks = {z: ctx.memory.peak(replace(cfg, zero=z)).total for z in range(c.zero)}
    z = next((z for z, peak in peaks.items() if peak <= ctx.capacity), None)
    if z is None:
        return []
    peak = peaks[z]
    e = [ev(f"modelled peak memory with ZeRO-{z} / device memory", peak / ctx.capacity, 1.0, "ratio",
            "docs/memory.md")]
    return ctx.best("zero_down", [(replace(c, zero=z), None, zero_flags(z, before=c.zero))], e,
                    lambda k: f"ZeRO-{k.zero} instead of ZeRO-{c.zero}" if k.zero else
                    f"replicated data parallelism instead of ZeRO-{c.zero}",
                    why=("ZeRO-3 all-gathers every layer's parameters before its forward and again before its "
                         "backward, every micro-batch" if c.zero >= 3 else "the distributed optimizer all-gathers "
                         "the parameters after each step") + "; this run fits without that much sharding",
                    assumptions=["Megatron-LM's distributed optimizer for ZeRO-1/2 (gradients reduce-scattered, "
                                 "parameters all-gathered after the step); the instrumented trainer's ZeRO-1 "
                                 "all-reduces and broadcasts instead"] if z in (1, 2) else [],
                    memory={"zero": z})


def dp_overlap(ctx: Context) -> list[Recommendation]:
    """Exposed DP gradient all-reduce -> --overlap-grad-reduce, else a different bucket size. With CP
    the gradients travel over the DP x CP group (dp_cp) when the trace names it."""
    cp = ctx.cal is not None and ctx.cal.config.cp > 1
    a = (ctx.axis("dp_cp") if cp else None) or ctx.axis("dp")
    if a is None or ctx.cal is None or (a.exposed_per_step_s or 0) < DP_EXPOSED_MIN * ctx.step_s:
        return []
    c = ctx.cal.config
    e = [ev("exposed DP communication", a.exposed_per_step_s * 1e3, DP_EXPOSED_MIN * ctx.step_s * 1e3, "ms/step",
            "Communication by parallel axis")]
    if not c.overlap_grad_reduce:
        if ctx.cal.workload.shared_cores:
            after = ctx.cal.predict(replace(c, overlap_grad_reduce=True))
            ctx.declined.append(f"overlap the DP gradient all-reduce with backward ({100 * (after / ctx.step_s - 1):+.1f}% "
                                f"predicted): {host_words(ctx.d.facts)}, and gloo's threads would reduce on them; a "
                                "host with an idle core per rank, or fewer threads per rank, would let it hide")
            return []
        host = _host_overlap_caveat(ctx)
        return ctx.best("dp_overlap", [(replace(c, overlap_grad_reduce=True), None, {"--overlap-grad-reduce": ""})],
                        e, lambda k: "overlap the DP gradient all-reduce with backward",
                        why="each gradient bucket is all-reduced as soon as the last micro-batch's backward has "
                            "produced it, hidden behind the remaining backward",
                        assumptions=[host] if host else [], confidence="low" if host else None)
    cands = [(replace(c, bucket_bytes=c.bucket_bytes * k), None, {"--ddp-bucket-size": str(int(c.bucket_bytes * k / 4))})
             for k in (0.25, 0.5, 2.0)]
    return ctx.best("dp_bucket", cands, e, lambda k: f"DP buckets of {k.bucket_bytes / 4:,.0f} elements",
                    why="smaller buckets start reducing earlier in backward; larger ones pay less latency")


def tp_layout(ctx: Context) -> list[Recommendation]:
    """Slow or cross-node TP collectives -> TP inside a node; lower TP with more PP or DP."""
    a = ctx.axis("tp")
    if a is None or ctx.cal is None or (a.exposed_per_step_s or 0) < TP_EXPOSED_MIN * ctx.step_s:
        return []
    c, L = ctx.cal.config, ctx.cal.workload.num_layers
    e = [ev("exposed TP communication", a.exposed_per_step_s * 1e3, TP_EXPOSED_MIN * ctx.step_s * 1e3, "ms/step",
            "Communication by parallel axis")]
    if c.tp > GPUS_PER_NODE:
        e.append(ev("TP size (GPUs per node assumed 8)", c.tp, GPUS_PER_NODE, "ranks", "diag_run.json"))
    cands = []
    if c.tp % 2 == 0 and L % (c.pp * 2) == 0:
        cands.append((replace(c, tp=c.tp // 2, pp=c.pp * 2), None, {"--tensor-model-parallel-size": str(c.tp // 2),
                                                                     "--pipeline-model-parallel-size": str(c.pp * 2)}))
    if c.tp % 2 == 0 and c.num_micro_batches % 2 == 0:
        cands.append((replace(c, tp=c.tp // 2, dp=c.dp * 2, num_micro_batches=c.num_micro_batches // 2), None,
                      {"--tensor-model-parallel-size": str(c.tp // 2)}))
    return ctx.best("tp_layout", cands, e, lambda k: f"TP {k.tp} x PP {k.pp} x DP {k.dp} instead of "
                    f"TP {c.tp} x PP {c.pp} x DP {c.dp}", slowdown={},
                    why="TP all-reduces sit on the critical path of every layer; fewer TP ranks send fewer, and PP "
                        "or DP traffic is smaller or hidden",
                    assumptions=["stages assumed balanced in the new layout"])


def cp_down(ctx: Context) -> list[Recommendation]:
    """Exposed context-parallel exchange -> half the CP ranks and twice the DP at the same world size
    and global batch (half the micro-batches, else micro-batches half the size), priced on the model;
    each rank then holds twice the sequence, so the memory model checks the fit (and pairs a memory
    lever, or drops the change, when it does not)."""
    a = ctx.axis("cp")
    if a is None or ctx.cal is None or ctx.cal.config.cp < 2 or ctx.cal.config.cp % 2 \
            or (a.exposed_per_step_s or 0) < CP_EXPOSED_MIN * ctx.step_s:
        return []
    c, w = ctx.cal.config, ctx.cal.workload
    e = [ev("exposed CP communication", a.exposed_per_step_s * 1e3, CP_EXPOSED_MIN * ctx.step_s * 1e3, "ms/step",
            "Communication by parallel axis")]
    flags, half = {"--context-parallel-size": str(c.cp // 2)}, replace(c, cp=c.cp // 2, dp=c.dp * 2)
    cands = []
    fewer = c.num_micro_batches // 2       # interleaved 1F1B needs a multiple of the stages
    if c.num_micro_batches % 2 == 0 and (c.schedule != "interleaved" or fewer % c.pp == 0):
        cands.append((replace(half, num_micro_batches=fewer), None, flags))
    elif c.micro_batch_size % 2 == 0:
        cands.append((replace(half, micro_batch_size=c.micro_batch_size // 2),
                       with_micro_batch(w, c.micro_batch_size, c.micro_batch_size // 2),
                       {**flags, "--micro-batch-size": str(c.micro_batch_size // 2)}))
    return ctx.best("cp_down", cands, e, lambda k: f"CP {k.cp} x DP {k.dp} instead of CP {c.cp} x DP {c.dp} "
                    f"({k.num_micro_batches} micro-batch{'es' * (k.num_micro_batches > 1)} of {k.micro_batch_size}, "
                    "same global batch)",
                    why="every layer all-gathers K and V over the CP group in forward and backward and passes "
                        "their gradients round the ring, on the critical path; half the CP ranks exchange over "
                        "a smaller group, and the DP ranks that take their place reduce gradients once a step",
                    assumptions=["CP's exchange priced as torch's all-gather rotate method, exposed (docs/model.md); "
                                 "Megatron-LM's ring overlaps part of it with attention, so the gain may be smaller",
                                 "the data-parallel size follows: world size / (TP x PP x CP)"],
                    runnable=CP_RUNNABLE)


def _host_fixed_share(ctx: Context) -> float:
    """The calibrated host operators' fixed cost per step (CPU timelines), as a share of the step."""
    if ctx.cal is None or not ctx.step_s:
        return 0.0
    w, c = ctx.cal.workload, ctx.cal.config
    per_layer = w.host_fixed_s_per_layer + (w.dtensor_s_per_layer if c.tp > 1 else 0.0)
    return per_layer * c.num_micro_batches * (w.num_layers // c.pp) / ctx.step_s


def micro_batch(ctx: Context) -> list[Recommendation]:
    """Launch-bound (idle between short kernels, or host-bound), or on CPU the operators' fixed cost
    paid per micro-batch -> larger micro-batch, same global batch."""
    if any((x.share_of_step or 0) > 1.0 for x in ctx.d.findings):
        return []     # the step marks do not bound the work: no per-step evidence
    idle = [f for f in ctx.d.findings if f.kind == FindingKind.IDLE and (f.share_of_step or 0) >= IDLE_MIN]
    host = _host_fixed_share(ctx)
    e = [ev(f.what, f.share_of_step, IDLE_MIN, "fraction of step", "Where the time goes") for f in idle[:1]]
    if host >= HOST_FIXED_MIN:
        e.append(ev("host operators' fixed cost, paid per micro-batch", host, HOST_FIXED_MIN, "fraction of step",
                    "calibration (RankResult.host_ops)"))
    if not e:
        return []
    f = idle[0] if idle else None
    med = median_kernel_us(ctx.d)
    long_kernels = False
    if med is not None and f is not None:
        e.append(ev("median mean duration of top compute kernels", med, SHORT_KERNEL_US, "us", "Top kernels"))
        long_kernels = med >= SHORT_KERNEL_US
        if long_kernels and not idle_waits_on_host(ctx.d, f.share_of_step, med):
            return []  # long kernels: idle is not launch overhead, and a straggler explains it better
        if long_kernels:   # fired on the waiting-on-the-host threshold: the evidence says that one
            e[0] = ev(f.what, f.share_of_step, WAITING_HOST_MIN, "fraction of step", "Where the time goes")
    if ctx.cal is None:
        return _double_micro_batch(ctx, f, e, long_kernels)
    c = ctx.cal.config
    cands = [(replace(c, micro_batch_size=c.micro_batch_size * k, num_micro_batches=c.num_micro_batches // k),
              with_micro_batch(ctx.cal.workload, c.micro_batch_size, c.micro_batch_size * k),
              {"--micro-batch-size": str(c.micro_batch_size * k)})
             for k in (2, 4, 8) if c.num_micro_batches % k == 0]
    return ctx.best("micro_batch", cands, e, lambda k: f"micro-batch {k.micro_batch_size} instead of "
                    f"{c.micro_batch_size} (same global batch)",
                    why="per-kernel launch and host overhead is paid per micro-batch; larger ones amortise it "
                        "(the model also prices the bigger pipeline bubble of fewer micro-batches)",
                    assumptions=[])


def _double_micro_batch(ctx: Context, f, e: list, long_kernels: bool = False) -> list[Recommendation]:
    """Without the run's shape: twice the micro-batch halves the per-sample launches, so half the idle.
    With long kernels (the idle is not launch overhead) the device waits on the host's own work between
    them, which a larger micro-batch amortises only where that work is paid per micro-batch: said, with
    where to look."""
    if long_kernels:
        why = ("the device is idle between kernels that are not short, so it waits on the host's work between "
               "them, not on launches; where that work is paid per micro-batch (Python, dispatch, per-batch "
               "copies), a larger micro-batch gives each round of it more device work")
        checks = ["what the host thread runs in the device's idle gaps (its operators between the kernels): a data "
                  "loader, a synchronisation (.item(), .cpu(), a blocking copy) or logging is removed by itself, "
                  "not by a larger micro-batch"]
    else:
        why = "the device waits on the host between kernels; a larger micro-batch gives each launch more work"
        checks = []
    return ctx.make("micro_batch", "twice the micro-batch, half the micro-batches (same global batch)", e,
                    {"--micro-batch-size": "2x current"}, ctx.step_s - 0.5 * f.seconds_per_step, confidence="low",
                    why=why, checks=checks, runnable=False,
                    assumptions=["no diag_run.json: estimated as half the idle time removed, not simulated; "
                                 "check the device memory"])


def _splits(layers: int, stages: int):
    """Every way to give each stage at least one layer (few enough for the pipelines we see)."""
    if stages == 1:
        yield (layers,)
        return
    for first in range(1, layers - stages + 2):
        for rest in _splits(layers - first, stages - 1):
            yield (first,) + rest


def _run_split(ctx: Context, layers: int, stages: int) -> Optional[list[int]]:
    """The measured run's layers per stage: its uneven split where the facts give one that adds up
    (memory.run_split), else even; None where the layers do not split evenly either."""
    try:
        return stage_layer_counts(layers, stages, *run_split(ctx.d.facts, stages)[0])
    except ValueError:
        return None


def rebalance(ctx: Context) -> list[Recommendation]:
    """One stage computes longer than the rest -> move layers away from it. Each stage's compute is
    its layers at the fastest stage's time per layer plus what else it runs (embedding, loss, a slow
    device), from the run's own split (even, or Megatron-LM's uneven first/last stage). Not with
    virtual stages: a stage's compute is then its chunks', which the first/last counts split unevenly."""
    p = ctx.d.pipeline
    if not p or p.p < 2 or ctx.cal is None or p.p > 8 or ctx.cal.config.virtual_stages > 1:
        return []
    comp = [s.compute_s for s in sorted(p.stages, key=lambda s: s.stage)]
    if min(comp) <= 0 or max(comp) / min(comp) < IMBALANCE_MIN:
        return []
    L = ctx.cal.workload.num_layers
    if (now := _run_split(ctx, L, p.p)) is None:
        return []
    layer_s = min(x / n for x, n in zip(comp, now))   # the fastest stage per layer: least extra work
    extra = [x - n * layer_s for x, n in zip(comp, now)]   # embedding, loss, a slow device...
    best = min(_splits(L, p.p), key=lambda sp: max(n * layer_s + x for n, x in zip(sp, extra)))
    mean = sum(comp) / len(comp)
    slow = {s: (n * layer_s + x) / mean for s, (n, x) in enumerate(zip(best, extra))}
    worst = comp.index(max(comp))
    e = [ev(f"compute per step, stage {worst} / stage {comp.index(min(comp))}", max(comp) / min(comp),
            IMBALANCE_MIN, "ratio", "Pipeline bubble per stage (compute ms/step)")]
    if best == tuple(now):
        return []
    flags = dict(zip(SPLIT_FLAGS, (str(best[0]), str(best[-1]))))
    after = ctx.cal.predict(ctx.cal.config, slowdown=slow)
    runnable = len(set(best[1:-1])) <= 1          # Megatron-LM and the trainer split the middle stages evenly
    was = f"{now[0]} each" if len(set(now)) == 1 else "/".join(map(str, now))
    return ctx.make("rebalance", "layers per stage " + "/".join(map(str, best)) + f" instead of {was}", e, flags,
                    after, why="every stage waits for the slowest one in steady state; moving layers off it "
                               "shortens the critical path",
                    assumptions=[f"per-layer time {layer_s * 1e3:.3g} ms from the fastest stage; the rest of each "
                                 "stage's compute (embedding, loss) stays where it is"],
                    # the memory model holds the split the flags can say (first and last stage, the rest even)
                    memory={"first_stage_layers": best[0], "last_stage_layers": best[-1]} if runnable else None,
                    runnable=runnable)


def bf16(ctx: Context) -> list[Recommendation]:
    """fp32 GEMMs dominate GPU compute -> bf16 (tensor cores)."""
    on_gpu = [r for r in ctx.d.ranks if r.timeline == "gpu"]
    if not on_gpu or not ctx.step_s:
        return []
    ks = [k for k in on_gpu[0].top_kernels if k.kind == "compute"]
    total = sum(k.share for k in ks)
    fp32 = sum(k.share for k in ks if FP32_GEMM.search(k.name) and not HALF.search(k.name))
    if total <= 0 or fp32 / total < FP32_MIN:
        return []
    r = on_gpu[0]
    steps = max(r.window_steps, 1)
    saved = 0.5 * (fp32 / total) * r.breakdown.compute_s / steps
    e = [ev(f"fp32 GEMM share of compute kernel time, rank {r.rank}", fp32 / total, FP32_MIN, "fraction",
            "Top kernels")]
    return ctx.make("bf16", "bf16 mixed precision instead of fp32", e, {"--dtype": "bf16"}, ctx.step_s - saved,
                    confidence="low", why="fp32 GEMMs run on CUDA cores (or TF32); bf16 runs on tensor cores at "
                    "several times the rate (Megatron-LM: --bf16)",
                    assumptions=["fp32 GEMM time halved (conservative: data-sheet ratios are 2-16x), "
                                 "from the top kernels of one rank"])


def _wait_for(ctx: Context, s) -> Optional[Finding]:
    """The finding of the others' wait for straggler s (none for a rank found from its step time)."""
    return next((f for f in ctx.d.findings if f.kind == FindingKind.STRAGGLER and f.ranks == s.ranks), None)


def _straggler_checks(ctx: Context, s) -> list[str]:
    """What to look at on the late ranks: how idle each is tells a late host from a slow device."""
    checks = [f"{s.who}: {s.reason}: {s.evidence}"]
    late = [x for x in ctx.d.ranks if x.rank in s.ranks]
    cause = ("a late host (data loading, CPU contention, GC, logging) if high, a slow device (clocks, thermals: "
             "nvidia-smi -q -d PERFORMANCE) if low")
    if len(late) == 1:
        r = late[0]
        checks.append(f"rank {r.rank} is {r.breakdown.pct(r.breakdown.idle_s):.0f}% idle on its {r.timeline} "
                      f"timeline: {cause}")
    elif late:
        idle = ", ".join(f"rank {r.rank} {r.breakdown.pct(r.breakdown.idle_s):.0f}%" for r in late[:8])
        checks.append(f"idle on their {late[0].timeline} timelines: {idle}{', ...' * (len(late) > 8)}: {cause}")
    return checks + [_where_to_look(s)]


def _where_to_look(s) -> str:
    if s.kind == StragglerKind.NODE:
        return f"node {s.node}: its NIC / NVLink counters and other jobs on it"
    if s.kind == StragglerKind.BLOCK:
        return "whether these ranks share a node, and that node's NIC / NVLink counters and other jobs on it"
    if len(s.ranks) > 1:
        return "their nodes' NIC / NVLink counters and other jobs on those nodes"
    return "its node's NIC / NVLink counters and other jobs on the node"


def straggler(ctx: Context) -> list[Recommendation]:
    """Ranks the others wait for -> which, and what to check on them (no flag fixes a slow host).

    Fires when the others' wait is STRAGGLER_MIN of the step, and always when it is the step's
    biggest loss: a report that leads with waiting for a rank never ends in "nothing worth changing"."""
    out = []
    top = ctx.d.findings[0] if ctx.d.findings else None
    traced = window_step(ctx.d) or ctx.step_s          # the steps the wait was measured in
    for s in (ctx.d.comm.stragglers if ctx.d.comm else []):
        wait = _wait_for(ctx, s)
        more = []
        if wait:
            share = wait.seconds_per_step / traced if traced else None
            if share is not None and share < STRAGGLER_MIN and wait is not top:
                continue
            e = [ev(f"others' wait for {s.who}", wait.seconds_per_step * 1e3,
                    STRAGGLER_MIN * (traced or 0) * 1e3, "ms/step", "Where the time goes; straggler line")]
            # the wait's share of the steps it was measured in, taken off the step the predictions start
            # from (the untraced steps' where the calibration removed the profiler's cost): one basis
            after = ctx.step_s * (1 - share) if ctx.step_s and share is not None else None
            if after is not None and after <= 0:    # a wait of a whole step or more: no step left to predict
                after = None
            if after is not None and abs(ctx.step_s / traced - 1) > 0.005:
                more = [f"the wait is {share:.1%} of the traced steps ({traced * 1e3:,.1f} ms), taken off the step "
                        f"the predictions start from ({ctx.step_s * 1e3:,.1f} ms; model calibration)"]
        else:
            r = next((x for x in ctx.d.ranks if x.rank == s.rank), None)
            e = [ev(f"step time of rank {s.rank}", (r.step_time_s or 0) * 1e3 if r else 0.0, 0.0, "ms", s.evidence)]
            after = None
        one = len(s.ranks) == 1
        out += ctx.make("straggler", f"find out why {s.who} {'is' if one else 'are'} late", e, {}, after,
                        confidence="low", checks=_straggler_checks(ctx, s),
                        why="collectives finish when the last rank arrives; the others' wait is time the job "
                            f"loses to {'one rank' if one else 'these ranks'}",
                        assumptions=[f"upper bound: the others' wait for {s.who} removed (in the collectives "
                                     "it held back, directly or through a peer it kept waiting); the next "
                                     "latest rank may then hold them back"] + more, runnable=False,
                        upper_bound=after is not None)
    return out


def dp_bucket_curve(ctx: Context) -> list[Recommendation]:
    """DP buckets below the size at which `diag bench` reaches its plateau -> buckets of that size.

    Priced from the measured curve, not the model (whose links have one bandwidth at every
    size): the exposed DP time shrinks like busbw now / busbw on the plateau.
    """
    a = ctx.axis("dp")
    meta = ctx.d.facts
    ops = [o for o in (ctx.d.comm.ops if ctx.d.comm else []) if o.axis == "dp" and o.op == "all_reduce"
           and o.achievable_gbps and o.plateau_gbps and o.plateau_bytes and o.median_bytes]
    if a is None or not ops or not ctx.step_s or not meta.ddp_bucket_size:
        return []
    o = max(ops, key=lambda x: x.time_s)
    per_element = GRAD_BYTES
    grads = (meta.parameter_count or 0) * per_element / max(1, (meta.tp or 1) * (meta.pp or 1))
    if o.achievable_gbps >= DP_CURVE_SHARE * o.plateau_gbps or o.plateau_bytes <= o.median_bytes \
            or not grads or o.plateau_bytes > grads:       # a bucket larger than all gradients never fills
        return []
    exposed = a.exposed_per_step_s or 0.0
    after = ctx.step_s - exposed * (1 - o.achievable_gbps / o.plateau_gbps)
    elements = int(o.plateau_bytes / per_element)
    calls = sum(x.time_s for x in ctx.d.comm.ops if x.axis == "dp")
    if a.comm_s and calls >= DP_CONCURRENT * a.comm_s:
        ctx.declined.append(
            f"DP buckets of {elements:,} elements ({100 * (after / ctx.step_s - 1):+.1f}% from the diag bench curve): "
            f"the run's DP collectives overlapped one another (their transfers add up to {calls / a.comm_s:.2g}x the "
            "time the DP axis communicated), as gloo runs the buckets it is handed on its worker threads, while "
            "diag bench times its calls one at a time: the curve's latency is not what this run paid (measured on "
            "a CPU job: -28% priced so, -2..-5% measured)")
        return []
    e = [ev("DP all-reduce busbw achievable at its size", o.achievable_gbps, DP_CURVE_SHARE * o.plateau_gbps,
            "GB/s", "Collectives by axis, op and message size (diag bench curve)"),
         ev("exposed DP communication", exposed * 1e3, 0.0, "ms/step", "Communication by parallel axis")]
    return ctx.make("dp_bucket_curve", f"DP buckets of {elements:,} elements (messages of "
                    f"{o.plateau_bytes / 2**20:,.1f} MiB, where diag bench reaches its plateau)", e,
                    {"--ddp-bucket-size": str(elements)}, after,
                    why=f"at {o.median_bytes / 2**20:,.2f} MiB the DP links deliver {o.achievable_gbps:,.2f} GB/s; "
                        f"diag bench measured {o.plateau_gbps:,.2f} GB/s from {o.plateau_bytes / 2**20:,.1f} MiB",
                    assumptions=["priced from the diag bench curve: exposed DP time scales with busbw",
                                 "fewer, larger buckets start later in backward: with --overlap-grad-reduce "
                                 "less of them may hide"])


# Without a calibrated model (a foreign job whose shape is unknown) a measured loss still earns a
# recommendation: what to try for it, priced at its upper bound (the whole loss removed), with what
# would price it properly. Lever per axis in Megatron-LM's terms.
UNPRICED_LEVERS = {
    "tp": ("hide or shrink the exposed TP communication",
           "sequence parallelism (--sequence-parallel), TP inside one node, or a lower TP with more PP/DP"),
    "pp": ("shrink the pipeline bubble",
           "more micro-batches per step, or interleaved stages (--num-layers-per-virtual-pipeline-stage)"),
    "dp": ("overlap the DP gradient reduction with backward", "--overlap-grad-reduce, larger DP buckets"),
    "dp_shard": ("hide the FSDP all-gathers and reduce-scatters",
                 "prefetching, fewer/larger FSDP units, or HSDP (replicate across nodes, shard within)"),
    "cp": ("hide the context-parallel exchange", "a lower CP size, or CP inside one node"),
    "ep": ("hide the expert all-to-alls", "a lower EP size, EP inside one node, or overlapped dispatch"),
}
UNPRICED_MIN = 0.05          # exposed communication of one axis, fraction of the step


def unpriced(ctx: Context) -> list[Recommendation]:
    """Large exposed communication on a run the model cannot price -> the levers for that axis,
    with the measured loss as the upper bound of the gain and what would price it."""
    if ctx.cal is not None or not ctx.step_s:
        return []
    out = []
    for a in (ctx.d.comm.axes if ctx.d.comm else []):
        lost = a.exposed_per_step_s or 0.0
        if a.axis not in UNPRICED_LEVERS or lost < UNPRICED_MIN * ctx.step_s:
            continue
        what, levers = UNPRICED_LEVERS[a.axis]
        e = [ev(f"exposed {a.axis.upper()} communication", lost * 1e3, UNPRICED_MIN * ctx.step_s * 1e3, "ms/step",
                "Communication by parallel axis")]
        out += ctx.make(f"{a.axis}_exposed", f"{what} (upper bound: the whole {lost * 1e3:,.0f} ms/step)", e, {},
                        ctx.step_s - lost, confidence="low", runnable=False, upper_bound=True,
                        why=f"{100 * lost / ctx.step_s:.0f}% of the step waits on {a.axis.upper()} communication "
                            f"that no compute hides; levers: {levers}",
                        assumptions=["upper bound: the whole exposed time removed; not priced, because the step-time "
                                     "model could not be calibrated (give the model shape: --config with the job's "
                                     "arguments, or --num-layers, --micro-batch-size, --num-micro-batches ...)"])
    return out


RULES = (bubble, recompute_off, zero_down, dp_overlap, dp_bucket_curve, tp_layout, cp_down, micro_batch, rebalance, bf16, straggler, unpriced)
