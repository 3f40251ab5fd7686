"""Run facts from a framework's own config file, for traces that come without diag_run.json.

`load_config(path)` reads, by the file's name and then its first bytes:
  *.toml            torchtitan's job config (torchtitan.py: [parallelism], [training], the
                    [model] flavour looked up in torchtitan's tables, [activation_checkpoint]);
  *.json            a dump of Megatron-LM's parsed arguments: one object of argparse names
                    (tensor_model_parallel_size, num_layers, swiglu, ...), as vars(args) gives;
  *.yaml, *.yml     the same dump as YAML, when PyYAML is installed (diag does not depend on it);
  anything else     Megatron-LM's command line in a text file, or the shell script that runs
                    pretrain_gpt.py (shell.py: line continuations, variables, bash arrays).
It returns one dict in diag's Megatron-style keys, only what the file states or what follows
from it by the framework's own rules: tp, pp, cp, ep, dp_shard, dp (replicate), world_size,
num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, swiglu,
vocab_size, seq_length, micro_batch_size, global_batch_size, num_micro_batches,
pipeline_schedule ('1f1b', 'gpipe', 'interleaved-1f1b', 'zb1p', 'zbv', ...),
virtual_pipeline_stages, recompute_granularity, dtype, sequence_parallel,
use_distributed_optimizer; 'source' (what was read, for the report) and, when something in the
file could not be used, 'notes'. Expert parallelism (ep) is carved out of the data-parallel
ranks in both frameworks: it does not multiply the world size. Unknown keys are ignored; a
known key with a value of the wrong type raises TraceError naming the file and the key.
"""
from __future__ import annotations

import json
import os
from typing import Optional

from ..trace.errors import TraceError
from .megatron import BOOLS, KNOWN, from_args
from .shell import command_args
from .torchtitan import from_toml


def load_config(path: str, world_size: Optional[int] = None) -> dict:
    """The run facts in the config file at `path` (see the module docstring). `world_size`,
    when the caller knows it (the traces' distributedInfo), resolves what the file leaves to
    it: torchtitan's data_parallel_shard_degree = -1, Megatron-LM's data-parallel size."""
    text = _read(path)
    kind = _kind(path, text)
    if kind == "toml":
        out = from_toml(path, _toml(path, text), world_size)
        return _described(out, f"torchtitan config {os.path.basename(path)}", _flavor_notes(out))
    args = _json(path, text) if kind == "json" else _yaml(path, text) if kind == "yaml" \
        else command_args(text, frozenset(BOOLS))
    if not KNOWN & set(args):
        raise TraceError(path, "no Megatron-LM arguments in it (--tensor-model-parallel-size, --num-layers, ...) "
                               "and not a torchtitan TOML (*.toml)")
    out, notes = from_args(path, args, world_size)
    return _described(out, f"Megatron-LM arguments {os.path.basename(path)}", notes)


def _read(path: str) -> str:
    from ..trace.safeio import read_regular

    try:
        return read_regular(path).decode("utf-8")
    except TraceError as e:
        raise TraceError(path, f"cannot read the config file: {e.problem}") from None
    except UnicodeDecodeError as e:
        raise TraceError(path, f"cannot read the config file: {e}") from None


def _kind(path: str, text: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext in (".toml", ".json"):
        return ext[1:]
    if ext in (".yaml", ".yml"):
        return "yaml"
    return "json" if text.lstrip().startswith("{") else "text"


def _toml(path: str, text: str) -> dict:
    try:
        import tomllib                               # Python 3.11+
    except ImportError:                              # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise TraceError(path, "reading TOML needs Python 3.11 or the tomli package") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TraceError(path, f"not valid TOML: {e}") from None
    except RecursionError:                     # arrays nested past the stack: no config
        raise TraceError(path, "not valid TOML: nested too deep") from None


def _json(path: str, text: str) -> dict:
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise TraceError(path, f"not valid JSON: {e}") from None
    except RecursionError:
        raise TraceError(path, "not valid JSON: nested too deep") from None
    if not isinstance(doc, dict):
        raise TraceError(path, "expected a JSON object of Megatron-LM arguments")
    return doc


def _yaml(path: str, text: str) -> dict:
    try:
        import yaml
    except ImportError:
        raise TraceError(path, "reading YAML needs PyYAML (pip install pyyaml); or give the arguments "
                               "as JSON or as the command line") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TraceError(path, f"not valid YAML: {e}") from None
    except RecursionError:
        raise TraceError(path, "not valid YAML: nested too deep") from None
    if not isinstance(doc, dict):
        raise TraceError(path, "expected a mapping of Megatron-LM arguments")
    return doc


def _flavor_notes(out: dict) -> list[str]:
    model = out.get("model")
    if model and "hidden_size" not in out:
        return [f"model {model}: not a flavour diag knows; give its shape (--num-layers, --hidden-size, ...)"]
    return []


def _described(out: dict, source: str, notes: list[str]) -> dict:
    model = out.pop("model", None)
    out["source"] = f"{source} ({model})" if model else source
    if notes:
        out["notes"] = notes
    return out
