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
from itertools import compress, repeat
from operator import attrgetter, eq
from typing import Iterator, Optional

import msgspec
import numpy as np

from . import schema
from .columns import sparse_column
from .commtable import host_comm_mask
from .gemms import gemm_shapes
from .memevents import chunk_memory
from .kinds import CATEGORY_KIND, GPU_ACTIVITY, KERNEL_CATEGORIES, Kind, kernel_kind
from .read import release
from .symbols import SymbolTable

# Field getters run in C over a whole chunk (map), not in a Python loop.
_NAME, _CAT, _TS, _DUR, _PH = (attrgetter(f) for f in ("name", "cat", "ts", "dur", "ph"))
_PID, _TID, _ARGS = attrgetter("pid"), attrgetter("tid"), attrgetter("args")
# Flow arrows and instants: links and marks, not time spent; nothing to report.
_LINK_PHASES = frozenset({"s", "t", "f", "i", "I"})
MIN_PARALLEL_CHUNKS = 4
UNREADABLE = "items of traceEvents that are no readable event (not an object, or a number out of range): skipped"


@dataclass
class ChunkCols:
    names: list                       # local symbol table: local name id -> string
    threads: list                     # local thread index -> (pid, tid)
    cols: dict                        # column -> array (name and thread hold local ids)
    comm_args: dict                   # local row -> Args, for communication rows only
    meta: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)
    gemms: Counter = field(default_factory=Counter)   # (op, input dims) -> count: gemms.gemm_shapes
    memory: dict = field(default_factory=dict)        # `[memory]` instants' columns: memevents.chunk_memory

    @property
    def rows(self) -> int:
        return int(self.cols["ts"].size) if self.cols else 0


def codes_of(values) -> tuple[np.ndarray, dict]:
    """Small integer codes of hashable values (in order of first appearance), with the value ->
    code map. Two C-level passes over the values (dict.fromkeys, map), a Python loop only over
    the distinct ones."""
    values = values if isinstance(values, list) else list(values)
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


class _Fields:
    """The fields of a chunk's events as lists, or arrays for the times. TypedEvents (schema)
    are read as they are; loosely typed Events are coerced first (as_strings, as_keys,
    as_floats)."""

    def __init__(self, evs: list, typed: bool) -> None:
        self.evs, self.typed = evs, typed

    def strings(self, get) -> list:
        values = list(map(get, self.evs))
        return values if self.typed else as_strings(values)

    def keys(self, get) -> list:
        values = list(map(get, self.evs))
        return values if self.typed else as_keys(values)

    def floats(self, get) -> np.ndarray:
        if self.typed:
            return np.fromiter(map(get, self.evs), dtype=np.float64, count=len(self.evs))
        return as_floats(list(map(get, self.evs)))


def _timed(chunk: list, out: ChunkCols, typed: bool) -> list:
    """The complete ('X') events; metadata kept aside; other phases counted. TypedEvents carry
    their phase as their type (schema.PHASE_OF), loose Events as a field."""
    if typed:
        tags, x, m = list(map(type, chunk)), schema.TypedEvent, schema.MetaEvent
        phases = Counter({schema.PHASE_OF[t]: n for t, n in Counter(tags).items()})
    else:
        tags, x, m = as_keys(list(map(_PH, chunk))), "X", "M"
        phases = Counter(tags)                 # counted in C
    unreadable = getattr(chunk, "unreadable", 0)
    if unreadable:
        out.skipped[UNREADABLE] = unreadable
    if phases.get("M"):
        out.meta.extend(compress(chunk, map(eq, tags, repeat(m))))
    if phases.get("i"):
        out.memory = chunk_memory(list(compress(chunk, map(eq, tags, repeat(schema.InstantEvent if typed else "i")))))
    for ph, n in phases.items():
        if ph not in ("X", "M") and ph not in _LINK_PHASES:
            out.skipped[f"events of phase {ph!r} (not analysed)"] = n
    if phases.get("X", 0) == len(tags):
        return chunk
    return list(compress(chunk, map(eq, tags, repeat(x))))


def _threads(f: _Fields) -> tuple[np.ndarray, list]:
    """Each event's host thread as a code over its distinct (pid, tid) pairs, numbered in order
    of first appearance, and those pairs. pid and tid are coded apart and combined in numpy:
    hashing a tuple per event costs more than the rest of the chunk's columns."""
    pid, pids = codes_of(f.keys(_PID))
    tid, tids = codes_of(f.keys(_TID))
    pairs = pid.astype(np.int64) * len(tids) + tid
    uniq, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    number = np.empty(len(uniq), dtype=np.int32)
    number[order] = np.arange(len(uniq), dtype=np.int32)
    pid_of, tid_of = list(pids), list(tids)
    keys = [(pid_of[u // len(tids)], tid_of[u % len(tids)]) for u in uniq[order].tolist()]
    return number[inverse.reshape(-1)], keys


def chunk_columns(chunk: list) -> ChunkCols:
    out = ChunkCols(names=[], threads=[], cols={}, comm_args={})
    typed = bool(chunk) and type(chunk[0]) in schema.PHASE_OF
    evs = _timed(chunk, out, typed)
    if not evs:
        return out
    f = _Fields(evs, typed)
    name_ids, codes = codes_of(f.strings(_NAME))
    sym = SymbolTable.of(codes)
    kind = _kinds(f.strings(_CAT), name_ids, sym)
    gpu = np.isin(kind, GPU_ACTIVITY)
    comm = (kind == Kind.COMM) | host_comm_mask(name_ids, kind, sym)
    # Only these rows' args are read: GPU activity (stream, device, correlation), launches
    # (correlation) and communication (sizes, groups).
    needed = gpu | (kind == Kind.RUNTIME) | comm
    need = np.flatnonzero(needed)
    args = schema.decode_args_many(list(map(_ARGS, compress(evs, needed.tolist()))))
    n = len(evs)
    thread, keys = _threads(f)
    out.names, out.threads = sym.names, keys
    out.cols = dict(ts=f.floats(_TS), dur=f.floats(_DUR),
                    name=name_ids, kind=kind, gpu=gpu, thread=thread,
                    **{col: sparse_column(n, need, list(map(attrgetter(col), args)))
                       for col in ("stream", "device", "correlation", "external_id")})
    is_comm = comm[need]
    out.comm_args = {int(r): a for r, a, c in zip(need.tolist(), args, is_comm.tolist()) if c}
    out.gemms = gemm_shapes(evs, name_ids, sym.names, out.skipped)
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
