"""One chunk of events -> numpy columns; serially or across cores.

`chunk_columns` is a pure function of a decoded chunk with its own local symbol table, so
chunks can be processed in forked worker processes that share the file's bytes
(copy-on-write) and send back only arrays, their local names, and the args of the few
communication rows. The builder remaps local ids onto the rank's table.
"""
from __future__ import annotations

import atexit
import os
import pickle
import signal
from collections import Counter
from dataclasses import field
from itertools import chain, compress, repeat
from operator import attrgetter, eq, index
from typing import Iterator, Optional

import msgspec
import numpy as np

from . import schema
from .columns import distinct, sparse_column
from .commtable import host_comm_mask
from .errors import TraceError
from .gemms import gemm_shapes
from .memevents import chunk_memory
from .kinds import CATEGORY_KIND, GPU_ACTIVITY, KERNEL_CATEGORIES, Kind, kernel_kind
from .mapped import _address
from .read import release, workers  # noqa: F401 (workers re-exported)
from .symbols import SymbolTable
from ..record import record

# Field getters run in C over a whole chunk (map), not in a Python loop.
_NAME, _CAT, _TS, _DUR, _PH = (attrgetter(f) for f in ("name", "cat", "ts", "dur", "ph"))
_PID, _TID, _ARGS = attrgetter("pid"), attrgetter("tid"), attrgetter("args")
# Flow arrows and instants: links and marks, not time spent; nothing to report.
_LINK_PHASES = frozenset({"s", "t", "f", "i", "I"})
MIN_PARALLEL_CHUNKS = 4
UNREADABLE = "items of traceEvents that are no readable event (not an object, or a number out of range): skipped"


@record
class ChunkCols:
    """One chunk's events as columns, with its own local names and threads."""

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
        ids = distinct(name_ids[is_kernel])
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
_TOKEN = 4                    # bytes of one chunk's index in the pipe the workers take chunks from
# From this size of the events array a single trace is decoded ahead (decode_ahead): the fork
# and the results' pickling cost a few ms, a MB of events ~5 ms to decode.
AHEAD_MIN_BYTES = 1 << 20


def _work(array, start: int, stop: int) -> Optional[ChunkCols]:
    try:
        events = schema.decode_range(array, start, stop)
        release(array, start, stop)
        return chunk_columns(events)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError):
        return None                       # a cut inside an event: the caller decodes whole


def _taken(fd: int) -> Iterator[int]:
    """Chunk indices taken from the pipe fd until it is empty (its writing end is closed)."""
    while len(b := os.read(fd, _TOKEN)) == _TOKEN:      # a write of <= PIPE_BUF bytes is atomic
        yield int.from_bytes(b, "little")


def _serve(array, ranges: list, tokens: int, out: int, store: int) -> int:
    """A worker: decode the chunks it takes, pickling each (index, ChunkCols or None) as it is
    made into store (Spread._store: a file in memory, where the system has one), else, once all
    are done, into the pipe out; then close out, which tells the parent it is done. Into the
    pipe only at the end: the parent reads it only when it needs the results, and a full pipe
    would stop the decoding. Each result is let go as it is written, so the two processes
    together hold one copy of them. (A pipe and pickle, not multiprocessing's Connection:
    importing multiprocessing is ~7 ms before the fork, on the path of every single-file
    analysis.)"""
    try:
        if store >= 0:
            with os.fdopen(store, "wb", buffering=1 << 16, closefd=False) as f:
                for i in _taken(tokens):
                    pickle.dump((i, _work(array, *ranges[i])), f, protocol=pickle.HIGHEST_PROTOCOL)
            os.close(out)
            return 0
        done = {i: _work(array, *ranges[i]) for i in _taken(tokens)}
        with os.fdopen(out, "wb", buffering=1 << 16) as f:
            for i in list(done):
                pickle.dump((i, done.pop(i)), f, protocol=pickle.HIGHEST_PROTOCOL)
        return 0
    except BaseException:                 # the parent decodes what it did not get
        return 1


