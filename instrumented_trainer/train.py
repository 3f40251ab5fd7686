"""The training loop of one rank: set up, then for each step run the pipeline, sync DP
gradients, step the optimizer and record the step.

Instrumentation wraps the loop as context managers (profiler, metrics sampler) and never changes
what is computed: the same seed gives the same losses with telemetry on or off.
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from diag.layout import Axis
from instrumented_trainer import faults
from instrumented_trainer.config import JobConfig
from instrumented_trainer.faults import Fault
from instrumented_trainer.data import global_batch, replica_micro_batches
from instrumented_trainer.model import GPTStage
from instrumented_trainer.parallel.data_parallel import GradSync
from instrumented_trainer.parallel.pipeline import PipelineStep
from instrumented_trainer.parallel.topology import ParallelGroups
from instrumented_trainer.telemetry import run_metadata
from instrumented_trainer.telemetry.comm import CommLog
from instrumented_trainer.telemetry.heartbeat import Heartbeat
from instrumented_trainer.telemetry.metrics import MetricsSampler
from instrumented_trainer.telemetry.profiler import ProfilerSession
from instrumented_trainer.telemetry.prometheus import start_live_metrics
from instrumented_trainer.telemetry.safe import guard
from instrumented_trainer.telemetry.steps import StepLog


@dataclass
class Runtime:
    """Resolved device, dtype and backend of this process."""

    device: torch.device
    dtype: torch.dtype
    dtype_name: str
    backend: str

    @classmethod
    def resolve(cls, cfg, local_rank: int) -> "Runtime":
        cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        if cuda:
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
            torch.set_num_threads(1)  # N ranks share the host's cores; oversubscription is noise
        name = cfg.dtype if cfg.dtype != "auto" else ("bf16" if cuda else "fp32")
        dtype = torch.bfloat16 if name == "bf16" else torch.float32
        return cls(device, dtype, name, "nccl" if cuda else "gloo")

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def init_distributed(runtime: Runtime, timeout_s: float) -> tuple[int, int]:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    dist.init_process_group(runtime.backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=runtime.device if runtime.cuda else None)
    return rank, world


def train(job: JobConfig) -> list[float]:
    """Run the job on this rank; returns the per-step losses on the logging rank, else []."""
    runtime = Runtime.resolve(job.runtime, int(os.environ.get("LOCAL_RANK", 0)))
    rank, _ = init_distributed(runtime, job.runtime.dist_timeout)
    tel, grid = job.telemetry, job.parallel.grid
    comm = CommLog(rank, os.path.join(tel.out, f"comm-rank-{rank}.jsonl") if tel.comm_log
                   else None, cuda=runtime.cuda, timed=bool(tel.prometheus_port))
    groups = ParallelGroups(grid, rank, comm)
    torch.manual_seed(job.train.seed)
    stage = GPTStage(job.model, groups, job.train.seed).to(runtime.device)
    params = list(stage.parameters())
    optimizer = torch.optim.AdamW(params, lr=job.train.lr, betas=(0.9, 0.95),
                                  weight_decay=job.train.weight_decay)
    grad_sync = GradSync(params, groups, job.parallel.ddp_bucket_size,
                         job.parallel.overlap_grad_reduce)
    logs_steps = groups.is_last_stage and groups.coords.tp_rank == 0 and groups.coords.dp_rank == 0
    steps = StepLog(tel.out, logs_steps, job.train.global_batch_size * job.model.seq_length,
                    job.train.train_iters)
    if rank == 0:
        run_metadata.write(os.path.join(tel.out, "diag_run.json"),
                           run_metadata.build(job, backend=runtime.backend,
                                              dtype=runtime.dtype_name, cuda=runtime.cuda))
    sampler = MetricsSampler(os.path.join(tel.out, f"metrics-rank-{rank}.jsonl"), rank,
                             tel.metrics_interval, prefer_gpu=runtime.cuda,
                             device_index=runtime.device.index or 0, enabled=tel.metrics)
    live = (start_live_metrics(job, rank, groups.coords, sampler, _peak_flops(tel, runtime))
            if tel.prometheus_port else None)
    heartbeat = Heartbeat(rank)          # our launcher's watchdog sees each step (telemetry.heartbeat)
    stall, slow = (Fault.parse(job.runtime.fault_stall, ""), Fault.parse(job.runtime.fault_slow, ""))
    with sampler, ProfilerSession(tel, rank, runtime.cuda) as profiler:
        for step in range(job.train.train_iters):
            heartbeat.beat(step)
            comm.step = step
            faults.before_step(step, stall, slow)  # flight recorder tests: off unless --fault-* given
            start = time.perf_counter()
            loss = train_step(job, step, stage, groups, optimizer, grad_sync, runtime)
            if runtime.cuda:
                torch.cuda.synchronize()
            steps.record(step, loss, time.perf_counter() - start)
            comm.flush()
            if live is not None:
                with guard("prometheus metrics"):
                    live.publish(steps.last, comm.last_step)
            heartbeat.hold()             # a trace export may outlast --dist-timeout: not a stall
            profiler.step()
        heartbeat.done()
    comm.close()
    steps.close()
    dist.barrier()
    dist.destroy_process_group()
    return steps.losses


def _peak_flops(tel, runtime: Runtime) -> float | None:
    """Peak FLOP/s per device for live MFU: --peak-tflops, else the device table, else None."""
    if tel.peak_tflops is not None:
        return tel.peak_tflops * 1e12
    return run_metadata.peak_flops(run_metadata.device_name(runtime.cuda), runtime.dtype_name)


def train_step(job, step, stage, groups, optimizer, grad_sync, runtime) -> float:
    """One optimizer step over the global batch; returns the DP-mean loss (last stage)."""
    m, t = job.model, job.train
    tokens = global_batch(step, t.global_batch_size, m.seq_length, m.vocab_size, t.seed)
    micro = replica_micro_batches(tokens, groups.coords.dp_rank, groups.size(Axis.DP),
                                  t.micro_batch_size, runtime.device)
    optimizer.zero_grad(set_to_none=True)
    grad_sync.start_step()
    pipe = PipelineStep(stage=stage, groups=groups, micro_batches=micro,
                        act_shape=(t.micro_batch_size, m.seq_length, m.hidden_size),
                        act_dtype=runtime.dtype, device=runtime.device,
                        loss_scale=1.0 / (len(micro) * groups.size(Axis.DP)),
                        before_last_backward=grad_sync.mark_last_backward)
    with torch.autocast(runtime.device.type, dtype=torch.bfloat16,
                        enabled=runtime.dtype == torch.bfloat16):
        losses = pipe.run_1f1b() if job.parallel.pipeline_schedule == "1f1b" else pipe.run_gpipe()
    grad_sync.finish()
    optimizer.step()
    if not groups.is_last_stage:
        return float("nan")
    loss = torch.stack(losses).mean().float()
    groups.all_reduce(loss, Axis.DP)  # each replica's mean over the same number of tokens
    return loss.item() / groups.size(Axis.DP)
