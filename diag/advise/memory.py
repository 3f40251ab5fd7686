"""Peak memory per rank, modelled: whether a configuration change fits before anyone queues it.

Problem: a layout that the step-time model prices as faster is worth nothing if it does not fit:
on a cluster that is an out-of-memory error after the queue. This model splits a rank's peak
into the parts a change moves, each from published arithmetic, and is calibrated on the run's
measured peak when there is one (the residual, measured - modelled, is held in every
prediction), so a prediction for a change starts from what this job really used.

Per rank, in bytes (docs/memory.md works every term by hand):
- parameters on the rank: the transformer blocks' `gpt_params` share / (tp · pp), plus the input
  embedding (V·h / tp) on the first stage and the output layer (V·h / tp) on the last (untied);
- weights, gradients and optimizer states per parameter (ZeRO, Rajbhandari et al. 2020; Megatron-LM
  mixed precision): bf16 weights 2 + fp32 main gradients 4 + Adam fp32 master, m, v 12 = 18 bytes;
  fp32 training 4 + 4 + 8 = 16. ZeRO stage 1 (`--use-distributed-optimizer`, sharding `optim`)
  divides the optimizer states by dp (dp · cp with context parallelism), stage 2 (`optim_grads`)
  the gradients too, stage 3 (`optim_grads_params`, FSDP) the weights too. The gradients are
  left out where the run frees them between steps and the peak comes before the step's first
  gradient (`grads_at_peak`);
- activations per layer per micro-batch (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", table 2; 16-bit activations, x2 for fp32):
  no TP s·b·h·(34 + 5·a·s/h); TP t s·b·h·(10 + 24/t + 5·a·s/(h·t)); TP with sequence parallelism
  s·b·h·(34 + 5·a·s/h)/t. The 5·a·s/h term is the s x s attention scores (softmax, dropout):
  attention that keeps none (flash, memory-efficient or cuDNN SDPA, flash-attn: `Shape.attention`
  "fused", from the trace) drops it, and so does selective recompute; unknown attention keeps it
  (the conservative count). Full recompute keeps each layer's input, 2·s·b·h (/t with SP), and
  in backward re-materialises one layer of one micro-batch at a time: that layer's activations
  less its input, once. Context parallelism divides s by cp;
- the last stage's head (Korthikanti et al. 2022, section 4.3): the final norm's input and the
  output layer's input (2·s·b·h each), the logits in the compute dtype (2·s·b·V in bf16 or fp16,
  4 in fp32: the training loop or the pipeline stage holds them through backward) and the fp32
  log-softmax the loss keeps (4·s·b·V), /t, per micro-batch in flight there; and once, at the
  loss's backward, the fp32 gradients of the log-softmax's output and input (8·s·b·V/t). Measured:
  15.5 bytes per logit element per micro-batch on CPU in fp32 (the model: 16), against the 4 (8 in
  fp32) that Korthikanti's fp32 logits alone count (docs/memory.md);
- micro-batches in flight on stage i of p (Narayanan et al. 2021): 1F1B min(m, p - i); GPipe m;
  interleaved 1F1B the 1F1B count times (1 + (p - 1) / (p · v));
- ZeRO-3's own buffers (FSDP2, `fully_shard` per transformer block and per stage, as torchtitan and
  the trainer wrap; torch 2.13's source, docs/memory.md): at the peak it holds the stage root's
  parameters unsharded (the embedding on the first stage, the output layer on the last: gathered
  at the start of backward and kept through it) and two blocks' (the block being computed and the
  all-gather output of the next: prefetched in backward, kept until the next copy-out in forward),
  in the weights' dtype; on gloo one more block's, the flat buffer gloo's all-gather fills before
  copying out. When the stage runs more micro-batches than it holds in flight, the peak comes in a
  later backward, and torch's pipelining defers FSDP2's reduce-scatter to the step's end: every
  parameter's unsharded gradient (fp32 main-gradient bytes) is held there;
- replicated DP's gradient buckets (ZeRO 0-1, dp · cp > 1): torch's DDP with its default
  `gradient_as_bucket_view=False` keeps a flat bucket per group of parameters beside their
  gradients (torch/nn/parallel/distributed.py; reducer.cpp copies each gradient in, and the
  all-reduced result back), one more copy of the gradients for the life of the model, and so does
  the trainer's DP sync (its last step's buckets); Megatron-LM's DDP keeps none (the gradients are
  views of its contiguous grad buffer, which the all-reduce works on), nor DDP with
  `gradient_as_bucket_view=True`. Counted only when the run says which (facts.gradient_as_bucket_view).
"""
from __future__ import annotations

