"""Typed results of a Flight Recorder analysis, carried in Diagnosis.flight_recorder.

Schema in docs/schema.md ("flight_recorder"). Times are seconds, sizes bytes; a fact the dumps
do not carry is null, with the reason in the `unknown` fields, never a zero.
"""
from __future__ import annotations

from dataclasses import field
from typing import Optional

from ..record import record


@record
class FRWaiter:
    """A rank waiting in a collective, and since when."""

    rank: int
    since_ns: int                     # host clock (ns since the epoch) when it entered the collective


@record
class FRGroup:
    """Where one process group stands: the collective every member entered last, and the next."""

    pg: str                           # the process group's name in the dumps
    desc: str                         # its description (mesh_dp, default_pg, ...)
    axis: str                         # the parallel axis (layout), "world" (the default group) or "unknown"
    ranks: list[int]                  # members
    last_common_seq: Optional[int]    # the last collective every dumped member entered
    next_seq: Optional[int] = None    # the first collective not every member entered; None: all in step
    next_op: Optional[str] = None
    next_bytes: Optional[int] = None  # its message size (nccl-tests S), when sizes and dtype are known
    missing: list[int] = field(default_factory=list)      # members that never entered next_seq
    waiting: list[FRWaiter] = field(default_factory=list)  # members inside it, waiting
    mismatch_seq: Optional[int] = None                    # the first collective entered with different op/size
    mismatch: Optional[str] = None
    undumped: list[int] = field(default_factory=list)     # members without a dump: their state is unknown
    blocked: list[int] = field(default_factory=list)      # missing members that wait in another group's collective
    maybe_waiting: list[FRWaiter] = field(default_factory=list)  # with undumped members: dumped ones inside their last entry
    not_completed: list[int] = field(default_factory=list)  # all entered next_seq; these never completed it (NCCL states)
    verdict: str = ""                 # the one line a person acts on

    @property
    def stuck(self) -> bool:
        return bool(self.missing) or self.mismatch is not None or bool(self.not_completed)


@record
class FRP2P:
    """A point-to-point pair (group, sender, receiver) whose sends and recvs do not match: one side
    posted an op the other never entered (matched in order per pair, as fr_trace does)."""

    pg: str
    desc: str
    axis: str                         # the group's axis (pp, ...), "world" or "unknown"
    ranks: list[int]                  # the group's members ([] unknown)
    src: int                          # sender (global rank)
    dst: int                          # receiver
    posted: int                       # the rank that entered the unmatched op
    absent: int                       # the peer that never entered its match
    op: str                           # send | recv: the op `posted` entered
    seq: int                          # its p2p_seq_id (per rank and group, every p2p op counted)
    bytes: Optional[int]
    since_ns: int                     # when `posted` entered it
    state: str
    waiting: list[FRWaiter] = field(default_factory=list)  # `posted`, unless its dump says the op completed
    matched: int = 0                  # the pair's ops matched before it
    blocked: bool = False             # `absent` itself waits in another collective or p2p op
    verdict: str = ""

    @property
    def stuck(self) -> bool:
        return True


@record
class FROpTiming:
    """One axis × collective over the whole buffer, instances matched across their group."""

    axis: str
    op: str
    group_size: int
    instances: int                    # matched across every member of their group
    median_bytes: Optional[float]
    transfer_median_s: Optional[float]   # the shortest member's duration (the others waited), median
    transfer_p95_s: Optional[float]
    wait_median_s: Optional[float]    # per member, its duration's excess over the transfer
    busbw_median_gbps: Optional[float]   # nccl-tests busbw on the transfer time, GB/s
    unknown: Optional[str] = None     # why durations / busbw are null


@record
class FRLate:
    """A rank the others wait for, and since when: a slowdown the profiler window may not show."""

    rank: int
    since_ns: int                     # start of the first window in which it is late
    until_ns: Optional[int]           # end of the last such window; None: late to the end of the buffer
    waited_before_ms_per_s: float     # others' wait for it per second of run, before `since`
    waited_after_ms_per_s: float      # ... from `since` to `until`
    evidence: str


@record
class FlightRecord:
    """What the Flight Recorder dumps of a job show."""

    files: list[str]
    ranks: list[int]                  # ranks with a readable dump
    entries: int
    first_ns: Optional[int]           # the buffers' time range (host clock)
    last_ns: Optional[int]
    layout: Optional[str] = None      # how the groups were named by axis
    world_size: Optional[int] = None  # from pg_config; else the highest rank dumped + 1 (a lower bound)
    world_known: bool = False         # world_size from the default group's members in pg_config
    undumped: list[int] = field(default_factory=list)     # ranks below world_size without a readable dump
    backend: Optional[str] = None     # nccl / gloo, from the entries' profiling names
    groups: list[FRGroup] = field(default_factory=list)   # the cause first, then the groups stuck behind it
    p2p: list[FRP2P] = field(default_factory=list)        # unmatched point-to-point pairs
    cause: list[int] = field(default_factory=list)        # ranks others wait for that wait for nobody
    cause_last: list[str] = field(default_factory=list)   # each cause rank's latest entry, in words
    timings: list[FROpTiming] = field(default_factory=list)
    late: list[FRLate] = field(default_factory=list)
    late_basis: str = ""              # how lateness was measured
    late_unknown: Optional[str] = None
    late_window_s: Optional[float] = None   # the windows' length (the buffer after each group's first collective / 8)
    notes: list[str] = field(default_factory=list)
    # why and when the dumps were taken (the trainer records it; torch's own dumps do not)
    taken: Optional[str] = None       # 'SIGUSR1 at 04:13:52 UTC', 'end at ...', 'failure at ... (rank 0), SIGTERM ...'
    verdict_kind: str = "hang"        # hang | snapshot (on request or at the end, waits under the timeout)
    longest_wait_s: Optional[float] = None   # the longest a waiting rank had waited when its dump was taken
    wait_is_lower_bound: bool = False        # ... measured to the buffers' last entry (no dump time recorded)
    timeout_s: Optional[float] = None        # the process groups' timeout the waited entries record

    @property
    def hangs(self) -> list:
        """The stuck groups and the unmatched point-to-point pairs, each with its verdict."""
        stuck = [g for g in self.groups if g.stuck]
        pairs = sorted(self.p2p, key=lambda x: (x.blocked, not x.waiting))
        return [g for g in stuck if g.missing and not g.blocked] + [x for x in pairs if not x.blocked] \
            + [g for g in stuck if not (g.missing and not g.blocked)] + [x for x in pairs if x.blocked]
