"""Columnar per-rank event tables: the one data structure every analysis reads.

One row per complete ("X") event. Times are int64 nanoseconds relative to `t0_us`
(the trace's first timestamp), so interval arithmetic is exact integer math. Names
are interned ids into a SymbolTable. Communication details live in a separate,
much smaller CommTable keyed by row index, because only a few events carry them.
"""
from __future__ import annotations

from dataclasses import field
from functools import cached_property
from typing import Any, Optional

import numpy as np

from .kinds import GPU_ACTIVITY, Kind
from .memevents import MemoryEvents
from .symbols import SymbolTable
from ..record import record


FEW_NAMES = 6       # name_mask: up to this many matching names, a comparison per name beats a look-up per row


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@record
class EventTable:
    """One rank's events as columns (one row per event)."""

    ts_ns: np.ndarray          # int64, start relative to t0_us
    dur_ns: np.ndarray         # int64, >= 0
    kind: np.ndarray           # int8, Kind
    name_id: np.ndarray        # int32, into symbols
    thread: np.ndarray         # int32: host thread index, or GPU stream (see is_gpu)
    device: np.ndarray         # int32: GPU device (or the pid Kineto gives it), -1 on host events
    correlation: np.ndarray    # int64: launch <-> kernel link, -1 when absent
    external_id: np.ndarray    # int64: op <-> launch link, -1 when absent
    symbols: SymbolTable
    t0_us: float = 0.0

    def __len__(self) -> int:
        return int(self.ts_ns.shape[0])

    @cached_property
    def end_ns(self) -> np.ndarray:
        """ts_ns + dur_ns, made once (a rank pass reads it ~60 times) and read-only: the columns
        are never changed after the load."""
        return _frozen(self.ts_ns + self.dur_ns)

    def mask(self, *kinds: Kind) -> np.ndarray:
        """Rows of these kinds; each set of kinds made once per table (a rank pass asks for
        the same few ~15 times), read-only."""
        masks = self.__dict__.setdefault("_masks", {})
        got = masks.get(kinds)
        if got is None:
            got = masks[kinds] = _frozen(np.isin(self.kind, np.asarray(kinds, dtype=np.int8)))
        return got

    def gpu_mask(self) -> np.ndarray:
        return self.mask(*GPU_ACTIVITY)

    def take(self, rows: np.ndarray) -> "EventTable":
        """A table of the given rows only."""
        cols = {k: getattr(self, k)[rows] for k in ("ts_ns", "dur_ns", "kind", "name_id", "thread", "device",
                                                     "correlation", "external_id")}
        return EventTable(**cols, symbols=self.symbols, t0_us=self.t0_us)

    def name(self, row: int) -> str:
        return self.symbols[int(self.name_id[row])]

    @cached_property
    def launch_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(correlation ids, rows) of the runtime rows that carry one (the launches), sorted by
        id: made once per table, where each look-up of kernels' launches (analysis.hostlink) sorted
        them again, eight times a rank pass. The columns are never changed after the load."""
        rows = np.flatnonzero((self.kind == Kind.RUNTIME) & (self.correlation >= 0))
        order = np.argsort(self.correlation[rows], kind="stable")
        return self.correlation[rows][order], rows[order]

    def name_mask(self, predicate) -> np.ndarray:
        """Rows whose name satisfies predicate; evaluated once per distinct name."""
        hits = np.fromiter(map(predicate, self.symbols.names), dtype=bool, count=len(self.symbols))  # truth, as bool()
        ids = np.flatnonzero(hits)
        if ids.size > FEW_NAMES:
            return np.take(hits, self.name_id)            # a look-up per row (take: ~0.6x of hits[...])
        out = np.zeros(len(self), dtype=bool)             # a few names (the usual case): a compare each, ~0.15x
        for i in ids.tolist():
            out |= self.name_id == i
        return out


@record
class CommTable:
    """Communication events as the trace describes them: GPU comm kernels, and the host spans
    that describe communication (record_param_comms, c10d::*, gloo:*, nccl:*, diag:comm:*)."""

    row: np.ndarray            # int64 row in the EventTable
    coll: np.ndarray           # int8, Coll
    pg: np.ndarray             # int32, interned process-group name, -1 unknown
    group: np.ndarray          # int32, interned sorted member ranks "0,1,2", -1 unknown
    group_size: np.ndarray     # int32, 0 unknown
    in_nelems: np.ndarray      # int64, -1 unknown
    out_nelems: np.ndarray     # int64, -1 unknown
    dtype_bytes: np.ndarray    # int8, 0 unknown
    seq: np.ndarray            # int64, -1 unknown
    peer: Optional[np.ndarray] = None   # int32, a send/recv's peer within its group, -1 unknown

    def __len__(self) -> int:
        return int(self.row.shape[0])


@record
class RankTrace:
    """One rank's trace: where it came from, what it says about the job, and its events."""

    path: str
    rank: Optional[int]                 # from distributedInfo; None when the trace lacks it
    world_size: Optional[int]
    backend: Optional[str]
    events: EventTable
    comms: CommTable
    pg_config: list = field(default_factory=list)
    devices: list = field(default_factory=list)   # deviceProperties entries
    trace_id: Optional[str] = None
    start_epoch_us: Optional[float] = None        # best estimate of wall-clock start
    start_epoch_ns: Optional[int] = None          # the same in integer ns (build._epoch_ns): the host's clock
                                                  # to the nanosecond, for transfers timed across ranks
    host: Optional[str] = None                    # the header's host_name (Kineto since 2024)
    thread_names: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)   # phase/problem -> count
    meta: dict[str, Any] = field(default_factory=dict)
    gemms: dict = field(default_factory=dict)     # (GEMM op, input dims) -> count (trace.gemms)
    memory: MemoryEvents = field(default_factory=MemoryEvents)   # `[memory]` instants (trace.memevents)

    @property
    def has_gpu(self) -> bool:
        return bool(np.any(self.events.gpu_mask()))
