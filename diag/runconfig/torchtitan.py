"""torchtitan's job config (TOML) in diag's Megatron-style keys: layout, batch, model shape.

Read: [parallelism] degrees, pipeline schedule and micro-batch size (older releases kept some
of them in [training] or [experimental]); [training] local_batch_size (older: batch_size),
global_batch_size, seq_len, mixed_precision_param; [model] name and flavor, looked up in
torchtitan's own flavour tables (FLAVORS); [activation_checkpoint] mode. Everything else is
ignored. A parallel degree the file leaves out is torchtitan's default, 1 (disabled), and
data_parallel_shard_degree -1 means "the ranks the other degrees leave": known only with the
world size, which a TOML does not state (torchrun's --nproc_per_node does). Batch and sequence
sizes the file leaves out stay unknown. With TP > 1, sequence parallelism as torch's DTensor plan runs it:
torchtitan's TP plan always shards the norms over the sequence (SequenceParallel).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from .values import SINGLE_STAGE, as_int, as_str, exact_div, known, micro_batches, schedule_name


def swiglu_hidden(dim: int, multiple_of: int = 256, multiplier: Optional[float] = None) -> int:
    """torchtitan's (and Meta's Llama) SwiGLU width, `compute_ffn_hidden_dim`: 2/3 of 4 dim,
    times ffn_dim_multiplier, rounded up to a multiple of multiple_of."""
    hidden = int(2 * 4 * dim / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class Flavor(NamedTuple):
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn: int
    vocab: int


# torchtitan/models/llama3 (flavors.py / __init__.py) and the former models/llama (llama2_configs).
# Vocabularies are the tokenizers' (Llama 3: 128256, Llama 2: 32000; the llama3 debug model's
# own 2048). The debug models changed across releases (2, 8, then 6 layers): this is the current
# llama3 one; llama2's is left out. Llama 3.2 1B and 3B tie the LM head to the embedding.
FLAVORS: dict[tuple[str, str], Flavor] = {
    ("llama3", "debugmodel"): Flavor(256, 6, 16, 16, swiglu_hidden(256, 256), 2048),
    ("llama3", "1B"): Flavor(2048, 16, 32, 8, swiglu_hidden(2048, 1024, 1.5), 128256),
    ("llama3", "3B"): Flavor(3072, 28, 24, 8, swiglu_hidden(3072, 1024, 1.0), 128256),
    ("llama3", "8B"): Flavor(4096, 32, 32, 8, swiglu_hidden(4096, 1024, 1.3), 128256),
    ("llama3", "70B"): Flavor(8192, 80, 64, 8, swiglu_hidden(8192, 4096, 1.3), 128256),
    ("llama3", "405B"): Flavor(16384, 126, 128, 8, swiglu_hidden(16384, 4096, 1.2), 128256),
    ("llama2", "271M"): Flavor(1024, 16, 8, 8, swiglu_hidden(1024), 32000),
    ("llama2", "1B"): Flavor(2048, 18, 16, 16, swiglu_hidden(2048), 32000),
    ("llama2", "7B"): Flavor(4096, 32, 32, 32, swiglu_hidden(4096), 32000),
    ("llama2", "13B"): Flavor(5120, 40, 40, 40, swiglu_hidden(5120), 32000),
    ("llama2", "26B"): Flavor(5120, 80, 40, 40, swiglu_hidden(5120), 32000),
    ("llama2", "70B"): Flavor(8192, 80, 64, 8, swiglu_hidden(8192, 4096, 1.3), 32000),
}
MODEL_ALIASES = {"llama": "llama2"}     # torchtitan's first releases called llama2 "llama"

# diag key -> where torchtitan has kept it, newest first.
PLACES = {
    "tp": ("parallelism.tensor_parallel_degree", "training.tensor_parallel_degree"),
    "pp": ("parallelism.pipeline_parallel_degree", "experimental.pipeline_parallel_degree"),
    "cp": ("parallelism.context_parallel_degree", "experimental.context_parallel_degree"),
    "ep": ("parallelism.expert_parallel_degree",),
    "dp": ("parallelism.data_parallel_replicate_degree", "training.data_parallel_replicate_degree"),
    "dp_shard": ("parallelism.data_parallel_shard_degree", "training.data_parallel_shard_degree",
                 "training.data_parallel_degree"),
    "local_batch": ("training.local_batch_size", "training.batch_size"),
    "global_batch_size": ("training.global_batch_size",),
    "seq_length": ("training.seq_len",),
    "pp_micro": ("parallelism.pipeline_parallel_microbatch_size",),
    "pp_micro_batches": ("parallelism.pipeline_parallel_microbatches", "experimental.pipeline_parallel_microbatches"),
    "layers_per_stage": ("parallelism.pipeline_parallel_layers_per_stage",),
    "schedule": ("parallelism.pipeline_parallel_schedule", "experimental.pipeline_parallel_schedule"),
    "model": ("model.name",),
    "flavor": ("model.flavor",),
    "recompute": ("activation_checkpoint.mode",),
    "param_dtype": ("training.mixed_precision_param",),
}
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


class _Doc:
    """Typed look-ups in a parsed TOML; a wrong type names the file and section.key."""

    def __init__(self, path: str, doc: dict) -> None:
        self.path, self.doc = path, doc

    def raw(self, key: str):
        for place in PLACES[key]:
            section, name = place.split(".")
            table = self.doc.get(section)
            if isinstance(table, dict) and name in table:
                return place, table[name]
        return None, None

    def int(self, key: str, default: Optional[int] = None) -> Optional[int]:
        place, v = self.raw(key)
        return default if place is None else as_int(self.path, place, v)

    def str(self, key: str) -> Optional[str]:
        place, v = self.raw(key)
        return None if place is None else as_str(self.path, place, v)


def from_toml(path: str, doc: dict, world_size: Optional[int] = None) -> dict:
    """diag's keys from a parsed torchtitan TOML (see the module docstring)."""
    d = _Doc(path, doc)
    out = {k: d.int(k, 1) for k in ("tp", "pp", "cp", "ep", "dp")}
    shard = d.int("dp_shard", -1)
    others = out["tp"] * out["pp"] * out["cp"] * out["dp"]
    out["dp_shard"] = shard if shard > 0 else exact_div(world_size, others)
    out["world_size"] = world_size if world_size else (others * shard if shard > 0 else None)
    out.update(_batch(d, out))
    out.update(_model(d))
    out.update(_pipeline(d, out))
    recompute, dtype = d.str("recompute"), d.str("param_dtype")
    out["recompute_granularity"] = recompute.lower() if recompute else None
    out["dtype"] = DTYPES.get(dtype) if dtype else None
    if out["tp"] > 1:       # torchtitan's TP plan shards the norms over the sequence (SequenceParallel), always
        out.update(sequence_parallel=True, sequence_parallel_kind="dtensor")
    return known(out)


