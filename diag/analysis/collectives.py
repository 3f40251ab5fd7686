"""Every communication op of every rank, with its size, group, parallel axis and timing.

Per rank, one row per op instance on the rank's timeline: GPU communication kernels on
GPU traces; `gloo:*` transfer spans (or the trainer's `diag:comm:*` labels) on CPU-only
traces. What an op is comes from the best source present, in this order: the kernel's own
NCCL args; the host ops that launched it (`record_param_comms` args, `c10d::*` names,
`Input Dims`); the trainer's `diag:comm:<axis>:<op>:<bytes>` label. A gloo transfer takes the
name and sizes of the c10d op that issued it (analysis.gloowork: gloo runs a reduce-scatter as
an all-reduce), and its exposure counts the time its issuer blocked waiting for it
(`wait_tensor`), which may begin before the transfer starts and end after it. Missing facts stay
unknown (-1 / 0), never guessed.
"""
from __future__ import annotations

from dataclasses import field
from typing import Optional

import numpy as np

from ..layout import AXES, UNKNOWN as AXIS_UNKNOWN, axis_index, axis_of_desc
from ..trace.kinds import Coll, Kind, coll_from_arg
from ..trace.table import RankTrace
from . import intervals as iv
from .bandwidth import message_bytes
from .gloowork import GlooWork, comm_column, link
from .hostlink import C10D_RE, LABEL_RE, enclosing, launches
from .steps import Window
from ..record import record
from ..runmeta import MAX_RANKS


@record
class RankComms:
    """One rank's communication instances (columnar)."""

    rank: int
    coll: np.ndarray        # int8 Coll
    axis: np.ndarray        # int8 index into AXES, -1 unknown
    group: list             # member-rank key "0,1,2" or None, per instance
    group_size: np.ndarray  # int32, 0 unknown
    nbytes: np.ndarray      # int64 message size S (nccl-tests convention), -1 unknown
    start_ns: np.ndarray    # on this rank's clock
    dur_ns: np.ndarray
    exposed_ns: np.ndarray  # part not hidden behind compute
    step: np.ndarray        # step index, -1 outside steps
    compute: iv.Intervals = iv.EMPTY   # the rank's compute timeline, to measure exposure of any subset
    # gloo transfers (analysis.gloowork), empty or -1 elsewhere: the worker thread it ran on, its
    # own (op, elements) as SIG_OPS * elements + op (what every member of its group runs), whether
    # FSDP issued it, and [blocked_lo, blocked_hi): its issuer blocked waiting for it (lo == hi none)
    lane: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    sig: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    fsdp: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    blocked_lo: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    blocked_hi: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # [issued_lo, issued_hi): the call on the issuing thread that issued it (lo == hi none)
    issued_lo: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    issued_hi: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # [wrapped_lo, wrapped_hi): DTensor's funcol wrapping that call's output (lo == hi none)
    wrapped_lo: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    wrapped_hi: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # the trace file's ts (us) of start_ns 0: maps these times back onto the rank's own file
    clock0_us: float = 0.0
    # per instance, the id of its match across its group (analysis.matching), set by the job-level
    # merge (diagnose); empty until then, -1 unmatched
    match_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return int(self.coll.size)

    def windows(self, sel=slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi), one row per selected instance: its span, the time its issuer blocked waiting
        for it, the call that issued it and the wrap of that call's output (empty windows where
        there is none)."""
        lo, hi = [self.start_ns[sel]], [self.start_ns[sel] + self.dur_ns[sel]]
        for a, b in ((self.blocked_lo, self.blocked_hi), (self.issued_lo, self.issued_hi),
                     (self.wrapped_lo, self.wrapped_hi)):
            if a.size:
                lo.append(a[sel])
                hi.append(b[sel])
        return np.stack(lo, axis=1), np.stack(hi, axis=1)

    def timeline(self, sel=slice(None), part=slice(None)) -> iv.Intervals:
        """The communication timeline of the selected instances: their spans, the time their
        issuer blocked waiting for them, and the calls that issued them (part: the windows'
        columns, e.g. CALLS: only where the issuing thread itself is in communication)."""
        lo, hi = (x[:, part].ravel() for x in self.windows(sel))
        keep = hi > lo
        return iv.merge(lo[keep], hi[keep])

    def exposed(self) -> iv.Intervals:
        """Where this rank's communication is not hidden behind its compute (exposed comm)."""
        return iv.subtract(self.timeline(), self.compute)


