"""The profiler's memory events: what a device's allocator held, over time.

A trace recorded with `profile_memory=True` carries an instant (`ph` "i") named `[memory]` for
every allocation and free, with the allocator's running total after it (`Total Allocated`) and
the device it happened on (`Device Type`, c10::DeviceType: 0 CPU, 1 CUDA, which ROCm's HIP builds
report too; `Device Id`, -1 on the CPU). Only those are kept, as a few columns per rank: the
analysis (analysis.memuse) takes the peak and a curve from them.
"""
from __future__ import annotations

from dataclasses import field

import numpy as np

from . import schema
from ..record import record

NAME = "[memory]"
CPU = 0                                # c10::DeviceType::CPU


@record
class MemoryEvents:
    """One rank's `[memory]` instants, in trace order."""

    ts_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))       # relative to t0_us
    allocated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # Total Allocated, bytes; -1 unreadable
    device_type: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # -1 unreadable
    device_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    def __len__(self) -> int:
        return int(self.ts_ns.size)


def as_ints(values: list, dtype, low: int = 0) -> np.ndarray:
    """Integers (or integral floats) from low up to dtype's largest as they are; anything else -1."""
    top = np.iinfo(dtype).max
    return np.array([int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= top
                     and float(v).is_integer() else -1 for v in values], dtype=dtype)


def chunk_memory(instants: list) -> dict:
    """Columns of a chunk's `[memory]` instants (typed InstantEvents or loose Events): ts in
    microseconds as written (float, NaN when unreadable), the args as integers (-1 unreadable)."""
    mem = [e for e in instants if e.name == NAME]
    if not mem:
        return {}
    args = schema.decode_args_many([e.args for e in mem], schema.MemoryArgs)
    ts = np.array([e.ts if isinstance(e.ts, (int, float)) and not isinstance(e.ts, bool) and abs(e.ts) < 1e300
                   else np.nan for e in mem], dtype=np.float64)
    return {"ts": ts, "allocated": as_ints([a.total_allocated for a in args], np.int64),
            "device_type": as_ints([a.device_type for a in args], np.int32),
            "device_id": as_ints([a.device_id for a in args], np.int32, low=-1)}


def memory_table(parts: dict, t0_us: float, max_span_us: float) -> tuple[MemoryEvents, int]:
    """The rank's MemoryEvents from its chunks' columns (lists of arrays per column), times moved
    onto the event table's clock (ns after t0_us); and how many were dropped for an unusable
    timestamp or allocator total."""
    if not parts.get("ts"):
        return MemoryEvents(), 0
    col = {k: np.concatenate(v) for k, v in parts.items()}
    ts = col["ts"]
    good = np.isfinite(ts) & (np.abs(ts - t0_us) <= max_span_us) & (col["allocated"] >= 0) & (col["device_type"] >= 0)
    return MemoryEvents(ts_ns=np.rint((ts[good] - t0_us) * 1000.0).astype(np.int64),
                        allocated=col["allocated"][good], device_type=col["device_type"][good],
                        device_id=col["device_id"][good]), int((~good).sum())
