"""The training loop of one rank: set up, then for each step run the pipeline, sync DP
gradients, step the optimizer and record the step.

Set-up builds the DeviceMesh from the layout, this rank's pipeline stages (each tensor-parallel
with DTensor), torch's pipeline schedule and the data-parallel gradient sync (parallel/).

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

from instrumented_trainer import faults
from instrumented_trainer.config import JobConfig
from instrumented_trainer.data import global_batch, replica_batch
from instrumented_trainer.faults import Fault
from instrumented_trainer.launch import gpu_for
from instrumented_trainer.model import GPTStage, apply_recompute
from instrumented_trainer.parallel.data_parallel import GradSync, apply_fsdp
from instrumented_trainer.parallel.mesh import JobMesh
from instrumented_trainer.parallel.optimizer import build_optimizer
from instrumented_trainer.parallel.pipeline import Pipeline, build_pipeline
from instrumented_trainer.parallel.tensor_parallel import apply_tensor_parallel
from instrumented_trainer.telemetry import memory, run_metadata
from instrumented_trainer.telemetry.comm import CommLog
from instrumented_trainer.telemetry.commtap import TapSwitch
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
            device = torch.device("cuda", gpu_for(local_rank, torch.cuda.device_count()))
            torch.cuda.set_device(device)
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


def build_pipeline_for(job: JobConfig, mesh: JobMesh, runtime: Runtime) -> Pipeline:
    """This rank's stages, each built whole from the seeded weights, then sharded over TP."""
    def make_stage(layers, first, last):
        stage = GPTStage(job.model, layers, first, last, job.train.seed).to(runtime.device)
        if mesh.size("tp") > 1:
            apply_tensor_parallel(stage, mesh["tp"], job.parallel.sequence_parallel)
        apply_recompute(stage, job.parallel.recompute_granularity)
        if job.parallel.sharded:
            apply_fsdp(stage, mesh.dp_mesh, job.parallel.data_parallel_sharding_strategy)
        return stage

    return build_pipeline(job, make_stage, mesh.group("pp"), mesh.coords.pp_rank,
                          runtime.device)


@dataclass
class Setup:
    """What one rank trains with: its process groups, stages, optimizer and DP sync."""

    runtime: Runtime
    rank: int
    mesh: JobMesh
    comm: CommLog
    pipe: Pipeline
    params: list
    optimizer: object
    grad_sync: GradSync
    sp_grad_sync_s: float | None = None   # the optimizer's cost per Partial-over-TP gradient, timed at start (diag_run.json)


def set_up(job: JobConfig) -> Setup:
    """Process groups, this rank's stages (seeded), the optimizer and the DP gradient sync."""
    runtime = Runtime.resolve(job.runtime, int(os.environ.get("LOCAL_RANK", 0)))
    rank, _ = init_distributed(runtime, job.runtime.dist_timeout)
    tel = job.telemetry
    mesh = JobMesh.build(job.parallel.grid, runtime.device.type, job.runtime.dist_timeout)
    comm = CommLog(rank, os.path.join(tel.out, f"comm-rank-{rank}.jsonl") if tel.comm_log
                   else None, cuda=runtime.cuda, timed=bool(tel.prometheus_port))
    torch.manual_seed(job.train.seed)
    pipe = build_pipeline_for(job, mesh, runtime)
    params = [p for module in pipe.modules for p in module.parameters()]
    def make_optimizer(ps):
        return build_optimizer(ps, job.train, mesh.group("dp"), mesh.size("dp"), job.parallel.zero1)
    optimizer = make_optimizer(params)
    # replicated DP syncs gradients here; sharded DP (FSDP2, HSDP's replicas too) does it itself
    grad_sync = GradSync(params, mesh.group("dp"),
                         1 if job.parallel.sharded else mesh.size("dp"),
                         job.parallel.ddp_bucket_size, job.parallel.overlap_grad_reduce,
                         job.num_micro_batches, comm)
    # what switching SP on would cost the optimizer: a run that has it pays it already (diag reads it only to
    # price the switch), so it is not timed there
    sync = None if job.parallel.sequence_parallel else run_metadata.sp_grad_sync(mesh.mesh["tp"], make_optimizer,
                                                                                  runtime.cuda)
    return Setup(runtime, rank, mesh, comm, pipe, params, optimizer, grad_sync, sync)


