"""Turn a trace's events into a RankTrace: columns built chunk by chunk, strings interned once.

Events are decoded a few MB at a time (schema.event_chunks) and each chunk is turned into
numpy columns at once, so memory holds the file's bytes, the columns, and one chunk's
Python objects, never a Python object per event of the whole file.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import field
from typing import Optional

import msgspec
import numpy as np

from . import schema
from .chunks import ChunkCols, chunk_columns, parallel_chunks
from .columns import median, num_column
from .commtable import comm_table, host_comm_mask, pg_ranks_of
from .errors import TraceError
from .memevents import memory_table
from .symbols import SymbolTable
from .table import EventTable, RankTrace
from ..record import record

MAX_SPAN_US = 1e11          # ~28 hours
MAX_ABS_TS_US = 9e15        # ~285 years after the epoch: x 1000 (ns) and + MAX_SPAN_US still fit int64


@record
class _Parts:
    """Columns of the chunks decoded so far, and what the whole file shares."""

    symbols: SymbolTable
    threads: dict = field(default_factory=dict)        # (pid, tid) -> host thread index
    cols: dict = field(default_factory=dict)           # column name -> list of arrays
    args: dict = field(default_factory=dict)           # global row -> Args, communication rows
    meta: list = field(default_factory=list)           # metadata ("M") events
    skipped: dict = field(default_factory=dict)
    gemms: Counter = field(default_factory=Counter)    # (op, input dims) -> count
    memory: dict = field(default_factory=dict)         # `[memory]` column name -> list of arrays
    rows: int = 0

    def add(self, **arrays) -> None:
        for k, v in arrays.items():
            self.cols.setdefault(k, []).append(v)

    def column(self, k: str, dtype) -> np.ndarray:
        """The whole column, once: its chunks' arrays are let go as it is made."""
        parts = self.cols.pop(k, None)
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _merge(parts: "_Parts", cc: ChunkCols) -> None:
    """Append a chunk's columns, mapping its local name and thread ids onto the rank's."""
    parts.meta.extend(cc.meta)
    parts.gemms.update(cc.gemms)
    for k, v in cc.memory.items():
        parts.memory.setdefault(k, []).append(v)
    for k, v in cc.skipped.items():
        parts.skipped[k] = parts.skipped.get(k, 0) + v
    if not cc.rows:
        return
    names = np.array(parts.symbols.intern_many(cc.names), dtype=np.int32)
    threads = np.array([parts.threads.setdefault(k, len(parts.threads)) for k in cc.threads], dtype=np.int32)
    cols = dict(cc.cols, name=names[cc.cols["name"]], thread=threads[cc.cols["thread"]])
    parts.add(**cols)
    parts.args.update({r + parts.rows: a for r, a in cc.comm_args.items()})
    parts.rows += cc.rows


def _decode_parts(path: str, doc: schema.TraceFile, symbols: SymbolTable) -> _Parts:
    for chunked in (True, False):
        parts = _Parts(symbols=symbols)
        try:
            done = parallel_chunks(doc.traceEvents) if chunked else None
            for cc in done or map(chunk_columns, schema.event_chunks(doc.traceEvents, chunked=chunked)):
                _merge(parts, cc)
            return parts
        except schema.ChunkingError:
            continue          # a cut fell inside an event: decode the array whole instead
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            raise TraceError(path, f"not a PyTorch profiler trace: {e} (in traceEvents)") from None
        except RecursionError:
            raise TraceError(path, "not a PyTorch profiler trace: JSON nested too deeply (in traceEvents)") from None
        except UnicodeDecodeError:
            raise TraceError(path, "not JSON: invalid UTF-8 in traceEvents") from None
    raise AssertionError("unreachable: whole decoding either succeeds or raises")


def _table(path: str, parts: _Parts) -> tuple[EventTable, np.ndarray]:
    ts_us, dur_us = parts.column("ts", np.float64), parts.column("dur", np.float64)
    if ts_us.size == 0:
        raise TraceError(path, "no complete ('X') events: nothing timed in this trace")
    good = np.isfinite(ts_us)
    if not good.any():
        raise TraceError(path, "no event has a timestamp")
    # A real trace spans seconds to hours; an event days away from the others is corrupt, and
    # keeping it would overflow int64 nanoseconds.
    good &= np.abs(ts_us - median(ts_us[good])) <= MAX_SPAN_US
    good &= np.abs(ts_us) <= MAX_ABS_TS_US      # the job's clock in ns (t0 x 1000) must fit int64 too
    if not good.any():
        raise TraceError(path, "no event has a usable timestamp")
    if not good.all():
        parts.skipped["events without a usable timestamp (missing, not a number, or days away "
                      "from the rest)"] = int((~good).sum())
    bad_dur = ~np.isfinite(dur_us) | (dur_us < 0) | (dur_us > MAX_SPAN_US)
    if bad_dur.any():
        parts.skipped["events with a missing, negative or implausible duration (kept as 0)"] = int(bad_dur.sum())
        dur_us[bad_dur] = 0.0
    t0_us = float(math.floor(ts_us[good].min()))
    ts_us = np.where(good, ts_us, t0_us)          # unusable rows are dropped below; keep the cast clean
    gpu = parts.column("gpu", bool)
    # Host thread keys -> numeric pid/tid, computed once per distinct thread, not per event.
    keys = list(parts.threads)
    pid_of = num_column([k[0] for k in keys], np.int64)
    tid_of = num_column([k[1] for k in keys], np.int64)
    host_thread, stream = parts.column("thread", np.int32), parts.column("stream", np.int64)
    device = parts.column("device", np.int64)
    device = np.where(gpu & (device < 0), pid_of[host_thread] if keys else -1, device)
    device = np.where(gpu, device, -1)
    odd = (device < -1) | (device > np.iinfo(np.int32).max)     # int16 wrapped pids past 32767
    if odd.any():
        parts.skipped["GPU events with a device id that fits no int32 (device taken as unknown)"] = int(odd.sum())
        device[odd] = -1
    table = EventTable(
        ts_ns=np.rint((ts_us - t0_us) * 1000.0).astype(np.int64),
        dur_ns=np.rint(dur_us * 1000.0).astype(np.int64),
        kind=parts.column("kind", np.int8), name_id=parts.column("name", np.int32),
        thread=np.where(gpu, np.where(stream >= 0, stream, tid_of[host_thread] if keys else -1),
                        host_thread).astype(np.int32),
        device=device.astype(np.int32),
        correlation=parts.column("correlation", np.int64), external_id=parts.column("external_id", np.int64),
        symbols=parts.symbols, t0_us=t0_us)
    return table, good


