"""Command line of the trainer, with Megatron-LM flag names.

Parsing and validation import no torch, so an impossible configuration is refused with a
one-line message and exit code 2 before any process starts or any heavy import happens.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from instrumented_trainer.config import (FR_DEFAULT_ENTRIES, RECOMPUTE, SCHEDULES, SHARDING, JobConfig, ModelConfig, ParallelConfig,
                                         RuntimeConfig, TelemetryConfig, TrainConfig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m instrumented_trainer",
                                description="3D-parallel GPT trainer that leaves traces for diag.")
    p.add_argument("--nproc", type=int, default=None,
                   help="spawn this many local processes (instead of running under torchrun)")
    g = p.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true",
                   help="split LayerNorms and the residual stream over the sequence across TP "
                        "ranks (all-gather / reduce-scatter instead of all-reduce)")
    g.add_argument("--pipeline-schedule", choices=list(SCHEDULES), default="1f1b",
                   help="torch.distributed.pipelining schedule; interleaved-1f1b and zb1p run "
                        "v stages a rank, zbv and dualpipev two (V-shaped)")
    g.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=0,
                   help="layers per virtual stage (interleaved schedules; default 2 stages a rank)")
    g.add_argument("--decoder-first-pipeline-num-layers", type=int, default=0,
                   help="layers of the first pipeline stage (default: an even share)")
    g.add_argument("--decoder-last-pipeline-num-layers", type=int, default=0,
                   help="layers of the last pipeline stage (default: an even share)")
    g.add_argument("--ddp-bucket-size", type=int, default=1_000_000,
                   help="elements per DP gradient all-reduce bucket")
    g.add_argument("--data-parallel-sharding-strategy", choices=list(SHARDING),
                   default="no_shard",
                   help="sharded over the data-parallel ranks: optim (ZeRO-1, as "
                        "--use-distributed-optimizer), optim_grads (FSDP2 ZeRO-2), "
                        "optim_grads_params (FSDP2 ZeRO-3)")
    g.add_argument("--use-distributed-optimizer", action="store_true",
                   help="ZeRO-1: optimizer states sharded over the data-parallel ranks "
                        "(torch's ZeroRedundancyOptimizer); gradients all-reduced, parameters "
                        "replicated")
    g.add_argument("--num-distributed-optimizer-instances", type=int, default=1,
                   help="with sharding: replicas of the sharded model (HSDP); the data-parallel "
                        "ranks are split into this many groups that each shard it")
    g.add_argument("--recompute-granularity", choices=list(RECOMPUTE), default="none",
                   help="activation recomputation: full (each layer) or selective (core "
                        "attention)")
    g.add_argument("--overlap-grad-reduce", action="store_true",
                   help="launch each bucket's all-reduce during backward")
    g = p.add_argument_group("model")
    for flag, default in (("num-layers", 4), ("hidden-size", 64), ("num-attention-heads", 4),
                          ("seq-length", 32), ("vocab-size", 128), ("ffn-hidden-size", 0)):
        g.add_argument(f"--{flag}", type=int, default=default)
    g = p.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=int, default=2)
    g.add_argument("--global-batch-size", type=int, default=8)
    g.add_argument("--train-iters", type=int, default=10)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--seed", type=int, default=1234)
    g = p.add_argument_group("runtime")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    g.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto")
    g.add_argument("--dist-timeout", type=float, default=300.0,
                   help="seconds before a stuck collective fails the run")
    g = p.add_argument_group("telemetry")
    g.add_argument("--out", default="runs/latest", help="directory for traces and logs")
    g.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--profile-wait", type=int, default=1)
    g.add_argument("--profile-warmup", type=int, default=1)
    g.add_argument("--profile-active", type=int, default=2)
    g.add_argument("--profile-memory", action=argparse.BooleanOptionalAction, default=False,
                   help="record every allocation and free (torch.profiler profile_memory): diag's measured "
                        "peak memory per rank and its curve over time; larger traces. On CPU always on (the "
                        "per-step peak in steps.jsonl is read from these events)")
    g.add_argument("--trace-summary", action=argparse.BooleanOptionalAction, default=True,
                   help="each rank summarises its own trace when the profiler finishes (an idle-class "
                        "`diag summarize` subprocess), so `diag analyze` need not parse it again")
    g.add_argument("--metrics", action=argparse.BooleanOptionalAction, default=True,
                   help="sample device/host metrics in a background thread")
    g.add_argument("--metrics-interval", type=float, default=1.0, help="seconds")
    g.add_argument("--comm-log", action=argparse.BooleanOptionalAction, default=False,
                   help="time every collective into comm-rank-<r>.jsonl; its dispatch tap then runs in every "
                        "step, one Python call per op (a tiny CPU model's step 1.15-2.4x); off, it runs only in the "
                        "profiler's warmup and active steps, to label the trace")
    g.add_argument("--prometheus-port", type=int, default=0,
                   help="serve live metrics at /metrics; local rank r on this port + r (0: off)")
    g.add_argument("--prometheus-addr", default="127.0.0.1",
                   help="address the exporter binds (0.0.0.0 to let a cluster's Prometheus in)")
    g.add_argument("--prometheus-job", default="",
                   help="`job` label of the live metrics (default: the --out directory's name)")
    g.add_argument("--peak-tflops", type=float, default=None,
                   help="dense peak TFLOP/s per device for live MFU (default: device table)")
    g.add_argument("--flight-recorder-entries", type=int, default=None,
                   help="collectives kept in PyTorch's Flight Recorder, dumped per rank into OUT/flightrec on a "
                        "timeout or failure, SIGUSR1/SIGTERM and at the end (0: off; given, it wins over "
                        "TORCH_FR_BUFFER_SIZE; default: TORCH_FR_BUFFER_SIZE where set, else 2000)")
    g.add_argument("--fault-stall", default="", metavar="RANK:STEP:SECONDS",
                   help="fault injection: RANK sleeps SECONDS once before STEP (a hang past --dist-timeout)")
    g.add_argument("--fault-slow", default="", metavar="RANK:STEP:SECONDS",
                   help="fault injection: RANK sleeps SECONDS before every step from STEP on")
    return p


def job_from_args(args: argparse.Namespace, world_size: int, command: list[str]) -> JobConfig:
    """Build and validate the job; raises ValueError with a one-line message."""
    return JobConfig(
        model=ModelConfig(num_layers=args.num_layers, hidden_size=args.hidden_size,
                          num_attention_heads=args.num_attention_heads,
                          seq_length=args.seq_length, vocab_size=args.vocab_size,
                          ffn_hidden_size=args.ffn_hidden_size),
        parallel=ParallelConfig(world_size=world_size,
                                tensor_model_parallel_size=args.tensor_model_parallel_size,
                                pipeline_model_parallel_size=args.pipeline_model_parallel_size,
                                sequence_parallel=args.sequence_parallel,
                                pipeline_schedule=args.pipeline_schedule,
                                num_layers_per_virtual_pipeline_stage=(
                                    args.num_layers_per_virtual_pipeline_stage),
                                decoder_first_pipeline_num_layers=(
                                    args.decoder_first_pipeline_num_layers),
                                decoder_last_pipeline_num_layers=(
                                    args.decoder_last_pipeline_num_layers),
                                ddp_bucket_size=args.ddp_bucket_size,
                                overlap_grad_reduce=args.overlap_grad_reduce,
                                data_parallel_sharding_strategy=(
                                    args.data_parallel_sharding_strategy),
                                num_distributed_optimizer_instances=(
                                    args.num_distributed_optimizer_instances),
                                recompute_granularity=args.recompute_granularity,
                                use_distributed_optimizer=args.use_distributed_optimizer),
        train=TrainConfig(micro_batch_size=args.micro_batch_size,
                          global_batch_size=args.global_batch_size, train_iters=args.train_iters,
                          lr=args.lr, weight_decay=args.weight_decay, seed=args.seed),
        telemetry=TelemetryConfig(out=args.out, profile=args.profile,
                                  profile_wait=args.profile_wait,
                                  profile_warmup=args.profile_warmup,
                                  profile_active=args.profile_active,
                                  profile_memory=args.profile_memory,
                                  trace_summary=args.trace_summary,
                                  metrics=args.metrics, metrics_interval=args.metrics_interval,
                                  comm_log=args.comm_log,
                                  prometheus_port=args.prometheus_port,
                                  prometheus_addr=args.prometheus_addr,
                                  prometheus_job=args.prometheus_job,
                                  peak_tflops=args.peak_tflops,
                                  **dict(zip(("flight_recorder_entries", "flight_recorder_source"),
                                             fr_entries(args.flight_recorder_entries, os.environ)))),
        runtime=RuntimeConfig(device=args.device, dtype=args.dtype,
                              dist_timeout=args.dist_timeout, fault_stall=args.fault_stall,
                              fault_slow=args.fault_slow),
        command=command,
    )


def fr_entries(flag: int | None, env) -> tuple[int, str]:
    """(Flight Recorder entries, where the number came from): the flag wins; else the environment's
    TORCH_FR_BUFFER_SIZE (a launcher's or a cluster's setting); else the trainer's default."""
    if flag is not None:
        return flag, "--flight-recorder-entries"
    raw = env.get("TORCH_FR_BUFFER_SIZE", "").strip()
    if raw:
        try:
            return int(raw), "TORCH_FR_BUFFER_SIZE"
        except ValueError:
            raise ValueError(f"TORCH_FR_BUFFER_SIZE={raw!r} is not a number of entries") from None
    return FR_DEFAULT_ENTRIES, "default"