SIG_OPS = 16        # Coll values fit below it
SPANS, CALLS = slice(0, 1), slice(1, None)    # RankComms.windows' columns: transfer spans; the issuer's calls


def _label_info(t, label_rows: np.ndarray):
    axis = np.full(label_rows.size, AXIS_UNKNOWN, dtype=np.int8)
    coll = np.zeros(label_rows.size, dtype=np.int8)
    nbytes = np.full(label_rows.size, -1, dtype=np.int64)
    for i, r in enumerate(label_rows):
        if r < 0:
            continue
        m = LABEL_RE.match(t.name(r))
        if m:
            axis[i], coll[i], nbytes[i] = axis_index(m.group(1)), coll_from_arg(m.group(2)), int(m.group(3))
    return axis, coll, nbytes


def _comm_args(rt: RankTrace) -> dict[int, int]:
    """event row -> CommTable index."""
    return {int(r): i for i, r in enumerate(rt.comms.row)}


def _facts(rt: RankTrace, rows: np.ndarray, dtype_bytes: Optional[np.ndarray] = None):
    """(coll, group key, group size, bytes) of rows from their own CommTable args; dtype_bytes,
    where > 0, the element size to use (a c10d op on a tensor list records no dtype)."""
    c, by_row, sym = rt.comms, _comm_args(rt), rt.events.symbols
    coll = np.zeros(rows.size, np.int8)
    size = np.zeros(rows.size, np.int32)
    nbytes = np.full(rows.size, -1, np.int64)
    group: list = [None] * rows.size
    for i, r in enumerate(rows):
        j = by_row.get(int(r))
        if j is None:
            continue
        coll[i], size[i] = c.coll[j], c.group_size[j]
        group[i] = sym[int(c.group[j])] if c.group[j] >= 0 else None
        if not size[i] and group[i]:
            size[i] = group[i].count(",") + 1
        elem = int(dtype_bytes[i]) if dtype_bytes is not None and dtype_bytes[i] > 0 else int(c.dtype_bytes[j])
        b = message_bytes(Coll(int(c.coll[j])), int(c.in_nelems[j]), int(c.out_nelems[j]), elem, int(size[i]))
        nbytes[i] = -1 if b is None else b
    return coll, group, size, nbytes


def _fill_named(axis: np.ndarray, rt: RankTrace, rows: np.ndarray) -> None:
    """Ops of unknown axis take the one their own process group's description names (this rank's
    pg_config, by the op's "Process Group Name" at its row; -1: no row). Groups with the same
    members can be different axes (CP and the DP x CP group at DP 1; DP and DP x CP at CP 1): the
    members cannot tell them apart, the op's group name can."""
    by_name = {str(pg.get("pg_name")): axis_of_desc(pg.get("pg_desc")) for pg in rt.pg_config if isinstance(pg, dict)}
    todo = np.flatnonzero((axis == AXIS_UNKNOWN) & (rows >= 0))
    if not todo.size or not any(by_name.values()):
        return
    sym = rt.events.symbols
    for i, pg in zip(todo, comm_column(rt.comms.row, rt.comms.pg, rows[todo]).tolist()):
        if pg >= 0 and (named := by_name.get(sym[pg])):
            axis[i] = axis_index(named)


def _fill(dst_coll, dst_group, dst_size, dst_bytes, src, prefer_coll=False):
    coll, group, size, nbytes = src
    take = (dst_coll == Coll.UNKNOWN) | (prefer_coll & (coll != Coll.UNKNOWN))
    dst_coll[take] = coll[take]
    for i, g in enumerate(group):
        if dst_group[i] is None and g is not None:
            dst_group[i] = g
    dst_size[dst_size == 0] = size[dst_size == 0]
    dst_bytes[dst_bytes < 0] = nbytes[dst_bytes < 0]


