"""`<out>/diag_run.json`: what the analyser cannot read from a trace.

A trace says how long things took but not the batch sizes, the model shape, which process group
is TP, or the hardware's peak FLOP/s, and MFU, the bubble ideal and the recommendations need
all of them. Rank 0 writes this file once at start-up. The record is diag's typed schema
(`diag.runmeta.RunFacts`, documented in docs/run_metadata.md): this module is its one producer
in the trainer; the peak FLOP/s comes from diag's device table (`diag.hardware`), which tells an
H100 PCIe from an SXM part.
"""

from __future__ import annotations

import os
import platform
import shlex
import statistics
import time

import torch

from diag import runmeta
from diag.hardware import peak_flops
from diag.layout import RANK_ORDER
from diag.runmeta import Profile, RunFacts
from instrumented_trainer.parallel.mesh import MESH_AXES

from .safe import guard


def backend_version(backend: str) -> str | None:
    if backend == "nccl" and torch.cuda.is_available():
        return ".".join(map(str, torch.cuda.nccl.version()))
    return None  # gloo has no version of its own: it ships with torch


def device_name(cuda: bool) -> str:
    if cuda:
        return torch.cuda.get_device_name()
    return platform.processor() or platform.machine() or "cpu"


def host_facts(world_size: int) -> dict:
    """The host's cores as this rank sees them (its CPU affinity), the ranks that share them and
    torch's intra-op threads per rank: diag reads from them whether gloo's threads, which run the
    collectives, have a core the compute does not use (docs/model.md). A value not known is None."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):            # not Linux
        cpus = os.cpu_count()
    local = os.environ.get("LOCAL_WORLD_SIZE")
    ranks = int(local) if local and local.isdigit() else (1 if world_size == 1 else None)
    return {"host_cpus": cpus or None, "ranks_per_host": ranks or None, "threads_per_rank": torch.get_num_threads()}


SYNC_PARAMS, SYNC_WARMUP, SYNC_STEPS = 8, 2, 9    # ~0.35 s at start-up on the 2-rank CPU job, TP > 1 only
SYNC_ELEMENTS = 256              # 1 KiB of fp32: a message that costs its latency, as a norm's gradient does


def sp_grad_sync(tp_mesh, make_optimizer, cuda: bool) -> float | None:
    """Seconds the run's optimizer step pays per parameter whose gradient is Partial over this rank's TP mesh,
    as sequence parallelism leaves the norms' gradients: `make_optimizer` (the trainer's own optimizer factory)
    stepped over a few small DTensor parameters with Partial gradients, less the same with Replicate ones, the
    median of a few steps each, per parameter. It holds every reduction the optimizer makes of such a gradient
    (torch's DTensor reduces one each time an op reads it: three times in AdamW) and DTensor's own host time
    around each, which neither a bare all-reduce nor the run's own TP collectives show (on the trainer's 2-rank
    CPU job: 1.2-1.3 ms a reduction, against ~0.5 ms for a bare all-reduce of the same bytes). Every TP rank
    calls it, at start-up, before the profiler. None at TP 1, or when it fails (a warning, and training goes
    on)."""
    if tp_mesh.size() < 2:
        return None
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Partial, Replicate

    def zeros():
        return torch.zeros(SYNC_ELEMENTS, device=tp_mesh.device_type)

    def step_s(placement) -> float:
        params = [torch.nn.Parameter(DTensor.from_local(zeros(), tp_mesh, [Replicate()]))
                  for _ in range(SYNC_PARAMS)]
        optimizer, times = make_optimizer(params), []
        for i in range(SYNC_WARMUP + SYNC_STEPS):
            for p in params:
                p.grad = DTensor.from_local(zeros(), tp_mesh, [placement])
            dist.barrier(group=tp_mesh.get_group())       # the TP ranks start each step together
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            optimizer.step()
            if cuda:
                torch.cuda.synchronize()
            if i >= SYNC_WARMUP:
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    with guard("SP gradient sync probe"):
        return max(step_s(Partial()) - step_s(Replicate()), 0.0) / SYNC_PARAMS
    return None


def build(job, *, backend: str, dtype: str, cuda: bool,
          peak_memory_bytes: int | None = None, untraced_step_s: float | None = None,
          sp_grad_sync_s: float | None = None) -> RunFacts:
    """The metadata record of a run; `peak_memory_bytes`: the largest measured step peak of any
    rank, `untraced_step_s`: the median step outside the profiler's steps (both written again at
    the end of the run, when they are known)."""
    m, grid, t, tel = job.model, job.parallel.grid, job.train, job.telemetry
    name = device_name(cuda)
    return RunFacts(
        tp=grid.tp, pp=grid.pp, dp=job.parallel.dp_size, dp_shard=grid.dp_shard,
        world_size=grid.world_size,
        layout=[(a, grid.size(a)) for a in MESH_AXES],  # the DeviceMesh's dims, outermost first
        rank_order=RANK_ORDER,
        micro_batch_size=t.micro_batch_size, num_micro_batches=job.num_micro_batches,
        global_batch_size=t.global_batch_size,
        seq_length=m.seq_length, num_layers=m.num_layers, hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads, vocab_size=m.vocab_size,
        ffn_hidden_size=m.ffn_hidden_size, parameter_count=m.parameter_count(),
        dtype=dtype, device="cuda" if cuda else "cpu", device_name=name,
        peak_flops=peak_flops(name, dtype) if cuda else None,
        **host_facts(grid.world_size), sp_grad_sync_s=sp_grad_sync_s,
        # the schedule asked for: 1F1B with fewer micro-batches than stages runs as GPipe (torch's 1F1B
        # refuses it), the order Megatron-LM's 1F1B has then and diag's 1F1B model gives, and a change to
        # m >= p (diag's bubble lever) re-runs 1F1B: what diag predicts for it must be 1F1B's memory
        pipeline_schedule=job.parallel.pipeline_schedule,
        virtual_pipeline_stages=job.parallel.virtual_stages(m.num_layers),
        decoder_first_pipeline_num_layers=job.parallel.decoder_first_pipeline_num_layers or None,
        decoder_last_pipeline_num_layers=job.parallel.decoder_last_pipeline_num_layers or None,
        sequence_parallel=job.parallel.sequence_parallel,
        sequence_parallel_kind="dtensor",   # torch's SequenceParallel / PrepareModuleInput plan (tensor_parallel.py)
        use_distributed_optimizer=job.parallel.use_distributed_optimizer,
        data_parallel_sharding_strategy=job.parallel.data_parallel_sharding_strategy,
        recompute_granularity=job.parallel.recompute_granularity,
        peak_memory_bytes=peak_memory_bytes,
        overlap_grad_reduce=job.parallel.overlap_grad_reduce,
        ddp_bucket_size=job.parallel.ddp_bucket_size,
        gradient_as_bucket_view=False,   # its replicated DP sync keeps the last step's buckets (GradSync)
        grads_set_to_none=True,          # train_step: optimizer.zero_grad(set_to_none=True)
        train_iters=t.train_iters, lr=t.lr, seed=t.seed,
        torch_version=str(torch.__version__), backend=backend, backend_version=backend_version(backend),
        command=shlex.join(job.command),
        profile=Profile(enabled=tel.profile, wait=tel.profile_wait, warmup=tel.profile_warmup,
                        active=tel.profile_active, comm_tap=tel.comm_tap,
                        untraced_step_s=untraced_step_s if tel.profile else None))


def write(path: str, record: RunFacts) -> None:
    with guard("run metadata"):
        runmeta.write(path, record)