from dataclasses import field, replace
from typing import Optional

from ..analysis.results import MemoryParts
from ..analysis.throughput import gpt_params
from ..hardware import device_memory
from ..layout import stage_layer_counts
from ..record import record

RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
SHARDING = {"optim": 1, "optim_grads": 2, "optim_grads_params": 3}   # Megatron-LM's names
FSDP_GATHERED_BLOCKS = 2    # blocks unsharded at once under ZeRO-3: the one computed and the next one
GLOO_GATHER_COPIES = 1      # gloo's all-gather fills a flat buffer of the output's size, then copies out
GiB, MiB = float(1 << 30), float(1 << 20)
ATTENTION_WORDS = {
    "fused": "attention fused (the trace's ops): no s x s scores kept, selective recompute saves nothing",
    "eager": "attention eager (the trace's ops): its s x s scores counted (5·a·s/h)",
    None: "attention kind unknown (the trace names no attention op): its s x s scores counted (5·a·s/h), "
          "an upper bound if it is fused"}

BUCKET_WORDS = {
    False: "replicated DP's gradient buckets counted: its sync keeps them beside the gradients "
           "(gradient_as_bucket_view false), one more copy of them",
    True: "replicated DP's gradients are views of its buckets (gradient_as_bucket_view true): no copy counted",
    None: "replicated DP's gradient buckets not counted: whether its sync keeps them beside the gradients is "
          "unknown (torch DDP does by default, Megatron-LM's DDP does not): --[no-]gradient-as-bucket-view says"}


def human(n: float) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    return f"{n / GiB:,.3g} GiB" if n >= GiB else f"{n / MiB:,.3g} MiB"


@record(frozen=True)
class Shape:
    """The model's shape, as the memory model needs it."""

    num_layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: Optional[int] = None
    query_groups: Optional[int] = None
    swiglu: bool = False
    attention: Optional[str] = None     # "fused": keeps no s x s scores; "eager" or None: keeps them


@record(frozen=True)
class MemoryConfig:
    """What memory depends on in a configuration (Megatron-LM flag names in docs/memory.md)."""
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    micro_batch_size: int = 1
    num_micro_batches: int = 1
    schedule: str = "1f1b"              # 1f1b | gpipe | interleaved | zb1p
    virtual_stages: int = 1
    first_stage_layers: int = 0         # Megatron-LM's uneven split (stage_layer_counts); 0: an even share
    last_stage_layers: int = 0
    sequence_parallel: bool = False
    sp_whole_inputs: bool = True        # torch's DTensor SP: the column-parallel linears keep their gathered
                                        # inputs whole; False: Megatron-LM's, which keeps them sharded
    zero: int = 0                       # 0 replicated, 1 optimizer, 2 + gradients, 3 + weights sharded
    recompute: str = "none"
    dtype: str = "bf16"                 # bf16 (mixed precision, fp32 master) or fp32
    backend: str = "nccl"               # the DP collectives' backend (gloo: one more all-gather buffer)
    bucket_copy: bool = False           # replicated DP's sync keeps its gradient buckets beside the gradients
    grads_freed: bool = False           # the run sets its gradients to None between steps (grads_at_peak)

    def __post_init__(self) -> None:
        if self.zero not in ZERO_STAGES or self.recompute not in RECOMPUTE:
            raise ValueError(f"zero must be one of {ZERO_STAGES} and recompute one of {RECOMPUTE}")