def train(job: JobConfig) -> list[float]:
    """Run the job on this rank; returns the per-step losses on the logging rank, else []."""
    s = set_up(job)
    runtime, rank, mesh, comm, pipe = s.runtime, s.rank, s.mesh, s.comm, s.pipe
    tel = job.telemetry
    coords = mesh.coords
    logs_steps = pipe.has_last and coords.tp_rank == 0 and mesh.dp_rank == 0
    steps = StepLog(tel.out, logs_steps, job.train.global_batch_size * job.model.seq_length,
                    job.train.train_iters)
    meta_path = os.path.join(tel.out, "diag_run.json")
    if rank == 0:
        run_metadata.write(meta_path, run_metadata.build(job, backend=runtime.backend,
                                                         dtype=runtime.dtype_name,
                                                         cuda=runtime.cuda, sp_grad_sync_s=s.sp_grad_sync_s))
    sampler = MetricsSampler(os.path.join(tel.out, f"metrics-rank-{rank}.jsonl"), rank,
                             tel.metrics_interval, prefer_gpu=runtime.cuda,
                             device_index=runtime.device.index or 0, enabled=tel.metrics)
    live = (start_live_metrics(job, rank, coords, sampler, _peak_flops(tel, runtime))
            if tel.prometheus_port else None)
    heartbeat = Heartbeat(rank)          # our launcher's watchdog sees each step (telemetry.heartbeat)
    stall, slow = (Fault.parse(job.runtime.fault_stall, ""), Fault.parse(job.runtime.fault_slow, ""))
    window, held = memory_window(job, runtime), {}
    with sampler, ProfilerSession(tel, rank, runtime.cuda,
                                  persistent=lambda: memory.persistent_bytes(s.params, s.optimizer)
                                  ) as profiler, \
            TapSwitch(comm, mesh.axis_groups(), always=tel.comm_tap == "every_step",
                      steps=tel.traced_steps) as tap:
        for step in range(job.train.train_iters):
            heartbeat.beat(step)
            tap.at_step(step)
            comm.step = step
            faults.before_step(step, stall, slow)  # flight recorder tests: off unless --fault-* given
            start = time.perf_counter()
            loss = train_step(job, step, pipe, mesh, s.optimizer, s.grad_sync, comm, runtime)
            if runtime.cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            local = local_peak_memory(runtime)
            if step in window:           # reduced once the window closes: no collective in it
                if local is not None:
                    held[step] = local
                steps.record(step, loss, seconds, None, pending=True)
            else:
                steps.record(step, loss, seconds, step_peak_memory(local, step, runtime))
            comm.flush()
            if live is not None:
                with guard("prometheus metrics"):
                    live.publish(steps.last, comm.last_step)
            heartbeat.hold()             # a trace export may outlast --dist-timeout: not a stall
            profiler.step()
            if window and step == window[-1]:  # the window's trace is out: its steps' peaks
                peaks = held if runtime.cuda else profiler.step_peaks
                steps.resolve(memory.reduce_peaks(peaks, list(window), runtime.device))
                if live is not None and steps.peak is not None:
                    live.set_peak_memory(steps.peak)
        heartbeat.done()
    comm.close()
    steps.close()
    if rank == 0:  # the record again, with the largest measured peak and the untraced steps' time
        run_metadata.write(meta_path, run_metadata.build(
            job, backend=runtime.backend, dtype=runtime.dtype_name, cuda=runtime.cuda,
            peak_memory_bytes=steps.peak, untraced_step_s=steps.untraced_median(tel.traced_steps),
            sp_grad_sync_s=s.sp_grad_sync_s))
    dist.barrier()
    dist.destroy_process_group()
    return steps.losses


def memory_window(job: JobConfig, runtime: Runtime) -> range:
    """The steps whose peak memory is MAX-reduced over the ranks once, after the profiler's window
    closes, so that no telemetry collective lies inside a traced step (a trace of this trainer
    would show it as communication on the world group, and on a busy GPU as a long one). On CUDA
    every profiled step (the allocator's peak is exact); on CPU the profiled steps but the first,
    whose counter misses what the step before it left alive (telemetry.memory). Empty if the
    run does not reach the window's end: CUDA then reduces each step's peak after the step, and
    CPU measures none."""
    tel = job.telemetry
    first = tel.profile_wait + tel.profile_warmup
    window = range(first + (0 if runtime.cuda else 1), first + tel.profile_active)
    if not tel.profile or not window or window[-1] >= job.train.train_iters:
        return range(0)
    return window


def local_peak_memory(runtime: Runtime) -> int | None:
    """This rank's CUDA allocator peak in the step just ended, then reset; None on CPU (there
    the profiled steps' peaks come from the profiler when its window closes: telemetry.memory)
    or if reading it fails (a warning, not a zero)."""
    if not runtime.cuda:
        return None
    with guard("peak memory"):
        peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        return int(peak)
    return None


def step_peak_memory(local: int | None, step: int, runtime: Runtime) -> int | None:
    """The largest peak of any rank in this step: one MAX all-reduce after the step, outside
    the timed step, on CUDA (every rank calls it, even one whose reading failed); None on CPU."""
    if not runtime.cuda:
        return None
    return memory.reduce_peaks(None if local is None else {step: local}, [step],
                               runtime.device)[step]


def _peak_flops(tel, runtime: Runtime) -> float | None:
    """Peak FLOP/s per device for live MFU: --peak-tflops, else the device table, else None."""
    if tel.peak_tflops is not None:
        return tel.peak_tflops * 1e12
    return run_metadata.peak_flops(run_metadata.device_name(runtime.cuda), runtime.dtype_name)


def train_step(job, step, pipe, mesh, optimizer, grad_sync, comm, runtime) -> float:
    """One optimizer step over the global batch; returns the DP-mean loss (last stage)."""
    m, t = job.model, job.train
    tokens = global_batch(step, t.global_batch_size, m.seq_length, m.vocab_size, t.seed)
    dp = mesh.dp_size
    inputs, labels = replica_batch(tokens, mesh.dp_rank, dp, runtime.device)
    optimizer.zero_grad(set_to_none=True)
    grad_sync.start_step()
    with torch.autocast(runtime.device.type, dtype=torch.bfloat16,
                        enabled=runtime.dtype == torch.bfloat16):
        losses = pipe.step(inputs, labels)
    grad_sync.finish()
    optimizer.step()
    if not pipe.has_last:
        return float("nan")
    loss = torch.stack(losses).mean().float()
    for axis in ("dp_shard", "dp"):  # each replica's mean over the same number of tokens
        if mesh.size(axis) > 1:
            comm.wait(dist.all_reduce(loss, group=mesh.group(axis), async_op=True))
    return loss.item() / dp
