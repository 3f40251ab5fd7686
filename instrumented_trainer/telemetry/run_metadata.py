"""`<out>/diag_run.json`: what the analyser cannot read from a trace.

A trace says how long things took but not the batch sizes, the model shape, which process group
is TP, or the hardware's peak FLOP/s, and MFU, the bubble ideal and the recommendations need
all of them. Rank 0 writes this file once at start-up. The schema is documented in
docs/run_metadata.md; bump SCHEMA_VERSION on any incompatible change.
"""

from __future__ import annotations

import json
import os
import platform
import shlex

import torch

from diag.layout import RANK_ORDER
from diag.trace.safeio import atomic_write

from .safe import guard

SCHEMA_VERSION = 1

# Dense bf16 tensor-core peak per GPU, FLOP/s, from the vendors' data sheets (SXM parts).
PEAK_BF16_FLOPS = {
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
    "B200": 2250e12,
}


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Peak dense FLOP/s of the device for `dtype`, or None when we do not know it."""
    if dtype != "bf16":
        return None
    for key, value in PEAK_BF16_FLOPS.items():
        if key in device_name.upper():
            return value
    return None


def backend_version(backend: str) -> str | None:
    if backend == "nccl" and torch.cuda.is_available():
        return ".".join(map(str, torch.cuda.nccl.version()))
    return None  # gloo has no version of its own: it ships with torch


def device_name(cuda: bool) -> str:
    if cuda:
        return torch.cuda.get_device_name()
    return platform.processor() or platform.machine() or "cpu"


def build(job, *, backend: str, dtype: str, cuda: bool) -> dict:
    """The metadata record of a run as a plain dict."""
    m, grid, t, tel = job.model, job.parallel.grid, job.train, job.telemetry
    name = device_name(cuda)
    return {
        "schema_version": SCHEMA_VERSION,
        "tp": grid.tp, "pp": grid.pp, "dp": grid.dp, "world_size": grid.world_size,
        "rank_order": RANK_ORDER,
        "micro_batch_size": t.micro_batch_size,
        "num_micro_batches": job.num_micro_batches,
        "global_batch_size": t.global_batch_size,
        "seq_length": m.seq_length, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads, "vocab_size": m.vocab_size,
        "ffn_hidden_size": m.ffn_hidden_size, "parameter_count": m.parameter_count(),
        "dtype": dtype, "device": "cuda" if cuda else "cpu", "device_name": name,
        "peak_flops": peak_flops(name, dtype),
        "pipeline_schedule": job.parallel.pipeline_schedule,
        "overlap_grad_reduce": job.parallel.overlap_grad_reduce,
        "ddp_bucket_size": job.parallel.ddp_bucket_size,
        "train_iters": t.train_iters, "lr": t.lr, "seed": t.seed,
        "torch_version": torch.__version__, "backend": backend,
        "backend_version": backend_version(backend),
        "command": shlex.join(job.command),
        "profile": {"enabled": tel.profile, "wait": tel.profile_wait,
                    "warmup": tel.profile_warmup, "active": tel.profile_active},
    }


def write(path: str, record: dict) -> None:
    with guard("run metadata"):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        atomic_write(path, json.dumps(record, indent=2) + "\n")