@record
class Estimate:
    """One rank's modelled peak and its parts, in bytes."""
    stage: int
    weights: float
    grads: float
    optimizer: float
    activations: float
    in_flight: float                    # micro-batches whose activations are held at the peak
    other: float = 0.0                  # the calibration's residual: measured peak - modelled (any sign)
    words: list[str] = field(default_factory=list)
    sharding_buffers: float = 0.0       # ZeRO-3's gathered weights and deferred unsharded gradients
    dp_buckets: float = 0.0             # replicated DP's gradient buckets, where its sync keeps a copy

    @property
    def total(self) -> float:
        return (self.weights + self.grads + self.optimizer + self.sharding_buffers + self.dp_buckets
                + self.activations + self.other)

    def arithmetic(self) -> str:
        """The sum, in GiB (MiB for small models), as a person would check it."""
        div, unit = (GiB, "GiB") if self.total >= GiB else (MiB, "MiB")
        other = f" {'+' if self.other >= 0 else '-'} other {abs(self.other) / div:.3g}" if self.other else ""
        buffers = (f" + ZeRO-3 buffers {self.sharding_buffers / div:.3g}" * bool(self.sharding_buffers)
                   + f" + DP buckets {self.dp_buckets / div:.3g}" * bool(self.dp_buckets))
        grads = (f"gradients {self.grads / div:.3g}" if self.grads else
                 "gradients 0 (none yet at the step's first backward)")
        return (f"weights {self.weights / div:.3g} + {grads} + optimizer "
                f"{self.optimizer / div:.3g}{buffers} + activations {self.activations / div:.3g} ({self.in_flight:g} "
                f"micro-batch{'es' * (self.in_flight != 1)} in flight){other} "
                f"= {self.total / div:.3g} {unit} (stage {self.stage})")


def per_param_bytes(dtype: str) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes per parameter, unsharded, with Adam."""
    return (2.0, 4.0, 12.0) if dtype in ("bf16", "fp16") else (4.0, 4.0, 8.0)


def block_params(s: Shape) -> float:
    """One transformer block's parameters, unsharded (gpt_params of one layer, no embedding)."""
    return gpt_params(1, s.hidden, 0, s.ffn, num_heads=s.heads, num_query_groups=s.query_groups, swiglu=s.swiglu)


def end_params(s: Shape, lay: MemoryConfig, stage: int) -> float:
    """The embedding on the first stage and the output layer on the last (untied), V·h each."""
    return ((stage == 0) + (stage == lay.pp - 1)) * s.vocab * s.hidden


def uneven(lay: MemoryConfig) -> bool:
    return bool(lay.first_stage_layers or lay.last_stage_layers) and lay.pp > 1


def layers_on_stage(s: Shape, lay: MemoryConfig, stage: int) -> float:
    """Transformer layers one rank of pipeline `stage` holds: an even share, or under Megatron-LM's
    uneven split its virtual stages' counts (stage, stage + p, ...: the first and last of the p x v
    virtual stages have their own; layout.stage_layer_counts)."""
    if not uneven(lay):
        return s.num_layers / lay.pp
    counts = stage_layer_counts(s.num_layers, lay.pp * lay.virtual_stages, lay.first_stage_layers,
                                lay.last_stage_layers)
    return float(sum(counts[stage::lay.pp]))


def params_on_stage(s: Shape, lay: MemoryConfig, stage: int) -> float:
    """Parameters held by one rank of `stage` (blocks split over pp, everything over tp)."""
    return (block_params(s) * layers_on_stage(s, lay, stage) + end_params(s, lay, stage)) / lay.tp


