"""One chunk of events -> numpy columns; serially or across cores.

`chunk_columns` is a pure function of a decoded chunk with its own local symbol table, so
chunks can be processed in forked worker processes that share the file's bytes
(copy-on-write) and send back only arrays, their local names, and the args of the few
communication rows. The builder remaps local ids onto the rank's table.
"""
from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Iterator, Optional

import msgspec
import numpy as np

from . import schema
from .columns import sparse_column
from .commtable import host_comm_mask
from .gemms import gemm_shapes
from .kinds import CATEGORY_KIND, GPU_ACTIVITY, KERNEL_CATEGORIES, Kind, kernel_kind
from .read import release
from .symbols import SymbolTable

# Field getters run in C over a whole chunk (map), not in a Python loop.
_NAME, _CAT, _TS, _DUR, _PH = (attrgetter(f) for f in ("name", "cat", "ts", "dur", "ph"))
_PID, _TID = attrgetter("pid"), attrgetter("tid")
# Flow arrows and instants: links and marks, not time spent; nothing to report.
_LINK_PHASES = frozenset({"s", "t", "f", "i", "I"})
MIN_PARALLEL_CHUNKS = 4


@dataclass
class ChunkCols:
    names: list                       # local symbol table: local name id -> string
    threads: list                     # local thread index -> (pid, tid)
    cols: dict                        # column -> array (name and thread hold local ids)
    comm_args: dict                   # local row -> Args, for communication rows only
    meta: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)
    gemms: Counter = field(default_factory=Counter)   # (op, input dims) -> count: gemms.gemm_shapes

    @property
    def rows(self) -> int:
        return int(self.cols["ts"].size) if self.cols else 0


def codes_of(values: list) -> tuple[np.ndarray, dict]:
    """Small integer codes of hashable values, with the value -> code map (C-level loops)."""
    codes = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return np.fromiter(map(codes.__getitem__, values), dtype=np.int32, count=len(values)), codes


def _kinds(cats: list[str], name_ids: np.ndarray, symbols: SymbolTable) -> np.ndarray:
    idx, codes = codes_of(cats)
    by_cat = np.full(len(codes) + 1, -2, dtype=np.int8)   # -2: a kernel, decided by its name
    for c, i in codes.items():
        lc = c.lower()
        by_cat[i] = -2 if lc in KERNEL_CATEGORIES else CATEGORY_KIND.get(lc, Kind.OTHER)
    kind = by_cat[idx]
    is_kernel = kind == -2
    if is_kernel.any():
        ids = np.unique(name_ids[is_kernel])
        lut = np.full(len(symbols), Kind.COMPUTE, dtype=np.int8)
        lut[ids] = [kernel_kind(symbols[int(i)]) for i in ids]
        kind[is_kernel] = lut[name_ids[is_kernel]]
    return kind


def as_strings(values: list) -> list:
    """Strings as they are; anything else (numbers, lists, null) as its text. Fast path in C."""
    if set(map(type, values)) <= {str}:
        return values
    return [v if isinstance(v, str) else "" if v is None else str(v) for v in values]


def as_keys(values: list) -> list:
    """Hashable values as they are; lists and dicts as their text."""
    if set(map(type, values)) <= {int, str, type(None)}:
        return values
    return [v if isinstance(v, (int, str, type(None))) else str(v) for v in values]


def as_floats(values: list) -> np.ndarray:
    """Numbers as float64; anything else (strings, lists, null, huge ints) as NaN."""
    if set(map(type, values)) <= {float, int}:
        try:
            return np.array(values, dtype=np.float64)
        except OverflowError:
            pass
    return np.array([v if isinstance(v, float) else float(v) if isinstance(v, int) and abs(v) < 1e300
                     else np.nan for v in values], dtype=np.float64)


def _timed(chunk: list, out: ChunkCols) -> list:
    """The complete ('X') events; metadata kept aside; other phases counted."""
    phs = as_keys(list(map(_PH, chunk)))
    phases = Counter(phs)                      # counted in C
    evs = [e for e, p in zip(chunk, phs) if p == "X"] if len(phases) > 1 else list(chunk)
    if phases.get("M"):
        out.meta.extend(e for e, p in zip(chunk, phs) if p == "M")
    for ph, n in phases.items():
        if ph not in ("X", "M") and ph not in _LINK_PHASES:
            out.skipped[f"events of phase {ph!r} (not analysed)"] = n
    return evs


def chunk_columns(chunk: list) -> ChunkCols:
    out = ChunkCols(names=[], threads=[], cols={}, comm_args={})
    evs = _timed(chunk, out)
    if not evs:
        return out
    sym = SymbolTable()
    name_ids = np.array(sym.intern_many(as_strings(list(map(_NAME, evs)))), dtype=np.int32)
    kind = _kinds(as_strings(list(map(_CAT, evs))), name_ids, sym)
    gpu = np.isin(kind, GPU_ACTIVITY)
    comm = (kind == Kind.COMM) | host_comm_mask(name_ids, kind, sym)
    # Only these rows' args are read: GPU activity (stream, device, correlation), launches
    # (correlation) and communication (sizes, groups).
    need = np.flatnonzero(gpu | (kind == Kind.RUNTIME) | comm)
    args = schema.decode_args_many([evs[i].args for i in need])
    n = len(evs)
    thread, keys = codes_of([(p, t) for p, t in zip(as_keys(list(map(_PID, evs))), as_keys(list(map(_TID, evs))))])
    out.names, out.threads = sym.names, list(keys)
    out.cols = dict(ts=as_floats(list(map(_TS, evs))), dur=as_floats(list(map(_DUR, evs))),
                    name=name_ids, kind=kind, gpu=gpu, thread=thread,
                    stream=sparse_column(n, need, [a.stream for a in args]),
                    device=sparse_column(n, need, [a.device for a in args]),
                    correlation=sparse_column(n, need, [a.correlation for a in args]),
                    external_id=sparse_column(n, need, [a.external_id for a in args]))
    is_comm = comm[need]
    out.comm_args = {int(r): a for r, a, c in zip(need.tolist(), args, is_comm.tolist()) if c}
    out.gemms = gemm_shapes(evs, name_ids, sym.names)
    return out


# --- across cores -------------------------------------------------------------------------
_SHARED: Optional[memoryview] = None      # the events array, inherited by forked workers


def _work(rng: tuple[int, int]):
    try:
        events = schema.decode_range(_SHARED, *rng)
        release(_SHARED, *rng)
        return chunk_columns(events)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        return None                       # a cut inside an event: the caller decodes whole


def workers() -> int:
    """Worker processes for one big file: the usable cores, or DIAG_WORKERS."""
    env = os.environ.get("DIAG_WORKERS")
    if env and env.isdigit():
        return max(1, int(env))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parallel_chunks(array) -> Optional[Iterator[ChunkCols]]:
    """ChunkCols of every chunk, in order, decoded by forked workers; None if not worth it."""
    global _SHARED
    n = workers()
    if n < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    ranges = schema.chunk_ranges(array) if len(memoryview(array)) > 2 * schema.CHUNK_BYTES else []
    if len(ranges) < MIN_PARALLEL_CHUNKS:
        return None
    _SHARED = memoryview(array)
    try:
        with multiprocessing.get_context("fork").Pool(min(n, len(ranges))) as pool:
            results = pool.map(_work, ranges, chunksize=1)
    finally:
        _SHARED = None
    if any(r is None for r in results):
        raise schema.ChunkingError(0)
    return iter(results)