def gpu_comms(rt: RankTrace, w: Window, compute: iv.Intervals) -> RankComms:
    t = rt.events
    sel = t.kind[w.rows] == Kind.COMM
    rows, step = w.rows[sel], w.step_index[sel]
    coll, group, size, nbytes = _facts(rt, rows)
    lts, lth = launches(t, rows)
    # The launching host ops fill what the kernel's args do not say. A host op's name
    # (c10d::alltoall_base_) beats the kernel's (SendRecv implements all-to-all).
    hosts = [enclosing(t, lts, lth, pred) for pred in (lambda s: s == "record_param_comms", C10D_RE.match)]
    for host, prefer in zip(hosts, (False, True)):
        _fill(coll, group, size, nbytes, _masked(_facts(rt, np.maximum(host, 0)), host >= 0), prefer_coll=prefer)
    label = enclosing(t, lts, lth, LABEL_RE.match, kinds=(Kind.ANNOTATION,))
    axis, lcoll, lbytes = _label_info(t, label)
    coll[coll == Coll.UNKNOWN] = lcoll[coll == Coll.UNKNOWN]
    nbytes[nbytes < 0] = lbytes[nbytes < 0]
    named = _fill_batches(rt, lts, lth, coll, group, size, nbytes, axis)
    for named_at in [rows] + hosts + [named]:   # the kernel's group name, its launching op's, its parts'
        _fill_named(axis, rt, named_at)
    rc = _finish(rt.rank, t, rows, step, coll, axis, group, size, nbytes, compute)
    implied_group_size(rc, rt.pg_config)
    return rc


def _batch_parts(t, lts: np.ndarray, lth: np.ndarray) -> list:
    """For each kernel launched inside `nccl:coalesced`, the `record_param_comms` rows of the
    batch's parts, else ().

    NCCL runs a batch (pipelining's sends and receives through batch_isend_irecv, a coalesced
    collective) as one kernel, launched when the batch closes: `nccl:coalesced` carries no args
    and neither does the kernel (`ncclDevKernel_SendRecv`, torch 2.11 + NCCL 2.28). torch records
    each part as it is issued, with its group and size, and launches nothing: the batch's parts are
    the `record_param_comms` rows on its thread after both the previous batch's close and the
    thread's last communication kernel launch."""
    out: list = [()] * lts.size
    is_batch = lambda s: s == "nccl:coalesced"   # noqa: E731
    batch = enclosing(t, lts, lth, is_batch)
    if not (batch >= 0).any():
        return out
    rpc = np.flatnonzero(t.name_mask(lambda s: s == "record_param_comms") & t.mask(Kind.CPU_OP))
    cts, cth = launches(t, np.flatnonzero(t.kind == Kind.COMM))     # every comm kernel's launch
    closes = np.flatnonzero(t.name_mask(is_batch) & t.mask(Kind.CPU_OP, Kind.ANNOTATION))
    for i in np.flatnonzero(batch >= 0):
        th, start = t.thread[batch[i]], t.ts_ns[batch[i]]
        prev = closes[(t.thread[closes] == th) & (t.ts_ns[closes] < start)]
        launched = cts[(cth == th) & (cts >= 0) & (cts < start)]
        since = max((t.ts_ns[prev] + t.dur_ns[prev]).max() if prev.size else np.iinfo(np.int64).min,
                    launched.max() if launched.size else np.iinfo(np.int64).min)
        out[i] = rpc[(t.thread[rpc] == th) & (t.ts_ns[rpc] > since) & (t.ts_ns[rpc] < start)]
    return out


def _fill_batches(rt: RankTrace, lts, lth, coll, group, size, nbytes, axis) -> np.ndarray:
    """A batch's kernel takes what its parts agree on (`_batch_parts`): the op (send and
    receive: SEND_RECV), the group, the axis of the trainer's labels around them; its size is
    what it moves each way (the larger of the sends' and the receives' sums). Returns, per
    kernel, a part's row for `_fill_named` where all parts name one group (else -1)."""
    t = rt.events
    named = np.full(lts.size, -1, np.int64)
    for i, parts in enumerate(_batch_parts(t, lts, lth)):
        if not len(parts):
            continue
        pc, pg, psize, pbytes = _facts(rt, np.asarray(parts))
        ok = pc != Coll.UNKNOWN                     # not a part: a `wait` (record_param_comms too)
        if not ok.any():
            continue
        parts, pc, psize, pbytes = np.asarray(parts)[ok], pc[ok], psize[ok], pbytes[ok]
        pg = [g for g, k in zip(pg, ok) if k]
        ops = set(pc.tolist())
        if coll[i] == Coll.UNKNOWN and len(ops) == 1:
            coll[i] = pc[0]
        elif coll[i] == Coll.UNKNOWN and ops <= {Coll.SEND, Coll.RECV}:
            coll[i] = Coll.SEND_RECV
        groups = set(pg)
        if len(groups) == 1 and None not in groups:
            group[i] = group[i] or pg[0]
            size[i] = size[i] or psize[0]
            named[i] = parts[0]
        if nbytes[i] < 0 and (pbytes >= 0).all():
            if ops <= {Coll.SEND, Coll.RECV}:
                nbytes[i] = max(int(pbytes[pc == Coll.SEND].sum()), int(pbytes[pc == Coll.RECV].sum()))
            else:
                nbytes[i] = int(pbytes.sum())
        if axis[i] == AXIS_UNKNOWN:
            pts = np.asarray(parts)
            laxis = set(_label_info(t, enclosing(t, t.ts_ns[pts], t.thread[pts], LABEL_RE.match,
                                                 kinds=(Kind.ANNOTATION,)))[0].tolist())
            if len(laxis) == 1:
                axis[i] = laxis.pop()
    return named