def sharding_buffers(s: Shape, lay: MemoryConfig, stage: int) -> float:
    """What ZeRO-3 (FSDP2) holds at the peak beyond the sharded weights, gradients and states:
    the stage root's parameters (its ends) and FSDP_GATHERED_BLOCKS blocks' unsharded, in the
    weights' dtype (+ GLOO_GATHER_COPIES blocks on gloo, sharded over more than one rank), and,
    when more micro-batches run than are in flight at the peak, every parameter's unsharded
    gradient (pipelining defers the reduce-scatter to the step's end); 0 below ZeRO-3."""
    if lay.zero < 3:
        return 0.0
    w, g, _ = per_param_bytes(lay.dtype)
    blocks = FSDP_GATHERED_BLOCKS + GLOO_GATHER_COPIES * (lay.backend == "gloo" and lay.dp * lay.cp > 1)
    gathered = (end_params(s, lay, stage) + blocks * block_params(s)) / lay.tp * w
    deferred = params_on_stage(s, lay, stage) * g if lay.num_micro_batches > in_flight(lay, stage) else 0.0
    return gathered + deferred


def grads_at_peak(lay: MemoryConfig, stage: int) -> bool:
    """Whether the stage's gradients are alive at its activation peak. The peak is at the first
    backward after the most forwards; where the run sets its gradients to None between steps
    (`grads_freed`: torch's `zero_grad()` default, the trainer) and the stage runs no more
    micro-batches than it holds in flight then (GPipe; 1F1B with m <= p - stage; interleaved 1F1B
    by `in_flight`'s count, as ZeRO-3's deferred gradients are), that first backward comes before
    any gradient of the step: none are alive. ZB1P: counted. Its first backward computes input
    gradients only; the weight gradients appear in its first weight pass, which runs while the
    micro-batches it holds still keep their layers' inputs (torch's order, p = m = 2: stage 1
    F0 I0 F1 I1 W0 W1), and the CPU runs' peaks fall inside it (`PP:1W0`, `PP:0W1`: 139 MiB
    measured, 117 modelled without them, 141.5 with; benchmarks/README.md). A persistent gradient
    buffer (Megatron-LM's) or a run that does not say: counted."""
    if not lay.grads_freed or lay.schedule == "zb1p":
        return True
    return lay.num_micro_batches > in_flight(lay, stage)


def dp_buckets(s: Shape, lay: MemoryConfig, stage: int) -> float:
    """Replicated DP's gradient buckets, one more copy of the rank's gradients (unsharded, the
    gradients' bytes), where its sync keeps them beside the gradients (`bucket_copy`: torch DDP's
    default, the trainer's); 0 under ZeRO-2/3 (FSDP2 reduce-scatters the gradients themselves) or
    with no other replica."""
    if not lay.bucket_copy or lay.zero >= 2 or lay.dp * lay.cp <= 1:
        return 0.0
    return params_on_stage(s, lay, stage) * per_param_bytes(lay.dtype)[1]


def scores_term(s: Shape, lay: MemoryConfig) -> float:
    """Korthikanti's 5·a·s/h (per s·b·h, 16-bit): the s x s attention scores a layer keeps; 0 when
    the attention keeps none (fused) or recomputes them (selective)."""
    if s.attention == "fused" or lay.recompute == "selective":
        return 0.0
    return 5.0 * s.heads * (s.seq / lay.cp) / s.hidden


