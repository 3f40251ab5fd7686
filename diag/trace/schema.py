"""The slice of the Kineto Chrome-trace JSON that diag reads, as msgspec structs.

Decoding straight into typed structs skips every field we do not name (most of a
trace's bytes are args nobody analyses), keeps memory near the size of the data we
use, and turns a wrong type into an error that names the JSON path. Fields whose type
varies across PyTorch versions are typed ``Any`` and coerced later, so a new schema
never makes a whole file unreadable.
"""
from __future__ import annotations

from typing import Any, Union

import msgspec


class Args(msgspec.Struct, omit_defaults=True):
    """The `args` keys diag uses; every other key is skipped by the decoder."""

    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    stream: Any = None
    device: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")
    name: Any = None  # metadata events: process_name / thread_name
    labels: Any = None  # metadata events: process_labels ("CPU", "GPU 0")


class Event(msgspec.Struct):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: Union[float, None] = None
    dur: Union[float, None] = None
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    args: Union[Args, None] = None


class TraceFile(msgspec.Struct):
    traceEvents: Union[list[Event], None] = None
    distributedInfo: Any = None
    deviceProperties: Any = None
    trace_id: Any = None
    schemaVersion: Any = None
    baseTimeNanoseconds: Any = None


# A Chrome trace may also be a bare JSON array of events.
_decoder = msgspec.json.Decoder(Union[TraceFile, list[Event]])


def decode(data: bytes) -> TraceFile:
    """Decode trace bytes; raises msgspec.DecodeError / ValidationError on bad input."""
    doc = _decoder.decode(data)
    if isinstance(doc, list):
        return TraceFile(traceEvents=doc)
    return doc