def _masked(facts, ok: np.ndarray):
    coll, group, size, nbytes = facts
    return (np.where(ok, coll, 0).astype(np.int8), [g if k else None for g, k in zip(group, ok)],
            np.where(ok, size, 0).astype(np.int32), np.where(ok, nbytes, -1))


def host_comms(rt: RankTrace, w: Window, compute: iv.Intervals) -> RankComms:
    """CPU-only traces: transfers are `gloo:*` spans on worker threads, or trainer labels."""
    t = rt.events
    gloo = t.name_mask(lambda s: s.startswith("gloo:"))[w.rows]
    labels = t.name_mask(LABEL_RE.match)[w.rows]
    pick = np.flatnonzero(gloo if gloo.any() else labels if labels.any() else t.name_mask(C10D_RE.match)[w.rows])
    pick = pick[np.argsort(t.ts_ns[w.rows[pick]], kind="stable")]      # a group's order: by start
    rows, step = w.rows[pick], w.step_index[pick]
    coll, group, size, nbytes = _facts(rt, rows)
    work = sig = None
    if gloo.any():
        work = link(rt, w.rows, rows)
        nelems = comm_column(rt.comms.row, rt.comms.in_nelems, rows)
        sig = np.where(nelems >= 0, nelems * SIG_OPS + coll, -1)    # the transfer's own, for matching
        _take_issuer(rt, rows, work, coll, nbytes)   # before the labels: they name the issued op
    if gloo.any() and labels.any():
        axis = _pair_with_labels(t, rows, coll, nbytes, w.rows[labels])
    else:
        axis, lcoll, lbytes = _label_info(t, np.where(labels[pick], rows, -1))
        coll[coll == Coll.UNKNOWN] = lcoll[coll == Coll.UNKNOWN]
        nbytes[nbytes < 0] = lbytes[nbytes < 0]
    _fill_named(axis, rt, rows)
    rc = _finish(rt.rank, t, rows, step, coll, axis, group, size, nbytes, compute, work, sig)
    implied_group_size(rc, rt.pg_config)
    return rc


def _take_issuer(rt: RankTrace, rows: np.ndarray, work: GlooWork, coll, nbytes) -> None:
    """A transfer paired with the c10d op that issued it takes that op's name and sizes (in the
    transfer's element size): gloo runs `_reduce_scatter_base_` as `gloo:all_reduce`."""
    ok = work.issuer >= 0
    if not ok.any():
        return
    elem = comm_column(rt.comms.row, rt.comms.dtype_bytes, rows)
    icoll, _, _, ibytes = _facts(rt, np.maximum(work.issuer, 0), elem)
    coll[ok & (icoll != Coll.UNKNOWN)] = icoll[ok & (icoll != Coll.UNKNOWN)]
    nbytes[ok & (ibytes >= 0)] = ibytes[ok & (ibytes >= 0)]


def _pair_with_labels(t, rows, coll, nbytes, label_rows) -> np.ndarray:
    """Axis of each gloo transfer span from the trainer's labels.

    gloo runs the transfer on a worker thread, away from the `diag:comm` label on the main
    thread. A process group executes its ops in the order they were issued, so the k-th
    transfer of a given (op, bytes) belongs to the k-th label of that (op, bytes).
    """
    l_axis, l_coll, l_bytes = _label_info(t, label_rows[np.argsort(t.ts_ns[label_rows], kind="stable")])
    queues: dict = {}
    for a, c, b in zip(l_axis.tolist(), l_coll.tolist(), l_bytes.tolist()):
        queues.setdefault((c, b), []).append(a)
    axis = np.full(rows.size, AXIS_UNKNOWN, dtype=np.int8)
    taken: dict = {}
    for i in np.argsort(t.ts_ns[rows], kind="stable"):
        key = (int(coll[i]), int(nbytes[i]))
        q, k = queues.get(key, []), taken.get(key, 0)
        if k < len(q):
            axis[i], taken[key] = q[k], k + 1
    return axis