def activation_bytes_per_layer(s: Shape, lay: MemoryConfig) -> float:
    """What one layer keeps for backward, one micro-batch (Korthikanti et al. 2022, table 2). Of the
    10·s·b·h TP leaves whole, the norms' inputs (4), the two column-parallel linears' inputs (4) and
    the dropout masks (2): Megatron-LM's sequence parallelism splits all 10 t ways; torch's DTensor
    plan (SequenceParallel norms, PrepareModuleInput gathering the linears' inputs: the trainer,
    torchtitan) keeps the linears' gathered inputs whole, 4 + 6/t (measured, docs/memory.md)."""
    seq, b, h, t = s.seq / lay.cp, lay.micro_batch_size, s.hidden, lay.tp
    if lay.recompute == "full":
        per = 2.0 * seq * b * h / (t if lay.sequence_parallel else 1)
    else:
        attn = scores_term(s, lay)
        whole = 10.0 if not lay.sequence_parallel else 4.0 if lay.sp_whole_inputs else 0.0   # kept whole
        per = seq * b * h * (whole + (34.0 - whole + attn) / t)
    return per * (2.0 if lay.dtype == "fp32" else 1.0)


def recompute_bytes(s: Shape, lay: MemoryConfig) -> float:
    """Full recompute's working set in backward: one layer of one micro-batch re-materialised, less
    its input (kept already); 0 without full recompute."""
    if lay.recompute != "full":
        return 0.0
    return activation_bytes_per_layer(s, replace(lay, recompute="none")) - activation_bytes_per_layer(s, lay)


def head_bytes(s: Shape, lay: MemoryConfig) -> float:
    """The last stage's head, one micro-batch in flight: final norm and output layer inputs 2·s·b·h
    each (/t with SP; x2 for fp32), the logits in the compute dtype (2·s·b·V/t, 4 in fp32) and the
    loss's fp32 log-softmax 4·s·b·V/t (Korthikanti et al. 2022, 4.3, counts the fp32 logits alone)."""
    seq, b, t = s.seq / lay.cp, lay.micro_batch_size, lay.tp
    fp32 = lay.dtype == "fp32"
    norm, linear = (1 / t, 1 / t if not lay.sp_whole_inputs else 1.0) if lay.sequence_parallel else (1.0, 1.0)
    inputs = 2.0 * (norm + linear) * seq * b * s.hidden * (2.0 if fp32 else 1.0)
    return inputs + ((4.0 if fp32 else 2.0) + 4.0) * seq * b * s.vocab / t


def loss_grad_bytes(s: Shape, lay: MemoryConfig) -> float:
    """The loss's backward on the last stage, once whatever the micro-batches in flight: the fp32
    gradient of its log-softmax output and, while that is alive, the fp32 gradient of the
    log-softmax's input, 4·s·b·V/t each (the CPU runs' peaks fall inside
    `aten::_log_softmax_backward_data`)."""
    return 8.0 * (s.seq / lay.cp) * lay.micro_batch_size * s.vocab / lay.tp


def in_flight(lay: MemoryConfig, stage: int) -> float:
    """Micro-batches whose activations a stage holds at its peak, by schedule."""
    m, p = lay.num_micro_batches, lay.pp
    if lay.schedule == "gpipe":
        return float(m)
    if lay.schedule == "zb1p":     # 1F1B's p - s forwards, and s weight-gradient passes held back (torch's
        return float(min(m, p))    # ZB1P defers stage s's by s), each keeping its layers' inputs
    n = float(min(m, p - stage))
    if lay.schedule == "interleaved" and lay.virtual_stages > 1:
        n *= 1.0 + (p - 1) / (p * lay.virtual_stages)
    return n


def rank_estimate(s: Shape, lay: MemoryConfig, stage: int, other: float = 0.0) -> Estimate:
    n = params_on_stage(s, lay, stage)
    w, g, o = per_param_bytes(lay.dtype)
    shard = float(lay.dp * lay.cp)      # ZeRO shards over DP x CP (Megatron-LM, torchtitan's dp_shard_cp)
    weights = n * w / (shard if lay.zero >= 3 else 1.0)
    grads = n * g / (shard if lay.zero >= 2 else 1.0) if grads_at_peak(lay, stage) else 0.0
    optim = n * o / (shard if lay.zero >= 1 else 1.0)
    flight = in_flight(lay, stage)
    act = (activation_bytes_per_layer(s, lay) * layers_on_stage(s, lay, stage) * flight + recompute_bytes(s, lay)
           + (stage == lay.pp - 1) * (head_bytes(s, lay) * flight + loss_grad_bytes(s, lay)))
    return Estimate(stage=stage, weights=weights, grads=grads, optimizer=optim, activations=act,
                    in_flight=flight, other=other, sharding_buffers=sharding_buffers(s, lay, stage),
                    dp_buckets=dp_buckets(s, lay, stage))


