"""Megatron-LM's arguments in diag's keys: layout, batch and model shape.

The arguments come as argparse destination names with their values (shell.command_args turns
`--tensor-model-parallel-size 8` into tensor_model_parallel_size='8'; a JSON dump of the
parsed arguments has them typed). Megatron-LM's own rules fill what it fills itself: the MLP
width when not given (4h, or for SwiGLU int(8h/3 / 64) * 64), multi-head attention unless
--group-query-attention, the data-parallel size as world / (TP x PP x CP), micro-batches per
step as global batch / (micro-batch x DP), and the interleaved schedule when there are
virtual pipeline stages.
"""
from __future__ import annotations

from typing import Optional

from ..analysis.throughput import default_ffn_hidden
from .values import as_bool, as_int, as_str, exact_div, known, micro_batches

# argparse destination -> diag key, for integer arguments.
INTS = {
    "tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp", "expert_model_parallel_size": "ep",
    "world_size": "world_size", "data_parallel_size": "dp",
    "num_layers": "num_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "ffn_hidden_size",
    "num_attention_heads": "num_attention_heads", "num_query_groups": "num_query_groups",
    "seq_length": "seq_length", "micro_batch_size": "micro_batch_size",
    "global_batch_size": "global_batch_size", "vocab_size": "vocab_size", "padded_vocab_size": "padded_vocab_size",
    "num_layers_per_virtual_pipeline_stage": "layers_per_virtual_stage",
    "num_virtual_stages_per_pipeline_rank": "virtual_pipeline_stages",
    "virtual_pipeline_model_parallel_size": "virtual_pipeline_stages",
    "decoder_first_pipeline_num_layers": "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers": "decoder_last_pipeline_num_layers",
}
# torchrun's, in a launch script: the world size when both are numbers ("--nnodes 1:4" is elastic).
LAUNCHER = {"nproc_per_node", "nnodes"}
BOOLS = {"swiglu", "group_query_attention", "use_distributed_optimizer", "sequence_parallel",
         "untie_embeddings_and_output_weights", "bf16", "fp16", "use_torch_fsdp2", "use_megatron_fsdp",
         "overlap_grad_reduce"}
STRS = {"recompute_granularity", "data_parallel_sharding_strategy"}
KNOWN = frozenset(INTS) | BOOLS | STRS | LAUNCHER
# Megatron-FSDP shards parameters too only with this strategy; DDP and ZeRO-1/2 replicate them.
SHARDS_PARAMS = "optim_grads_params"


def read_args(path: str, args: dict) -> tuple[dict, list[str]]:
    """Typed values of the arguments diag uses, and the flags whose values were not literal."""
    typed, not_literal = {}, []
    for name, value in args.items():
        if name not in KNOWN:
            continue
        if isinstance(value, str) and "$" in value:
            not_literal.append(f"--{name.replace('_', '-')} {value}")
        elif name in LAUNCHER:
            if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
                typed[name] = int(value)
        elif value is None:
            continue                     # a JSON dump's null: not set
        elif name in INTS:
            typed[INTS[name]] = as_int(path, name, value)
        elif name in BOOLS:
            typed[name] = as_bool(path, name, value)
        else:
            typed[name] = as_str(path, name, value)
    return typed, not_literal


def from_args(path: str, args: dict, world_size: Optional[int] = None) -> tuple[dict, list[str]]:
    """diag's keys from Megatron-LM arguments (argparse names), and notes on what was not used."""
    a, not_literal = read_args(path, args)
    out = {k: a.get(k, 1) for k in ("tp", "pp", "cp", "ep")}
    out.update(_model(a))
    world = world_size or a.get("world_size") or (a["nproc_per_node"] * a["nnodes"]
                                                   if "nproc_per_node" in a and "nnodes" in a else None)
    out["world_size"] = world
    dp = a.get("dp") or exact_div(world, out["tp"] * out["pp"] * out["cp"])
    sharded = a.get("use_torch_fsdp2") or (a.get("use_megatron_fsdp")
                                           and a.get("data_parallel_sharding_strategy") == SHARDS_PARAMS)
    out["dp_shard" if sharded else "dp"] = dp
    out.update(micro_batch_size=a.get("micro_batch_size"), global_batch_size=a.get("global_batch_size"),
               seq_length=a.get("seq_length"),
               num_micro_batches=micro_batches(a.get("global_batch_size"), a.get("micro_batch_size"), dp))
    out.update(_pipeline(a, out["pp"]))
    out.update({k: a.get(k) for k in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")})
    out.update(use_distributed_optimizer=a.get("use_distributed_optimizer"),
               sequence_parallel=a.get("sequence_parallel"), sequence_parallel_kind="megatron",
               recompute_granularity=a.get("recompute_granularity"),
               dtype="bf16" if a.get("bf16") else "fp16" if a.get("fp16") else None,
               # its DDP all-reduces the contiguous grad buffer the gradients are views of: no bucket copy,
               # and that buffer is allocated for the whole run (zeroed, never freed, between steps)
               gradient_as_bucket_view=True, grads_set_to_none=False)
    notes = [f"not literal in the file, not used: {', '.join(not_literal)}"] if not_literal else []
    return known(out), notes


def _model(a: dict) -> dict:
    swiglu, hidden, heads = bool(a.get("swiglu")), a.get("hidden_size"), a.get("num_attention_heads")
    groups = a.get("num_query_groups") if a.get("group_query_attention") else heads
    ffn = a.get("ffn_hidden_size") or (default_ffn_hidden(hidden, swiglu) if hidden else None)
    return {"num_layers": a.get("num_layers"), "hidden_size": hidden, "ffn_hidden_size": ffn,
            "num_attention_heads": heads, "num_query_groups": groups, "swiglu": swiglu,
            "vocab_size": a.get("padded_vocab_size") or a.get("vocab_size")}


def _pipeline(a: dict, pp: int) -> dict:
    """Megatron-LM's pipeline schedule: interleaved 1F1B with virtual stages, else 1F1B."""
    if pp < 2:
        return {}
    per_stage = a.get("layers_per_virtual_stage")
    v = a.get("virtual_pipeline_stages") or (exact_div(exact_div(a.get("num_layers"), pp), per_stage)
                                             if per_stage else 1)
    interleaved = v > 1 if v else True          # layers per virtual stage given, the count unknown
    return {"pipeline_schedule": "interleaved-1f1b" if interleaved else "1f1b", "virtual_pipeline_stages": v}
