"""Configuration of a training run: one small dataclass per concern, validated on creation.

Each component receives only the config it uses (the model never sees the profiler settings).
Impossible combinations are refused in `__post_init__` with a one-line message, so the launcher
can reject a bad command before it starts any process. No torch import here: validation must be
cheap and must work in the launcher before torch is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from instrumented_trainer.faults import Fault

from diag.layout import RankGrid


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


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How the job is split: TP x PP x DP, and how the pipeline and the DP sync run."""

    world_size: int
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    pipeline_schedule: str = "1f1b"
    ddp_bucket_size: int = 1_000_000  # elements per gradient all-reduce bucket
    overlap_grad_reduce: bool = False

    def __post_init__(self) -> None:
        if self.pipeline_schedule not in ("1f1b", "gpipe"):
            raise ValueError(f"--pipeline-schedule must be 1f1b or gpipe, got "
                             f"{self.pipeline_schedule!r}")
        if self.ddp_bucket_size < 1:
            raise ValueError("--ddp-bucket-size must be positive")
        self.grid  # validates divisibility of the world size

    @property
    def grid(self) -> RankGrid:
        return RankGrid.from_world(self.world_size, self.tensor_model_parallel_size,
                                   self.pipeline_model_parallel_size)


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
    trace_summary: bool = True  # each rank summarises its trace (`diag summarize`) when written
    metrics: bool = True
    metrics_interval: float = 1.0
    comm_log: bool = True
    prometheus_port: int = 0  # 0: no exporter; else local rank r serves on prometheus_port + r
    prometheus_addr: str = "127.0.0.1"  # bind address: loopback unless asked otherwise
    prometheus_job: str = ""  # the `job` label; empty: the --out directory's name
    peak_tflops: float | None = None  # dense peak per device for live MFU; None: device table
    flight_recorder_entries: int = 2000  # PyTorch Flight Recorder ring buffer (0: off); dumped to out/flightrec

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
        if m.num_layers % grid.pp:
            raise ValueError(f"--num-layers {m.num_layers} is not divisible by "
                             f"--pipeline-model-parallel-size {grid.pp}")
        self.train.num_micro_batches(grid.dp)

    @property
    def num_micro_batches(self) -> int:
        return self.train.num_micro_batches(self.parallel.grid.dp)