STAGES_LISTED = 4096      # per-stage parts past it: the first stages and the last (a claimed PP of 2^23)


@record
class MemoryModel:
    """The model for one job's shape, calibrated on its measured peak when there is one."""
    shape: Shape
    other: float = 0.0                  # measured - modelled peak of the measured layout (0: not calibrated)
    basis: str = "not calibrated: no measured peak memory"

    def peak(self, lay: MemoryConfig) -> Estimate:
        """The rank with the largest modelled peak (stage 0 under 1F1B, the ends under GPipe)."""
        # Only the ends can hold it: a middle stage has no embedding and no more micro-batches in
        # flight than stage 0 (in_flight falls with the stage), so stage 0 bounds it. Two stages
        # evaluated, not one per claimed stage (a PP of 2^23 from a flag costs nothing). Under an
        # uneven split the middle stages may hold more layers than the ends: stage 1 then bounds
        # them (the same layers, the most in flight).
        ends = range(lay.pp) if lay.pp <= 2 else (0, 1, lay.pp - 1) if uneven(lay) else (0, lay.pp - 1)
        return max((rank_estimate(self.shape, lay, st, self.other) for st in ends), key=lambda e: e.total)

    @classmethod
    def calibrated(cls, shape: Shape, lay: MemoryConfig, measured_peak: Optional[float]) -> "MemoryModel":
        """Hold the measured peak's residual over the model (measured - modelled, for the measured
        layout) constant in every prediction, as the step-time model holds its time residual: what
        the model does not count (the optimizer step's temporaries, allocator blocks, buffers of the
        framework) does not change with the levers, while what it counts moves by its arithmetic."""
        model = cls(shape)
        if not measured_peak:
            return model
        e = model.peak(lay)
        model.other = float(measured_peak) - e.total
        model.basis = (f"other {'+' if model.other >= 0 else '-'}{human(abs(model.other))}: the measured peak "
                       f"{human(measured_peak)} less the modelled {human(e.total)} (weights, gradients, optimizer "
                       "states, ZeRO-3's buffers, DP buckets and activations), held in every prediction")
        return model

    def parts(self, lay: MemoryConfig) -> list[MemoryParts]:
        """What each stage's peak is made of under lay, activations as calibrated."""
        out = []
        listed = range(lay.pp) if lay.pp <= STAGES_LISTED else [*range(STAGES_LISTED - 1), lay.pp - 1]
        for st in listed:
            e = rank_estimate(self.shape, lay, st, self.other)
            out.append(MemoryParts(stage=st, weights=e.weights, grads=e.grads, optimizer=e.optimizer,
                                   activations=e.activations, other=e.other, total=e.total,
                                   sharding_buffers=e.sharding_buffers, dp_buckets=e.dp_buckets))
        return out

    def fitting(self, lay: MemoryConfig, capacity: float) -> Optional[MemoryConfig]:
        """lay as it is if it fits, else with the cheapest levers that make it fit (FITTING_LEVERS,
        taken cumulatively, in order of what they cost in time); None if even all of them do not."""
        for cand in fit_ladder(lay, self.shape.attention):
            if self.peak(cand).total <= capacity:
                return cand
        return None