def _store() -> int:
    """A file in memory (memfd) a worker writes its results to as it makes them, while this
    process decodes its own chunks: read back at the end, ~1 ms, where the pipe took ~10 ms of a
    50 MB trace's results after the last chunk. -1 where the system has none (then the pipe)."""
    try:
        return os.memfd_create("diag-chunks", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return -1


def _gathered(f) -> Iterator[tuple]:
    """What a worker sent (f: its memfd read from the start, or the reading end of its pipe), up to
    its end or the worker's death: a result cut short by a worker's death is not one (the parent
    decodes that chunk itself)."""
    while True:
        try:
            yield pickle.load(f)          # our own worker's pickle (tests/test_robustness.py: the one exception)
        except Exception:                 # EOFError at the end; a truncated pickle where it died
            return


class Spread:
    """The chunks of one events array (ranges) decoded by forked worker processes and by this
    one. Their indices wait in a pipe; each worker takes the next until none is left and sends
    back what it made (arrays, local names, a few Args): written to a file in memory as it goes
    (_store), else through its pipe once done. results() has this process
    take chunks from the same pipe too, and then gathers the workers' (a chunk a dead worker
    took is decoded here). Started early (decode_ahead), the workers decode while this process
    imports the analysis; the workers share the file's bytes with it (copy-on-write)."""

    def __init__(self, array, ranges: list, n: int) -> None:
        self.array, self.ranges, self.workers = array, ranges, []
        self.tokens, w = os.pipe()
        os.set_blocking(w, False)
        self.left = []                    # indices the pipe had no room for: this process's
        for i in range(len(ranges)):
            try:
                os.write(w, i.to_bytes(_TOKEN, "little"))
            except BlockingIOError:
                self.left = list(range(i, len(ranges)))
                break
        os.close(w)                       # an empty pipe now reads as its end
        for _ in range(n):
            r, w = os.pipe()
            store = _store()
            pid = os.fork()
            if pid == 0:                  # the worker: never back into the caller's code
                code = 1
                try:
                    os.close(r)
                    for _, other, its in self.workers:
                        other.close()
                        if its >= 0:
                            os.close(its)
                    code = _serve(array, ranges, self.tokens, w, store)
                finally:
                    os._exit(code)
            os.close(w)
            self.workers.append((pid, os.fdopen(r, "rb", buffering=1 << 16), store))

    def results(self) -> list:
        """Every chunk's ChunkCols (None where a cut fell inside an event), in order."""
        done: dict = {}
        ok = False
        try:
            for i in chain(_taken(self.tokens), self.left):
                done[i] = _work(self.array, *self.ranges[i])
            for _, r, store in self.workers:
                if store < 0:
                    done.update(_gathered(r))
                    continue
                r.read()                  # its end: the worker is done, or dead
                os.lseek(store, 0, os.SEEK_SET)
                with os.fdopen(store, "rb", buffering=1 << 16, closefd=False) as f:
                    done.update(_gathered(f))
            ok = True
        finally:
            self.close(kill=not ok)
        return [done[i] if i in done else _work(self.array, *self.ranges[i]) for i in range(len(self.ranges))]

    def close(self, kill: bool = False) -> None:
        """Close the pipes and reap the workers (killed first with kill: their results unwanted)."""
        if self.tokens < 0:
            return
        os.close(self.tokens)
        self.tokens = -1
        for pid, r, store in self.workers:
            if kill:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            r.close()                     # a worker still sending gets EPIPE and ends
            os.waitpid(pid, 0)
            if store >= 0:
                os.close(store)
        self.workers = []


def forks() -> bool:
    """Whether a file's chunks may be decoded in forked workers here."""
    return workers() >= 2 and hasattr(os, "fork")


def _checked(results: list) -> Iterator[ChunkCols]:
    if any(r is None for r in results):
        raise schema.ChunkingError(0)
    return iter(results)


def parallel_chunks(array) -> Optional[Iterator[ChunkCols]]:
    """ChunkCols of every chunk, in order, decoded across the cores (Spread): the array decoded
    ahead (decode_ahead) when it was, else now; None if not worth it."""
    ahead = _claimed(array)
    if ahead is not None:
        return _checked(ahead.results())
    if not forks():
        return None
    ranges = schema.chunk_ranges(array) if len(memoryview(array)) > 2 * schema.CHUNK_BYTES else []
    if len(ranges) < MIN_PARALLEL_CHUNKS:
        return None
    return _checked(Spread(array, ranges, min(workers(), len(ranges)) - 1).results())


# --- ahead: a single trace's events decoded while the analysis is imported ------------------
_AHEAD: list = []                         # the Spread of the one trace decoded ahead


def decode_ahead(path: str, data) -> None:
    """Fork workers that decode the events of the trace whose bytes are data (read.read_file of
    path), while this process goes on (importing the analysis); parallel_chunks takes their
    results when the loader decodes the same bytes. Nothing is started where it does not pay
    (one core, no fork, a small file, every core busy: _idle_core) or the top level cannot be
    read: the loader then reads the file as before and reports what is wrong with it."""
    from .read import decode_trace

    if _AHEAD or not forks() or not _idle_core():
        return
    try:
        array = decode_trace(path, data).traceEvents
        ranges = schema.chunk_ranges(array) if len(memoryview(array)) >= AHEAD_MIN_BYTES else []
    except (TraceError, ValueError):
        return
    if ranges:
        _AHEAD.append(Spread(array, ranges, min(workers() - 1, len(ranges))))
        atexit.unregister(_cancel)              # once per process, however many files it decodes ahead
        atexit.register(_cancel)


LOADAVG = "/proc/loadavg"        # Linux: its fourth field is "runnable now/all" scheduling entities


def _idle_core() -> bool:
    """Whether a worker forked now would find a core to itself: DIAG_WORKERS, where set, says so;
    else whether the tasks runnable at this instant, less this process's own thread, leave a core
    free (LOADAVG's fourth field); where that cannot be read, whether the last minute's load
    average is below the usable cores. The instant count, not the average: a job that ended
    seconds ago (a training run, `make demo`) keeps the one-minute average above the cores for a
    minute, and the file was then decoded on one core, 30-45% slower, with the other idle. Where
    every core is busy, the worker adds its fork and copied pages (~0.03 CPU s) to a small file
    and takes off nothing."""
    if os.environ.get("DIAG_WORKERS"):
        return True
    try:
        with open(LOADAVG, "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        return running - 1 < workers()
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.getloadavg()[0] < workers()
    except OSError:
        return True


def _claimed(array) -> Optional[Spread]:
    """The Spread decoding array ahead, if any (taken once); one decoding other bytes is ended."""
    if not _AHEAD:
        return None
    spread = _AHEAD.pop()
    if (_address(spread.array), len(memoryview(spread.array))) == (_address(array), len(memoryview(array))):
        return spread
    spread.close(kill=True)
    return None


def _cancel() -> None:
    while _AHEAD:
        _AHEAD.pop().close(kill=True)
