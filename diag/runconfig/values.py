"""Typed values out of a config file, and the facts that follow from several of them.

A config value of the wrong type is the user's to fix, so it is an error that names the file
and the key (TraceError), never a silent default. What a framework derives from its own
arguments (the data-parallel size, micro-batches per step, the schedule's name) is derived
here once, the same way for torchtitan and Megatron-LM.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from ..trace.errors import TraceError

_INT = re.compile(r"[+-]?\d+")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}

# torch.distributed.pipelining's schedule classes, torchtitan's and Megatron-LM's names, squeezed
# (lower case, no "schedule" prefix, no separators) -> the names diag's --pipeline-schedule takes.
SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "interleaved-1f1b",
             "loopedbfs": "looped-bfs", "interleavedzerobubble": "zb1p", "zb1p": "zb1p",
             "zbvzerobubble": "zbv", "zbv": "zbv", "dualpipev": "dualpipev"}
SINGLE_STAGE = {"1f1b", "gpipe"}          # one model chunk per pipeline rank


def as_int(path: str, key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _INT.fullmatch(value.strip()):
        return int(value)
    raise TraceError(path, f"{key}: expected an integer, got {value!r}")


def as_bool(path: str, key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise TraceError(path, f"{key}: expected true or false, got {value!r}")


def as_str(path: str, key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    raise TraceError(path, f"{key}: expected a string, got {value!r}")


def schedule_name(name: str) -> str:
    """A pipeline schedule's name as diag spells it ('Interleaved1F1B' -> 'interleaved-1f1b');
    a name diag does not know is kept, in lower case."""
    squeezed = re.sub(r"[^a-z0-9]", "", name.lower())
    squeezed = squeezed[len("schedule"):] if squeezed.startswith("schedule") else squeezed
    return SCHEDULES.get(squeezed, name.strip().lower())


def exact_div(a: Optional[int], b: Optional[int]) -> Optional[int]:
    """a / b when both are known and b divides a, else None (unknown, not rounded)."""
    if not a or not b or a % b:
        return None
    return a // b


def micro_batches(global_batch: Optional[int], micro: Optional[int], dp_total: Optional[int]) -> Optional[int]:
    """Micro-batches per step = global batch / (micro-batch x the data-parallel ranks that
    split the batch), when all are known and it divides."""
    return exact_div(global_batch, micro * dp_total) if micro and dp_total else None


def known(out: dict) -> dict:
    """The facts that are known: None means not stated and not derivable, and is left out."""
    return {k: v for k, v in out.items() if v is not None}