def fit_ladder(lay: MemoryConfig, attention: Optional[str] = None) -> list[MemoryConfig]:
    """lay, then lay with more and more memory levers, cheapest first: sequence parallelism (no
    extra traffic: all-gather + reduce-scatter move what the all-reduce moved), ZeRO-1 (Megatron's
    distributed optimizer: gradients reduce-scattered and parameters all-gathered, the volume of
    the all-reduce it replaces), ZeRO-2 (the same gradient volume, reduce-scattered), selective
    recompute (the attention core again; not offered when the attention is fused: it keeps no
    s x s scores, so selective recompute saves nothing), ZeRO-3 (the weights all-gathered again in
    forward and backward), full recompute (one more forward). No ZeRO rung at dp 1."""
    out = [lay]
    def add(**kw):
        cur = out[-1]
        nxt = replace(cur, **kw)
        if nxt != cur:
            out.append(nxt)
    if lay.tp > 1:
        add(sequence_parallel=True)
    shard = lay.dp * lay.cp > 1         # sharding over one rank saves nothing
    if shard:
        add(zero=max(1, out[-1].zero))
        add(zero=max(2, out[-1].zero))
    if out[-1].recompute == "none" and attention != "fused":
        add(recompute="selective")
    if shard:
        add(zero=3)
    add(recompute="full")
    return out


def lever_flags(before: MemoryConfig, after: MemoryConfig) -> dict:
    """The trainer / Megatron-LM flags that take a run from `before`'s memory levers to `after`'s."""
    flags = {}
    if after.sequence_parallel and not before.sequence_parallel:
        flags["--sequence-parallel"] = ""
    if after.zero != before.zero:
        flags.update(zero_flags(after.zero))
    if after.recompute != before.recompute:
        flags["--recompute-granularity"] = after.recompute
    return flags


def lever_words(before: MemoryConfig, after: MemoryConfig) -> str:
    """'sequence parallelism, ZeRO-2 and selective recompute': the levers added, in words."""
    words = (["sequence parallelism"] * (after.sequence_parallel and not before.sequence_parallel)
             + [f"ZeRO-{after.zero}"] * (after.zero != before.zero)
             + [f"{after.recompute} recompute"] * (after.recompute != before.recompute))
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def zero_stage(facts) -> int:
    """The ZeRO stage a run's facts say (Megatron-LM flags), 0 when they say nothing."""
    if facts.data_parallel_sharding_strategy in SHARDING:
        return SHARDING[facts.data_parallel_sharding_strategy]
    return 1 if facts.use_distributed_optimizer else 0


def zero_flags(stage: int, before: int = 0) -> dict:
    """The trainer / Megatron-LM flags that select a ZeRO stage, from a run at stage `before`: going
    up, the one flag that adds it; going down, the flags of the higher stages removed (None)."""
    if stage >= before:
        if stage <= 0:
            return {}
        if stage == 1:
            return {"--use-distributed-optimizer": ""}
        return {"--data-parallel-sharding-strategy": {2: "optim_grads", 3: "optim_grads_params"}[stage]}
    return {"--data-parallel-sharding-strategy": {2: "optim_grads"}.get(stage),
            "--use-distributed-optimizer": "" if stage == 1 else None}


def collective_backend(d) -> str:
    """gloo when the run's backend says so (the trainer on CPU), else nccl."""
    names = f"{d.backend or ''},{d.facts.backend or ''}".lower()
    return "gloo" if "gloo" in names else "nccl"