def command_line(argv: list[str]) -> list[str]:
    """The command as the user would type it (what re-running the job needs)."""
    if "DIAG_COMMAND" in os.environ:  # set by our own launcher for its children
        return shlex.split(os.environ["DIAG_COMMAND"])
    if "TORCHELASTIC_RUN_ID" in os.environ:
        nproc = os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
        return ["torchrun", "--nproc-per-node", nproc, "-m", "instrumented_trainer", *argv]
    return ["python", "-m", "instrumented_trainer", *argv]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    worker = "RANK" in os.environ  # under torchrun or spawned by our launcher
    if args.nproc is not None and args.nproc < 1:
        print("error: --nproc must be positive", file=sys.stderr)
        return 2
    world = int(os.environ["WORLD_SIZE"]) if worker else (args.nproc or 1)
    try:
        job = job_from_args(args, world, command_line(argv))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not worker:
        from instrumented_trainer.launch import spawn  # noqa: PLC0415 - launcher only

        return spawn(world, argv, shlex.join(job.command), timeout_s=job.runtime.dist_timeout)
    from instrumented_trainer.telemetry.flight_recorder import FlightRecorder  # noqa: PLC0415
    from instrumented_trainer.train import train  # noqa: PLC0415 - torch only in workers

    with FlightRecorder(job.telemetry.out, job.telemetry.flight_recorder_entries,
                        job.telemetry.flight_recorder_source):  # on before the group exists
        train(job)
    return 0
