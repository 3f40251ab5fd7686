"""`diag_run.json`, typed: the facts of a run a trace cannot tell, in one versioned schema.

Problem: MFU, the bubble ideal, the layout and every recommendation need facts a profiler trace
does not carry (batch sizes, model shape, which process group is which axis, the dtype). Our
trainer writes them to `diag_run.json`; users give the same facts by flags or a framework's
config file. Read as an untyped dict, a `"tp": [2]` or a batch size written as a string travels
until some arithmetic raises far from the file, and a size of 10^12 makes work per claimed rank.

Here the record is a msgspec Struct: decoding validates every field's type and range and fails
with one line that names the field; the trainer (the one producer) and `diag.advise.synth` build
it with the same class. `RunFacts` is the same record as the analysis uses it: what the run
file, the config file and the flags say, merged in that order of precedence (later wins), and
what the trace itself settled (layout, model shape from GEMMs). Every field is optional: a run
from another program has none of them, and an unknown fact stays None, never a guess.

Schema history (docs/run_metadata.md): 1 the first trainer's record; 2 the same fields typed and
range-checked, plus layout dims, cp/ep/dp_shard, num_query_groups, swiglu, virtual stages, the
memory levers (sequence parallelism, ZeRO / sharding strategy, recompute) and memory (peak, capacity).
A version this diag does not know is refused with a message, not half-read.
"""
from __future__ import annotations

import math
import os
from typing import Annotated, Any, Optional

import msgspec

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
MAX_RANKS = 1 << 24         # the largest world a file may claim (also trace.build's bound)

Size = Annotated[int, msgspec.Meta(ge=1, le=MAX_RANKS)]          # an axis or world size
Count = Annotated[int, msgspec.Meta(ge=0, le=1 << 40)]           # batch, shape and step counts
Name = Annotated[str, msgspec.Meta(max_length=4096)]


class Profile(msgspec.Struct, forbid_unknown_fields=False):
    """The torch.profiler schedule in steps (the active window: wait+warmup .. +active-1)."""
    enabled: bool = False
    wait: Count = 0
    warmup: Count = 0
    active: Count = 0
    # where the diag trainer's comm tap (a TorchDispatchMode: PythonDispatchMode in the trace) ran:
    # "every_step" (--comm-log, the live exporter), "profiled_steps" (its warmup and active steps
    # only: the steps outside the trace do not pay it), None (not said, or no tap)
    comm_tap: Optional[Name] = None
    # median wall time of the steps the profiler did not trace (outside its warmup and active steps
    # and the export step after them, the first step left out), written at the end of the run: what
    # the profiler itself adds to a traced step on a host timeline is the difference
    untraced_step_s: Optional[Annotated[float, msgspec.Meta(gt=0, le=1e9)]] = None


