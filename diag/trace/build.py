"""Turn decoded events into a RankTrace: columns built in bulk, strings interned once."""
from __future__ import annotations

import math
import re
from typing import Any, Optional

import numpy as np

from . import schema
from .errors import TraceError
from .kinds import (CATEGORY_KIND, KERNEL_CATEGORIES, Coll, Kind, coll_from_arg, coll_from_host_op,
                    coll_from_kernel, dtype_bytes, kernel_kind)
from .symbols import SymbolTable
from .table import CommTable, EventTable, RankTrace


# Flow arrows and instants: links and marks, not time spent; nothing to report.
_LINK_PHASES = frozenset({"s", "t", "f", "i", "I"})


def _num_column(values: list, dtype, missing: int = -1) -> np.ndarray:
    """Numbers (or None, or numeric strings) -> array; anything unparsable -> missing."""
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        arr = np.array([_as_float(v) for v in values], dtype=np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        arr[bad] = missing
    return arr.astype(dtype)


def _as_float(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _kinds(cats: list[str], name_ids: np.ndarray, symbols: SymbolTable) -> np.ndarray:
    cat_codes: dict[str, int] = {}
    cat_idx = np.array([cat_codes.setdefault(c, len(cat_codes)) for c in cats], dtype=np.int32)
    cat_kind = np.full(len(cat_codes) + 1, -2, dtype=np.int8)   # -2: "kernel, decide by name"
    for c, i in cat_codes.items():
        lc = c.lower()
        cat_kind[i] = -2 if lc in KERNEL_CATEGORIES else CATEGORY_KIND.get(lc, Kind.OTHER)
    kind = cat_kind[cat_idx]
    is_kernel = kind == -2
    if is_kernel.any():
        ids = np.unique(name_ids[is_kernel])
        lut = np.full(len(symbols), Kind.COMPUTE, dtype=np.int8)
        lut[ids] = [kernel_kind(symbols[int(i)]) for i in ids]
        kind[is_kernel] = lut[name_ids[is_kernel]]
    return kind


def build_rank(path: str, doc: schema.TraceFile, symbols: Optional[SymbolTable] = None) -> RankTrace:
    symbols = symbols or SymbolTable()
    skipped: dict[str, int] = {}
    meta_events = []
    evs = []
    for e in doc.traceEvents:
        if e.ph == "X":
            evs.append(e)
        elif e.ph == "M":
            meta_events.append(e)
        elif e.ph not in _LINK_PHASES:
            key = f"events of phase '{e.ph}' (not analysed)"
            skipped[key] = skipped.get(key, 0) + 1
    if not evs:
        raise TraceError(path, "no complete ('X') events: nothing timed in this trace")

    ts_us = np.array([e.ts for e in evs], dtype=np.float64)
    dur_us = np.array([e.dur for e in evs], dtype=np.float64)
    good = np.isfinite(ts_us)
    if not good.all():
        skipped["events without a timestamp"] = int((~good).sum())
    bad_dur = ~np.isfinite(dur_us) | (dur_us < 0)
    if bad_dur.any():
        skipped["events with missing or negative duration (kept as 0)"] = int(bad_dur.sum())
        dur_us[bad_dur] = 0.0
    if not good.any():
        raise TraceError(path, "no event has a timestamp")
    if not good.all():
        evs = [e for e, g in zip(evs, good) if g]
        ts_us, dur_us = ts_us[good], dur_us[good]

    t0_us = float(math.floor(ts_us.min()))
    ts_ns = np.rint((ts_us - t0_us) * 1000.0).astype(np.int64)
    dur_ns = np.rint(dur_us * 1000.0).astype(np.int64)
    name_ids = np.array(symbols.intern_many([e.name for e in evs]), dtype=np.int32)
    kind = _kinds([e.cat for e in evs], name_ids, symbols)

    args = [e.args for e in evs]
    gpu = np.isin(kind, [Kind.COMPUTE, Kind.COMM, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_OTHER])
    stream = _num_column([a.stream if a is not None else None for a in args], np.int64)
    device = _num_column([a.device if a is not None else None for a in args], np.int64)
    pid_num = _num_column([e.pid for e in evs], np.int64)
    device = np.where(gpu & (device < 0), pid_num, device)
    device = np.where(gpu, device, -1).astype(np.int16)

    threads: dict = {}
    host_thread = np.array([threads.setdefault((e.pid, e.tid), len(threads)) for e in evs], dtype=np.int32)
    tid_num = _num_column([e.tid for e in evs], np.int64)
    thread = np.where(gpu, np.where(stream >= 0, stream, tid_num), host_thread).astype(np.int32)

    table = EventTable(
        ts_ns=ts_ns, dur_ns=dur_ns, kind=kind, name_id=name_ids, thread=thread, device=device,
        correlation=_num_column([a.correlation if a is not None else None for a in args], np.int64),
        external_id=_num_column([a.external_id if a is not None else None for a in args], np.int64),
        symbols=symbols, t0_us=t0_us,
    )
    comms = _comm_table(table, args, _pg_ranks(doc))
    return _rank_trace(path, doc, table, comms, meta_events, threads, skipped)


def _pg_ranks(doc: schema.TraceFile) -> dict[str, list]:
    """Process-group name -> member ranks, from distributedInfo.pg_config."""
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    out = {}
    for pg in info.get("pg_config") or []:
        if isinstance(pg, dict) and isinstance(pg.get("ranks"), list):
            out[str(pg.get("pg_name"))] = pg["ranks"]
    return out


def group_key(ranks: object) -> Optional[str]:
    """Member ranks ('[0, 1]' as written in args, or a list) -> canonical key '0,1'."""
    if isinstance(ranks, str):
        ranks = [p for p in ranks.strip("[] ").replace(" ", "").split(",") if p]
    if not isinstance(ranks, list) or not ranks:
        return None
    try:
        return ",".join(str(r) for r in sorted(int(r) for r in ranks))
    except (TypeError, ValueError):
        return None


# Host-side spans that describe communication (their args say what the kernel does not).
HOST_COMM_RE = re.compile(r"^(gloo:|c10d::|nccl:|diag:comm:|record_param_comms$)")


def _input_nelems(a) -> Optional[int]:
    """Elements of the first input from `Input Dims` ([[4, 8]] -> 32), when recorded."""
    dims = a.input_dims if a is not None else None
    if isinstance(dims, list) and dims and isinstance(dims[0], list) and dims[0]:
        n = 1
        for d in dims[0]:
            if not isinstance(d, int) or d < 0:
                return None
            n *= d
        return n
    return None


def _comm_table(table: EventTable, args: list, pg_ranks: dict) -> CommTable:
    host = table.name_mask(HOST_COMM_RE.match) & np.isin(table.kind, [Kind.CPU_OP, Kind.ANNOTATION])
    rows = np.flatnonzero((table.kind == Kind.COMM) | host)
    picked = [args[i] for i in rows]
    names = [table.symbols[int(table.name_id[i])] for i in rows]
    coll = [coll_from_arg(a.collective) if a is not None and a.collective else Coll.UNKNOWN for a in picked]
    coll = [c if c != Coll.UNKNOWN else (coll_from_kernel(n) if n.startswith("nccl") and "Kernel" in n
                                         else coll_from_host_op(n)) for c, n in zip(coll, names)]
    pg = [table.symbols.intern(str(a.pg_name)) if a is not None and a.pg_name is not None else -1 for a in picked]
    groups = []
    for a in picked:
        key = None if a is None else (group_key(a.pg_ranks) or group_key(pg_ranks.get(str(a.pg_name))))
        groups.append(table.symbols.intern(key) if key else -1)

    def col(attr, dtype):
        return _num_column([getattr(a, attr) if a is not None else None for a in picked], dtype)

    in_n = col("in_nelems", np.int64)
    fallback = np.array([_input_nelems(a) if n < 0 else None for a, n in zip(picked, in_n)], dtype=object)
    use = np.flatnonzero((in_n < 0) & (fallback != None))  # noqa: E711 - elementwise None test
    in_n[use] = fallback[use].astype(np.int64)
    dtypes = [dtype_bytes(a.dtype) or (dtype_bytes(a.input_type[0]) if isinstance(a.input_type, list) and a.input_type else 0)
              if a is not None else 0 for a in picked]
    return CommTable(
        row=rows.astype(np.int64), coll=np.array(coll, dtype=np.int8), pg=np.array(pg, dtype=np.int32),
        group=np.array(groups, dtype=np.int32),
        group_size=np.maximum(col("group_size", np.int32), 0), in_nelems=in_n,
        out_nelems=col("out_nelems", np.int64), dtype_bytes=np.array(dtypes, dtype=np.int8),
        seq=col("seq", np.int64),
    )


def _rank_trace(path, doc, table, comms, meta_events, threads, skipped) -> RankTrace:
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    rank = info.get("rank")
    world = info.get("world_size")
    thread_names = {}
    for e in meta_events:
        if e.name == "thread_name" and e.args is not None and isinstance(e.args.name, str):
            key = (e.pid, e.tid)
            if key in threads:
                thread_names[threads[key]] = e.args.name
    base = doc.baseTimeNanoseconds
    base_us = float(base) / 1000.0 if isinstance(base, (int, float)) else 0.0
    return RankTrace(
        path=str(path),
        rank=rank if isinstance(rank, int) and rank >= 0 else None,
        world_size=world if isinstance(world, int) and world > 0 else None,
        backend=info.get("backend") if isinstance(info.get("backend"), str) else None,
        events=table, comms=comms,
        pg_config=info.get("pg_config") if isinstance(info.get("pg_config"), list) else [],
        devices=doc.deviceProperties if isinstance(doc.deviceProperties, list) else [],
        trace_id=str(doc.trace_id) if doc.trace_id is not None else None,
        start_epoch_us=base_us + table.t0_us,
        thread_names=thread_names, skipped=skipped,
        meta={k: info[k] for k in ("nccl_version", "pg_count") if k in info},
    )
