"""Throughput and MFU of a job: measured step time combined with the model and batch shape.

The shape comes from the trainer's diag_run.json, a framework config file or the user's
flags; a trace from another program says nothing about tokens or model size, so those stay
unknown. Model FLOPs follow throughput's convention (6 N tokens + 12 L h s tokens) with the
real MLP and attention shapes where they are known (ffn_hidden_size, SwiGLU, GQA's
num_query_groups); where they are not, a plain GPT block (4h GeLU MLP, multi-head attention).
"""
from __future__ import annotations

from typing import Optional

from ..runmeta import RunFacts
from ..hardware import peak_flops
from ..trace.columns import median
from .results import RankResult, Throughput
from .throughput import model_flops_per_step, mfu, tokens_per_second_per_gpu

SHAPE_KEYS = ("global_batch_size", "seq_length", "num_layers", "hidden_size", "vocab_size")


def _arch(meta: RunFacts) -> dict:
    """The model's matmul shape beyond L, h and V, in throughput.gpt_params' keywords."""
    return dict(ffn_hidden=meta.ffn_hidden_size, num_heads=meta.num_attention_heads,
                num_query_groups=meta.num_query_groups, swiglu=bool(meta.swiglu))


def _peak(ranks: list[RankResult], meta: RunFacts, peak_tflops: Optional[float]):
    """Peak FLOP/s and where it came from: the flag; else the device table (diag.hardware), by the
    trace's device name, then the run record's; only for a device the table lacks, the peak the
    run record states (its producer may know a part we do not)."""
    if peak_tflops:
        return peak_tflops * 1e12, "--peak-tflops"
    dtype = meta.dtype or "bf16"
    for name in dict.fromkeys([r.device for r in ranks if r.device] + [meta.device_name]):
        if name and (peak := peak_flops(name, dtype)):
            return peak, f"device table: {name}, {meta.dtype or 'bf16 (assumed: dtype unknown)'}"
    if meta.peak_flops:
        return float(meta.peak_flops), "diag_run.json"
    return None, None


def throughput(ranks: list[RankResult], meta: RunFacts, world: Optional[int],
               peak_tflops: Optional[float] = None) -> Throughput:
    times = [r.step_time_s for r in ranks if r.step_time_s]
    step = float(median(times)) if times else None
    gpus = world or meta.world_size
    missing = [k for k in SHAPE_KEYS if not getattr(meta, k)]
    tokens = meta.global_batch_size * meta.seq_length if not {"global_batch_size", "seq_length"} & set(missing) else None
    flops = None
    if not missing:
        flops = model_flops_per_step(meta.num_layers, meta.hidden_size, meta.seq_length, meta.vocab_size,
                                     tokens, **_arch(meta))
    peak, source = _peak(ranks, meta, peak_tflops)
    unknown = [f"tokens/s and MFU: {', '.join(k.replace('_', '-') for k in missing)} not given "
               f"(diag_run.json or the --{missing[0].replace('_', '-')} ... flags)"] if missing else []
    if step is None:
        unknown.append("step time (no ProfilerStep marks)")
    if peak is None:
        unknown.append("MFU: device peak FLOP/s (--peak-tflops)")
    return Throughput(
        step_time_s=step, gpus=gpus, tokens_per_step=tokens,
        tokens_per_s_per_gpu=tokens_per_second_per_gpu(meta.global_batch_size, meta.seq_length, step, gpus)
        if tokens and step and gpus else None,
        model_flops_per_step=flops, mfu=mfu(flops, step, gpus, peak) if flops and step and gpus and peak else None,
        peak_flops=peak, peak_source=source, unknown=unknown)