def of_diagnosis(d) -> tuple[Optional[MemoryModel], Optional[MemoryConfig], Optional[float], list[str]]:
    """(model, the measured run's memory config, device capacity in bytes, notes) from d.facts;
    (None, None, capacity, why) when the model shape is not known."""
    f = d.facts
    need = {"num_layers": f.num_layers, "hidden_size": f.hidden_size, "num_attention_heads": f.num_attention_heads,
            "seq_length": f.seq_length, "vocab_size": f.vocab_size, "micro_batch_size": f.micro_batch_size,
            "num_micro_batches": f.num_micro_batches}
    devices = [r.device for r in d.ranks if r.device]
    capacity = float(f.memory_per_gpu_bytes) if f.memory_per_gpu_bytes else \
        device_memory(devices[0] if devices else f.device_name)
    missing = [k for k, v in need.items() if not v]
    if missing:
        return None, None, capacity, [f"memory not modelled: {', '.join(k.replace('_', ' ') for k in missing)} unknown"]
    shape = Shape(num_layers=f.num_layers, hidden=f.hidden_size, heads=f.num_attention_heads, seq=f.seq_length,
                  vocab=f.vocab_size, ffn=f.ffn_hidden_size, query_groups=f.num_query_groups, swiglu=bool(f.swiglu),
                  attention=f.attention)
    sched = f.pipeline_schedule or "1f1b"
    lay = MemoryConfig(tp=f.tp or 1, pp=f.pp or 1, dp=f.dp or 1, cp=f.cp or 1, micro_batch_size=f.micro_batch_size,
                       num_micro_batches=f.num_micro_batches,
                       schedule="interleaved" if "interleaved" in sched else sched if sched in ("gpipe", "zb1p") else "1f1b",
                       virtual_stages=f.virtual_pipeline_stages or 1, sequence_parallel=bool(f.sequence_parallel),
                       zero=zero_stage(f), recompute=f.recompute_granularity or "none",
                       dtype="fp32" if f.dtype == "fp32" else "bf16", backend=collective_backend(d),
                       bucket_copy=f.gradient_as_bucket_view is False, grads_freed=f.grads_set_to_none is True,
                       sp_whole_inputs=f.sequence_parallel_kind != "megatron")
    lay, split = _stage_split(lay, f)
    if lay.tp > 1 and f.sequence_parallel_kind is None:
        split.append("sequence parallelism counted as torch's DTensor plan's (the column-parallel linears keep their "
                     "gathered inputs, 4·s·b·h a layer, whole); Megatron-LM's keeps them sharded and saves more: a "
                     "Megatron-LM --config says which")
    model = MemoryModel.calibrated(shape, lay, f.peak_memory_bytes)
    # any layout of more than one GPU may be given replicas by a lever (TP 2 -> TP 1 x DP 2)
    buckets = [BUCKET_WORDS[f.gradient_as_bucket_view]] if lay.tp * lay.pp * lay.dp * lay.cp > 1 else []
    return model, lay, capacity, [f"memory model: {model.basis}", ATTENTION_WORDS.get(f.attention, ATTENTION_WORDS[None]),
                                  *buckets, *split, f"peak memory now: {model.peak(lay).arithmetic()}"]


def run_split(f, stages: int) -> tuple[tuple[int, int], Optional[str]]:
    """The run's uneven split over `stages` (p x v) pipeline stages, (first, last) stage layers from its
    facts (decoder_first/last_pipeline_num_layers), (0, 0) for an even share; and why a split that does
    not add up to its layers was left out (an even share held then), else None."""
    first, last = f.decoder_first_pipeline_num_layers or 0, f.decoder_last_pipeline_num_layers or 0
    if not (first or last) or stages < 2 or not f.num_layers:
        return (0, 0), None
    try:
        stage_layer_counts(f.num_layers, stages, first, last)
    except ValueError as e:
        return (0, 0), f"uneven split left out, an even share held: {e}"
    return (first, last), None


def _stage_split(lay: MemoryConfig, f) -> tuple[MemoryConfig, list[str]]:
    """lay with the run's uneven split (run_split), and a note: the layers per stage, or why it was
    left out."""
    stages = lay.pp * lay.virtual_stages
    (first, last), why = run_split(f, stages)
    if why or not (first or last):
        return lay, [why] if why else []
    counts = stage_layer_counts(f.num_layers, stages, first, last)
    return (replace(lay, first_stage_layers=first, last_stage_layers=last),
            ["layers per pipeline stage " + "/".join(map(str, counts)) + " (the run's uneven split)"])
