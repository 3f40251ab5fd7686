"""Configuration of a training run: one small dataclass per concern, validated on creation.

Each component receives only the config it uses (the model never sees the profiler settings).
Impossible combinations are refused in `__post_init__` with a one-line message, so the launcher
can reject a bad command before it starts any process. No torch import here: validation must be
cheap and must work in the launcher before torch is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from instrumented_trainer.faults import Fault

from diag.layout import Layout, RankGrid, stage_layer_counts


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the GPT model."""

    num_layers: int = 4
    hidden_size: int = 64
    num_attention_heads: int = 4
    seq_length: int = 32
    vocab_size: int = 128
    ffn_hidden_size: int = 0  # 0 means 4 x hidden_size, as in Megatron-LM

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                     "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"--hidden-size {self.hidden_size} is not divisible by "
                             f"--num-attention-heads {self.num_attention_heads}")
        if self.ffn_hidden_size == 0:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)

    def parameter_count(self) -> int:
        """Parameters of the full (unsharded) model."""
        h, f, v, s = self.hidden_size, self.ffn_hidden_size, self.vocab_size, self.seq_length
        attention = (3 * h * h + 3 * h) + (h * h + h)
        mlp = (h * f + f) + (f * h + h)
        per_layer = 2 * h + attention + 2 * h + mlp  # two LayerNorms
        return v * h + s * h + self.num_layers * per_layer + 2 * h + v * h


# Pipeline schedules of torch.distributed.pipelining, by their Megatron-LM / torchtitan names.
# "loop" places stage s on pipeline rank s % p (Megatron's interleaving); "v" places stages r and
# 2p-1-r on rank r (the V shape ZBV and DualPipeV need: first and last stage on one rank).
SCHEDULES: dict[str, str] = {"gpipe": "loop", "1f1b": "loop", "interleaved-1f1b": "loop",
                             "zb1p": "loop", "zbv": "v", "dualpipev": "v"}