class RunFacts(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """A run's facts, each None until something says it. Megatron-LM names throughout."""
    schema_version: int = SCHEMA_VERSION
    # layout: sizes by axis (diag.layout.AXES) and, when the producer knows it, the mesh order
    tp: Optional[Size] = None
    pp: Optional[Size] = None
    dp: Optional[Size] = None               # all data-parallel ways (replicate × shard)
    cp: Optional[Size] = None
    ep: Optional[Size] = None
    dp_shard: Optional[Size] = None
    world_size: Optional[Size] = None
    layout: Optional[list[tuple[Name, Size]]] = None   # [[axis, size], ...] outermost first
    rank_order: Optional[Name] = None
    # batch
    micro_batch_size: Optional[Count] = None
    num_micro_batches: Optional[Count] = None
    global_batch_size: Optional[Count] = None
    seq_length: Optional[Count] = None
    # model shape
    model: Optional[Name] = None
    num_layers: Optional[Count] = None
    hidden_size: Optional[Count] = None
    num_attention_heads: Optional[Count] = None
    num_query_groups: Optional[Count] = None
    ffn_hidden_size: Optional[Count] = None
    vocab_size: Optional[Count] = None
    swiglu: Optional[bool] = None
    attention: Optional[Name] = None      # fused (keeps no s x s scores) | eager: from the trace's ops
    parameter_count: Optional[Count] = None
    # numerics and hardware
    dtype: Optional[Name] = None
    device: Optional[Name] = None
    device_name: Optional[Name] = None
    peak_flops: Optional[Annotated[float, msgspec.Meta(ge=0, le=1e20)]] = None
    # the host's cores and who shares them (CPU runs: whether gloo's threads have a core of their own)
    host_cpus: Optional[Size] = None            # cores a rank may run on (its CPU affinity)
    ranks_per_host: Optional[Size] = None       # ranks on one host (LOCAL_WORLD_SIZE)
    threads_per_rank: Optional[Size] = None     # torch's intra-op threads per rank
    # what the run's optimizer step pays per parameter whose gradient is Partial over TP (seconds; the trainer
    # times it at its start: its optimizer over small partial DTensor gradients, less over replicated ones):
    # what each of the norms' gradients costs under sequence parallelism (calibrate._sp_switch)
    sp_grad_sync_s: Optional[Annotated[float, msgspec.Meta(ge=0, le=3600)]] = None
    # one small reduction over a TP group, timed at the run's start (the trainer wrote it at schema 1.22, a
    # partial DTensor's; read where sp_grad_sync_s is missing)
    tp_latency_s: Optional[Annotated[float, msgspec.Meta(ge=0, le=3600)]] = None
    # schedule and levers
    pipeline_schedule: Optional[Name] = None
    virtual_pipeline_stages: Optional[Size] = None
    # Megatron-LM's uneven split: layers of the first / last pipeline stage (null: an even share)
    decoder_first_pipeline_num_layers: Optional[Count] = None
    decoder_last_pipeline_num_layers: Optional[Count] = None
    overlap_grad_reduce: Optional[bool] = None
    ddp_bucket_size: Optional[Count] = None
    gradient_as_bucket_view: Optional[bool] = None            # torch DDP's: False = buckets beside the grads
    grads_set_to_none: Optional[bool] = None                  # zero_grad(set_to_none=True) between steps
    sequence_parallel: Optional[bool] = None
    # whose sequence parallelism: "megatron" (the linears' inputs kept sharded, gathered again in backward)
    # or "dtensor" (torch's SequenceParallel plan: the column-parallel linears keep their gathered inputs)
    sequence_parallel_kind: Optional[Name] = None
    use_distributed_optimizer: Optional[bool] = None          # ZeRO-1, as Megatron-LM
    data_parallel_sharding_strategy: Optional[Name] = None    # no_shard | optim | optim_grads | optim_grads_params
    recompute_granularity: Optional[Name] = None              # full | selective
    # memory: measured peak (the largest over ranks) and the device's capacity, bytes
    peak_memory_bytes: Optional[Count] = None
    memory_per_gpu_bytes: Optional[Count] = None
    # provenance
    train_iters: Optional[Count] = None
    lr: Optional[float] = None
    seed: Optional[int] = None
    torch_version: Optional[Name] = None
    backend: Optional[Name] = None
    backend_version: Optional[Name] = None
    command: Optional[str] = None
    profile: Optional[Profile] = None


FIELDS = frozenset(RunFacts.__struct_fields__)


class RunMetaError(ValueError):
    """diag_run.json (or facts given another way) that does not fit the schema."""


def decode(data: bytes) -> RunFacts:
    """Validated facts from a diag_run.json's bytes; RunMetaError names the field at fault."""
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise RunMetaError(f"not JSON: {e}") from None
    except RecursionError:                     # nested past the interpreter's stack: no run metadata
        raise RunMetaError("not a JSON object of run facts: nested too deep") from None
    if not isinstance(raw, dict):
        raise RunMetaError(f"expected a JSON object, got {type(raw).__name__}")
    version = raw.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise RunMetaError(f"schema_version {version!r} is not one this diag reads "
                           f"({', '.join(map(str, READABLE_VERSIONS))}); a newer diag may")
    return convert(raw, "")


def convert(values: dict, what: str) -> RunFacts:
    """Facts from a dict (a decoded file, a config file's facts, flags); unknown keys ignored.
    what: the source, named in the error ("" when the caller names the file)."""
    try:
        facts = msgspec.convert({k: v for k, v in values.items() if k in FIELDS}, RunFacts)
    except msgspec.ValidationError as e:
        raise RunMetaError(f"{what}: {e}" if what else str(e)) from None
    if facts.lr is not None and not math.isfinite(facts.lr):
        raise RunMetaError(f"{what}: " * bool(what) + "lr is not a finite number - at `$.lr`")
    return facts


def merged(*layers: Optional[RunFacts]) -> RunFacts:
    """The facts of several sources, later layers winning where they say something."""
    out = RunFacts()
    for layer in layers:
        if layer is not None:
            out = msgspec.structs.replace(out, **given(layer))
    return out


def given(facts: RunFacts) -> dict[str, Any]:
    """The fields that say something (not None), as a dict."""
    return {k: v for k in FIELDS if (v := getattr(facts, k)) is not None and k != "schema_version"}


def encode(facts: RunFacts) -> bytes:
    return msgspec.json.format(msgspec.json.encode(facts), indent=2) + b"\n"


def write(path: str, facts: RunFacts) -> None:
    """Write diag_run.json atomically (trace.safeio.atomic_write: an exclusive temporary with an
    unpredictable name, renamed): a reader never sees half a file, no planted name is followed."""
    from .trace.safeio import atomic_write      # here: diag.trace imports this module

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write(path, encode(facts))