def build_rank(path: str, doc: schema.TraceFile, symbols: SymbolTable | None = None) -> RankTrace:
    parts = _decode_parts(path, doc, symbols or SymbolTable())
    table, good = _table(path, parts)
    if not good.all():
        table = table.take(np.flatnonzero(good))
        keep = np.cumsum(good) - 1
        parts.args = {int(keep[r]): a for r, a in parts.args.items() if good[r]}
    host = host_comm_mask(table.name_id, table.kind, table.symbols)
    comms = comm_table(table, parts.args, host, pg_ranks_of(doc))
    rt = _rank_trace(path, doc, table, comms, parts.meta, parts.threads, parts.skipped)
    rt.gemms = dict(parts.gemms)
    rt.memory, dropped = memory_table(parts.memory, table.t0_us, MAX_SPAN_US)
    if dropped:
        rt.skipped["memory events without a usable timestamp, device or allocator total"] = dropped
    return rt


# More ranks than any job has had by orders of magnitude; past it a rank or world size is
# damage (a fuzzed 10^113 once overflowed the int64 rank columns), shown as unknown.
MAX_WORLD = 1 << 24


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _base_us(doc: schema.TraceFile) -> float:
    """baseTimeNanoseconds in microseconds; 0 when absent or unusable (a number past float64, or
    not finite: then listed in doc.unreadable), so the events' own timestamps are the epoch."""
    base = doc.baseTimeNanoseconds
    if not isinstance(base, (int, float)) or isinstance(base, bool):
        return 0.0
    us = float(base) / 1000.0 if abs(base) < 1e300 else math.inf
    if math.isfinite(us):
        return us
    doc.unreadable.append("baseTimeNanoseconds")
    return 0.0


def _epoch_ns(doc: schema.TraceFile, t0_us: float) -> Optional[int]:
    """The events' origin on the host's clock in integer ns: baseTimeNanoseconds as given (as float
    microseconds, ~1.8e15 on a 2026 clock, it keeps a quarter of a microsecond, which a transfer of tens
    of microseconds timed across two ranks' traces cannot lose) plus the origin; absent, the events'
    own timestamps are the clock (as _base_us); None where it is out of int64's range or not finite."""
    base = doc.baseTimeNanoseconds
    if not isinstance(base, (int, float)) or isinstance(base, bool):
        base = 0
    if not abs(base) < 1 << 62 or not math.isfinite(t0_us):     # also inf and nan
        return None
    return round(base) + round(t0_us * 1000)


def _rank_trace(path, doc, table, comms, meta_events, threads, skipped) -> RankTrace:
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    rank = info.get("rank")
    world = info.get("world_size")
    thread_names = {}
    for e in meta_events:
        key = (e.pid, e.tid)
        if e.name == "thread_name" and isinstance(e.pid, (int, str)) and isinstance(e.tid, (int, str)) \
                and key in threads:
            name = schema.decode_args(e.args).name
            if isinstance(name, str):
                thread_names[threads[key]] = name
    base_us = _base_us(doc)
    for key in doc.unreadable:
        skipped[f"top-level '{key}' unreadable (a number out of range): unknown for this file"] = 1
    world = world if _is_count(world) and 0 < world <= MAX_WORLD else None
    return RankTrace(
        path=str(path),
        rank=rank if _is_count(rank) and 0 <= rank < (world or MAX_WORLD) else None,
        world_size=world,
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        events=table, comms=comms,
        pg_config=info.get("pg_config") if isinstance(info.get("pg_config"), list) else [],
        devices=doc.deviceProperties if isinstance(doc.deviceProperties, list) else [],
        trace_id=str(doc.trace_id) if doc.trace_id is not None else None,
        start_epoch_us=base_us + table.t0_us, start_epoch_ns=_epoch_ns(doc, table.t0_us),
        host=doc.host_name if isinstance(doc.host_name, str) and doc.host_name else None,
        thread_names=thread_names, skipped=skipped,
        meta={k: info[k] for k in ("nccl_version", "pg_count") if k in info},
    )