MULTI_STAGE = ("interleaved-1f1b", "zb1p", "zbv", "dualpipev")  # schedules of v >= 1 stages a rank
# Megatron-LM's --data-parallel-sharding-strategy: what is sharded over the data-parallel ranks.
# `optim` is ZeRO-1, Megatron's distributed optimizer (--use-distributed-optimizer): only the
# optimizer states, with torch's ZeroRedundancyOptimizer (FSDP2 has no such mode); optim_grads is
# ZeRO-2 (FSDP2's fully_shard keeping parameters unsharded from forward to backward),
# optim_grads_params ZeRO-3 (resharded after forward).
SHARDING = ("no_shard", "optim", "optim_grads", "optim_grads_params")
FSDP_SHARDING = ("optim_grads", "optim_grads_params")
# Megatron-LM's --recompute-granularity: `full` recomputes each transformer layer in backward,
# `selective` only the core attention (QK^T, softmax, xV), whose activations are the largest.
RECOMPUTE = ("none", "full", "selective")
FR_DEFAULT_ENTRIES = 2000  # the Flight Recorder's entries when neither --flight-recorder-entries nor TORCH_FR_BUFFER_SIZE says


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How the job is split: TP x PP x DP, and how the pipeline and the DP sync run."""

    world_size: int
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    sequence_parallel: bool = False  # norms sharded on the sequence: all-gather/reduce-scatter
    pipeline_schedule: str = "1f1b"
    num_layers_per_virtual_pipeline_stage: int = 0  # 0: one stage a rank (two for zbv/dualpipev)
    decoder_first_pipeline_num_layers: int = 0  # 0: an even share
    decoder_last_pipeline_num_layers: int = 0
    ddp_bucket_size: int = 1_000_000  # elements per gradient all-reduce bucket
    overlap_grad_reduce: bool = False
    data_parallel_sharding_strategy: str = "no_shard"
    num_distributed_optimizer_instances: int = 1  # > 1 with sharding: HSDP's replicas
    recompute_granularity: str = "none"
    use_distributed_optimizer: bool = False  # ZeRO-1; also implied by the `optim` strategy

    def __post_init__(self) -> None:
        if self.recompute_granularity not in RECOMPUTE:
            raise ValueError(f"--recompute-granularity must be one of {', '.join(RECOMPUTE)}, "
                             f"got {self.recompute_granularity!r}")
        if self.data_parallel_sharding_strategy not in SHARDING:
            raise ValueError("--data-parallel-sharding-strategy must be one of "
                             f"{', '.join(SHARDING)}, got {self.data_parallel_sharding_strategy!r}")
        if self.num_distributed_optimizer_instances < 1:
            raise ValueError("--num-distributed-optimizer-instances must be positive")
        if self.data_parallel_sharding_strategy == "optim":
            object.__setattr__(self, "use_distributed_optimizer", True)
        if self.zero1 and self.num_distributed_optimizer_instances > 1:
            raise ValueError("--num-distributed-optimizer-instances > 1 needs FSDP2 sharding "
                             "(optim_grads or optim_grads_params); ZeRO-1 here shards the "
                             "optimizer over all data-parallel ranks")
        if self.pipeline_schedule not in SCHEDULES:
            raise ValueError(f"--pipeline-schedule must be one of {', '.join(SCHEDULES)}, got "
                             f"{self.pipeline_schedule!r}")
        if self.ddp_bucket_size < 1:
            raise ValueError("--ddp-bucket-size must be positive")
        if min(self.num_layers_per_virtual_pipeline_stage, self.decoder_first_pipeline_num_layers,
               self.decoder_last_pipeline_num_layers) < 0:
            raise ValueError("--num-layers-per-virtual-pipeline-stage and "
                             "--decoder-first/last-pipeline-num-layers must be >= 0")
        if self.num_layers_per_virtual_pipeline_stage and \
                self.pipeline_schedule not in MULTI_STAGE:
            raise ValueError("--num-layers-per-virtual-pipeline-stage needs --pipeline-schedule "
                             f"{' or '.join(MULTI_STAGE)}")
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ValueError("--sequence-parallel needs --tensor-model-parallel-size > 1")
        self.grid  # validates divisibility of the world size

    @property
    def sharded(self) -> bool:
        """FSDP2 shards the model (ZeRO-2/3); ZeRO-1 keeps replicated DP (`zero1`)."""
        return self.data_parallel_sharding_strategy in FSDP_SHARDING

    @property
    def zero1(self) -> bool:
        """Optimizer states sharded by ZeroRedundancyOptimizer; under FSDP2 they already are."""
        return self.use_distributed_optimizer and not self.sharded

    @property
    def grid(self) -> Layout:
        """The layout: replicated DP is `dp`; with sharding, FSDP's shard dimension is
        `dp_shard` and `dp` holds HSDP's replicas (--num-distributed-optimizer-instances)."""
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        flat = RankGrid.from_world(self.world_size, tp, pp).dp
        if not self.sharded:
            return RankGrid.from_world(self.world_size, tp, pp)
        replicas = self.num_distributed_optimizer_instances
        if flat % replicas:
            raise ValueError(f"data-parallel size {flat} is not divisible by "
                             f"--num-distributed-optimizer-instances {replicas}")
        return Layout.from_world(self.world_size, tp=tp, pp=pp, dp_shard=flat // replicas)

    @property
    def dp_size(self) -> int:
        """All data-parallel ranks, replicated and sharded: the batch is split over them."""
        return self.grid.dp * self.grid.dp_shard

    @property
    def stage_placement(self) -> str:
        return SCHEDULES[self.pipeline_schedule]

    def virtual_stages(self, num_layers: int) -> int:
        """Stages a pipeline rank holds (Megatron's v)."""
        if self.pipeline_schedule not in MULTI_STAGE:
            return 1
        per = self.num_layers_per_virtual_pipeline_stage
        if not per:
            return 2
        stages, rest = divmod(num_layers, per * self.grid.pp)
        if rest or not stages:
            raise ValueError(f"--num-layers {num_layers} is not divisible by "
                             f"--num-layers-per-virtual-pipeline-stage {per} x "
                             f"--pipeline-model-parallel-size {self.grid.pp}")
        return stages

    def stage_layers(self, num_layers: int) -> list[range]:
        """The layers of each of the p x v pipeline stages, in stage order (Megatron-LM's split:
        the first and last stages may be given their own counts, the others share the rest)."""
        n = self.grid.pp * self.virtual_stages(num_layers)
        try:
            counts = stage_layer_counts(num_layers, n, self.decoder_first_pipeline_num_layers,
                                        self.decoder_last_pipeline_num_layers)
        except ValueError as e:
            raise ValueError(f"--num-layers {num_layers}: {e}") from None
        bounds = [sum(counts[:i]) for i in range(n + 1)]
        return [range(bounds[i], bounds[i + 1]) for i in range(n)]

    def rank_stages(self, pp_rank: int, num_layers: int) -> list[int]:
        """The stage indices pipeline rank `pp_rank` holds, in its execution order."""
        p, v = self.grid.pp, self.virtual_stages(num_layers)
        if self.stage_placement == "v":
            return [pp_rank, 2 * p - 1 - pp_rank]
        return [pp_rank + k * p for k in range(v)]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Batch sizes, optimiser and length of the run."""

    micro_batch_size: int = 2
    global_batch_size: int = 8
    train_iters: int = 10
    lr: float = 1e-3
    weight_decay: float = 0.01
    seed: int = 1234

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1 or self.global_batch_size < 1 or self.train_iters < 1:
            raise ValueError("--micro-batch-size, --global-batch-size and --train-iters must be "
                             "positive")

    def num_micro_batches(self, dp: int) -> int:
        """Micro-batches per step on each DP replica (Megatron's num_microbatches)."""
        per_step = self.micro_batch_size * dp
        if self.global_batch_size % per_step:
            raise ValueError(f"--global-batch-size {self.global_batch_size} is not divisible by "
                             f"--micro-batch-size {self.micro_batch_size} x data-parallel size "
                             f"{dp}")
        return self.global_batch_size // per_step


@dataclass(frozen=True, kw_only=True)
class TelemetryConfig:
    """Where the run's evidence goes and what the profiler records."""

    out: str = "runs/latest"
    profile: bool = True
    profile_wait: int = 1
    profile_warmup: int = 1
    profile_active: int = 2
    profile_memory: bool = False  # the profiler's [memory] events: diag's measured peak and memory curve
    trace_summary: bool = True  # each rank summarises its trace (`diag summarize`) when written
    metrics: bool = True
    metrics_interval: float = 1.0
    comm_log: bool = False  # comm-rank-<r>.jsonl: the tap in every step (telemetry/commtap.TapSwitch)
    prometheus_port: int = 0  # 0: no exporter; else local rank r serves on prometheus_port + r
    prometheus_addr: str = "127.0.0.1"  # bind address: loopback unless asked otherwise
    prometheus_job: str = ""  # the `job` label; empty: the --out directory's name
    peak_tflops: float | None = None  # dense peak per device for live MFU; None: device table
    flight_recorder_entries: int = FR_DEFAULT_ENTRIES  # PyTorch Flight Recorder ring buffer (0: off); dumped to out/flightrec
    flight_recorder_source: str = "default"  # where the number came from: --flight-recorder-entries | TORCH_FR_BUFFER_SIZE | default

    def __post_init__(self) -> None:
        if not 0 <= self.prometheus_port < 65536:
            raise ValueError("--prometheus-port must be in [0, 65535]")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise ValueError("--peak-tflops must be positive")
        if min(self.profile_wait, self.profile_warmup) < 0 or self.profile_active < 1:
            raise ValueError("--profile-wait/--profile-warmup must be >= 0 and "
                             "--profile-active >= 1")
        if self.metrics_interval <= 0:
            raise ValueError("--metrics-interval must be positive")
        if self.flight_recorder_entries < 0:
            raise ValueError("--flight-recorder-entries must be >= 0")

    @property
    def comm_tap(self) -> str | None:
        """Where the comm tap runs (telemetry/commtap.TapSwitch; diag_run.json's profile.comm_tap):
        "every_step" where its timings are read every step (the comm log file, the live exporter),
        else "profiled_steps" (`traced_steps`: the trace's labels), None without the profiler."""
        if self.comm_log or self.prometheus_port:
            return "every_step"
        return "profiled_steps" if self.profile else None

    @property
    def traced_steps(self) -> range:
        """The profiler's warmup and active steps (loop indices); empty without the profiler."""
        if not self.profile:
            return range(0)
        return range(self.profile_wait, self.profile_wait + self.profile_warmup + self.profile_active)


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """Device, dtype and process-group settings."""

    device: str = "auto"
    dtype: str = "auto"
    dist_timeout: float = 300.0
    fault_stall: str = ""  # faults.py: RANK:STEP:SECONDS, once (a hang past --dist-timeout)
    fault_slow: str = ""  # faults.py: RANK:STEP:SECONDS, every step from STEP (a rank that got slow)

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in ("auto", "fp32", "bf16"):
            raise ValueError(f"--dtype must be auto, fp32 or bf16, got {self.dtype!r}")
        Fault.parse(self.fault_stall, "--fault-stall")
        Fault.parse(self.fault_slow, "--fault-slow")


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """All concerns of one run; checks the constraints that span several of them."""

    model: ModelConfig
    parallel: ParallelConfig
    train: TrainConfig
    telemetry: TelemetryConfig
    runtime: RuntimeConfig
    command: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        grid = self.parallel.grid
        m = self.model
        if m.num_attention_heads % grid.tp:
            raise ValueError(f"--num-attention-heads {m.num_attention_heads} is not divisible by "
                             f"--tensor-model-parallel-size {grid.tp}")
        for name, value in (("hidden-size", m.hidden_size), ("vocab-size", m.vocab_size),
                            ("ffn-hidden-size", m.ffn_hidden_size)):
            if value % grid.tp:
                raise ValueError(f"--{name} {value} is not divisible by "
                                 f"--tensor-model-parallel-size {grid.tp}")
        self.parallel.stage_layers(m.num_layers)  # every stage gets at least one layer
        if self.parallel.sequence_parallel and m.seq_length % grid.tp:
            raise ValueError(f"--seq-length {m.seq_length} is not divisible by "
                             f"--tensor-model-parallel-size {grid.tp} (--sequence-parallel)")
        m_micro = self.train.num_micro_batches(self.parallel.dp_size)
        if self.parallel.pipeline_schedule in MULTI_STAGE and m_micro % grid.pp:
            raise ValueError(f"--pipeline-schedule {self.parallel.pipeline_schedule} needs the "
                             f"micro-batches per step ({m_micro}) to be a multiple of "
                             f"--pipeline-model-parallel-size {grid.pp}")

    @property
    def num_micro_batches(self) -> int:
        return self.train.num_micro_batches(self.parallel.dp_size)

    @property
    def pipeline_schedule(self) -> str:
        """The schedule that runs: torch's 1F1B refuses fewer micro-batches than stages, where
        Megatron's 1F1B is all warm-up (every forward, then every backward): GPipe, so GPipe runs,
        and diag_run.json says so."""
        sched = self.parallel.pipeline_schedule
        if sched == "1f1b" and self.num_micro_batches < self.parallel.grid.pp:
            return "gpipe"
        return sched