def _finish(rank, t, rows, step, coll, axis, group, size, nbytes, compute,
            work: Optional[GlooWork] = None, sig: Optional[np.ndarray] = None) -> RankComms:
    n = rows.size
    rc = RankComms(rank=int(rank) if rank is not None else -1, coll=coll.astype(np.int8), axis=axis.astype(np.int8),
                   group=group, group_size=size.astype(np.int32), nbytes=nbytes.astype(np.int64),
                   start_ns=t.ts_ns[rows], dur_ns=t.dur_ns[rows], exposed_ns=np.zeros(n, np.int64),
                   step=step.astype(np.int64), compute=compute,
                   lane=work.lane if work else np.full(n, -1, np.int32),
                   sig=sig.astype(np.int64) if sig is not None else np.full(n, -1, np.int64),
                   fsdp=work.fsdp if work else np.zeros(n, bool),
                   blocked_lo=work.blocked_lo if work else np.zeros(n, np.int64),
                   blocked_hi=work.blocked_hi if work else np.zeros(n, np.int64),
                   issued_lo=work.issued_lo if work else np.zeros(n, np.int64),
                   issued_hi=work.issued_hi if work else np.zeros(n, np.int64),
                   wrapped_lo=work.wrapped_lo if work else np.zeros(n, np.int64),
                   wrapped_hi=work.wrapped_hi if work else np.zeros(n, np.int64), clock0_us=float(t.t0_us))
    rc.exposed_ns = _exposed_each(rc)
    return rc


def implied_group_size(rc: RankComms, pg_config: list) -> None:
    """When every process group of the job has the same size, an unnamed group has it too. A group whose
    pg_size is not a size (missing, not an integer, or out of MAX_RANKS: a damaged trace's) leaves it
    unknown."""
    sizes = [pg.get("pg_size") for pg in pg_config if isinstance(pg, dict)]
    if sizes and all(type(x) is int and 1 <= x <= MAX_RANKS for x in sizes) and len(set(sizes)) == 1:
        rc.group_size[rc.group_size == 0] = sizes[0]


def _exposed_each(rc: RankComms) -> np.ndarray:
    """Per instance: the part of its windows (span, its issuer's wait on it, the issuing call) not
    under compute, each instant counted once (windows clipped to where the earlier ones reach)."""
    if not len(rc):
        return np.zeros(0, np.int64)
    exposed = rc.exposed()
    lo, hi = rc.windows()
    order = np.argsort(lo, axis=1, kind="stable")
    lo, hi = np.take_along_axis(lo, order, 1), np.take_along_axis(hi, order, 1)
    reach = np.maximum.accumulate(hi, axis=1)
    a = np.maximum(lo, np.concatenate([lo[:, :1], reach[:, :-1]], axis=1))
    b = np.maximum(hi, a)
    return sum(iv.lengths_in_windows(exposed, a[:, j], b[:, j]) for j in range(lo.shape[1]))


def attribute_axes(rc: RankComms, jl) -> None:
    """With the job's layout (analysis.layoutfind.JobLayout): an op's axis from its group's name or
    member ranks, and a labelled op's group from its axis."""
    if jl is None:
        return
    whole = jl.world_axis
    if whole is not None:      # no group named: with one axis spanning the world, the op ran in it
        none = [i for i, g in enumerate(rc.group) if g is None and rc.axis[i] == AXIS_UNKNOWN
                and rc.coll[i] not in (Coll.SEND, Coll.RECV, Coll.SEND_RECV)]
        rc.axis[none] = axis_index(whole)
    for i, g in enumerate(rc.group):
        if rc.axis[i] == AXIS_UNKNOWN and g is not None:
            rc.axis[i] = jl.axis_of(g)
        elif g is None and rc.axis[i] != AXIS_UNKNOWN and rc.coll[i] != Coll.SEND_RECV:
            found = jl.group_of(rc.rank, AXES[rc.axis[i]])
            if found:
                rc.group[i], rc.group_size[i] = found
