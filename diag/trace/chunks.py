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
from operator import attrgetter, eq, index
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


def codes_of(values, n: Optional[int] = None) -> tuple[np.ndarray, dict]:
    """Small integer codes of hashable values (in order of first appearance), with the value ->
    code map. One C-level pass: each value is looked up once, by dict.setdefault with the next
    code (len of the map, taken just before) as its default. values: a list, or an iterator of
    n values (map over the events: no list of the field is made)."""
    if n is None:
        values = values if isinstance(values, list) else list(values)
        n = len(values)
    codes: dict = {}
    return np.fromiter(map(codes.setdefault, values, map(len, repeat(codes))), dtype=np.int32, count=n), codes


def _kinds(cats: tuple[np.ndarray, dict], name_ids: np.ndarray, symbols: SymbolTable) -> np.ndarray:
    """cats: codes_of the events' categories."""
    idx, codes = cats
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

    def codes(self, get, coerce) -> tuple[np.ndarray, dict]:
        """codes_of the field: straight from the events when typed, else of its coerced values
        (coerce: as_strings or as_keys)."""
        if self.typed:
            return codes_of(map(get, self.evs), len(self.evs))
        return codes_of(coerce(list(map(get, self.evs))))

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


def _int_field(f: _Fields, get) -> Optional[np.ndarray]:
    """A typed field as int64 when every value is an integer in range (operator.index refuses
    strings, numeric ones too, and None), else None."""
    try:
        return np.fromiter(map(index, map(get, f.evs)), dtype=np.int64, count=len(f.evs))
    except (TypeError, OverflowError):
        return None


def _threads(f: _Fields) -> tuple[np.ndarray, list]:
    """Each event's host thread as a code over its distinct (pid, tid) pairs, numbered in order
    of first appearance, and those pairs. pid and tid are coded apart and combined in numpy:
    hashing a tuple per event costs more than the rest of the chunk's columns. When both are
    integers throughout (typed chunks, nearly always) they are coded in numpy (np.unique)."""
    pid = _int_field(f, _PID) if f.typed else None
    tid = _int_field(f, _TID) if pid is not None else None
    if tid is not None:
        pids, pid = np.unique(pid, return_inverse=True)
        tids, tid = np.unique(tid, return_inverse=True)
        pids, tids = pids.tolist(), tids.tolist()
    else:
        pid, pids = f.codes(_PID, as_keys)
        tid, tids = f.codes(_TID, as_keys)
    pairs = pid.reshape(-1).astype(np.int64) * len(tids) + tid.reshape(-1)
    uniq, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    number = np.empty(len(uniq), dtype=np.int32)
    number[order] = np.arange(len(uniq), dtype=np.int32)
    pid_of, tid_of = list(pids), list(tids)
    keys = [(pid_of[u // len(tids)], tid_of[u % len(tids)]) for u in uniq[order].tolist()]
    return number[inverse.reshape(-1)], keys


_ID_COLUMNS = ("stream", "device", "correlation", "external_id")


def _id_columns(n: int, need: np.ndarray, raws: list, is_comm: np.ndarray, out: ChunkCols) -> dict:
    """The id columns (-1 but at the rows in need, whose args are raws), and out.comm_args.
    The ids are decoded as integers (schema.IdArgs) and the full Args only for the
    communication rows; if any row's ids are not plain integers, every row is read as Args."""
    ids = schema.decode_ids_many(raws)
    if ids is not None:
        try:
            # int64, then float64 as num_column reads numbers (the same rounding past 2**53)
            cols = {col: sparse_column(n, need, np.fromiter(map(attrgetter(col), ids), dtype=np.int64,
                                                            count=len(ids)).astype(np.float64))
                    for col in _ID_COLUMNS}
        except OverflowError:            # an integer past int64: num_column's way
            ids = None
    if ids is None:
        args = schema.decode_args_many(raws)
        cols = {col: sparse_column(n, need, list(map(attrgetter(col), args))) for col in _ID_COLUMNS}
        comm_rows, comm_args = need[is_comm].tolist(), compress(args, is_comm.tolist())
    else:
        comm_rows = need[is_comm].tolist()
        comm_args = schema.decode_args_many(list(compress(raws, is_comm.tolist())))
    out.comm_args = dict(zip(comm_rows, comm_args))
    return cols


def chunk_columns(chunk: list) -> ChunkCols:
    out = ChunkCols(names=[], threads=[], cols={}, comm_args={})
    typed = bool(chunk) and type(chunk[0]) in schema.PHASE_OF
    evs = _timed(chunk, out, typed)
    if not evs:
        return out
    f = _Fields(evs, typed)
    name_ids, codes = f.codes(_NAME, as_strings)
    sym = SymbolTable.of(codes)
    kind = _kinds(f.codes(_CAT, as_strings), name_ids, sym)
    gpu = np.isin(kind, GPU_ACTIVITY)
    comm = (kind == Kind.COMM) | host_comm_mask(name_ids, kind, sym)
    # Only these rows' args are read: GPU activity (stream, device, correlation), launches
    # (correlation) and communication (sizes, groups).
    needed = gpu | (kind == Kind.RUNTIME) | comm
    need = np.flatnonzero(needed)
    raws = list(map(_ARGS, compress(evs, needed.tolist())))
    n = len(evs)
    thread, keys = _threads(f)
    out.names, out.threads = sym.names, keys
    out.cols = dict(ts=f.floats(_TS), dur=f.floats(_DUR), name=name_ids, kind=kind, gpu=gpu, thread=thread,
                    **_id_columns(n, need, raws, comm[need], out))
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