def _batch(d: _Doc, out: dict) -> dict:
    """Micro-batch size, global batch and micro-batches per step as torchtitan splits them: a
    rank's local batch is cut into pipeline micro-batches (pp > 1), and gradient accumulation
    repeats it until the global batch (default: local x data-parallel ranks) is reached."""
    local, given = d.int("local_batch"), d.int("global_batch_size", -1)
    micro = d.int("pp_micro", 1) if out["pp"] > 1 else local
    dp_total = out["dp"] * out["dp_shard"] if out["dp_shard"] else None
    glob = given if given > 0 else (local * dp_total if local and dp_total else None)
    m = micro_batches(glob, micro, dp_total) if given > 0 else exact_div(local, micro)
    return {"micro_batch_size": micro, "global_batch_size": glob, "seq_length": d.int("seq_length"),
            "num_micro_batches": d.int("pp_micro_batches") or m}


def _model(d: _Doc) -> dict:
    name, flavor = d.str("model"), d.str("flavor")
    if name is None or flavor is None:
        return {}
    f = FLAVORS.get((MODEL_ALIASES.get(name, name), flavor))
    if f is None:
        return {"model": f"{name} {flavor}"}
    return {"model": f"{name} {flavor}", "num_layers": f.n_layers, "hidden_size": f.dim,
            "num_attention_heads": f.n_heads, "num_query_groups": f.n_kv_heads, "ffn_hidden_size": f.ffn,
            "swiglu": True, "vocab_size": f.vocab}


def _pipeline(d: _Doc, out: dict) -> dict:
    if out["pp"] < 2:
        return {}
    sched = schedule_name(d.str("schedule") or "1F1B")         # torchtitan's default schedule
    per_stage, layers = d.int("layers_per_stage"), out.get("num_layers")
    v = 1 if sched in SINGLE_STAGE else exact_div(exact_div(layers, per_stage), out["pp"])
    return {"pipeline_schedule": sched, "virtual_pipeline_stages": v}
