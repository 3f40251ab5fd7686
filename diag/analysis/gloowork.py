"""What each gloo transfer of one rank was, from the host ops that issued and awaited it.

gloo runs a collective on a worker thread of its process group (`pt_gloo_runloop`, two per
group) as a `gloo:<op>` span that names neither the group nor the op the program asked for: a
reduce-scatter runs as `gloo:all_reduce` of the whole input. The thread that asked for it (the
issuer: it runs `c10d::*` ops, with their arguments' shapes) says what it was, and for DTensor's
functional collectives, where it then blocked in `_c10d_functional::wait_tensor`. Per rank:

- issuer: a process group runs its ops in the order they were issued, so of the issued ops and
  the worker transfers of one element count, the k-th transfer ran the k-th op. A count whose
  pairing would have a transfer start before its op was issued is left unpaired;
- wait: `wait_tensor` waits on the output of a functional collective issued before it. Of the
  waits and the functional collectives whose output has N elements, a wait is on the first one
  not yet waited on; when every one issued so far has been, it waits again on the last (DTensor
  may wait twice on one tensor: the second returns at once);
- lane: the worker thread the transfer ran on; its process group is found across ranks
  (analysis.gloogroups), since a worker thread serves one group;
- FSDP: issued by FSDP itself (under its annotations, `FSDP::all_gather`, and not through a
  functional collective: its hooks run DTensor's redistributions too), so it ran in a group FSDP
  shards or replicates over: a data-parallel one.
"""
from __future__ import annotations

import re

import numpy as np

from ..trace.columns import distinct
from ..trace.commtable import P2P_OPS
from ..trace.kinds import Kind
from ..trace.table import RankTrace
from .hostlink import enclosing
from ..record import record

ISSUE_RE = re.compile(r"^c10d::")
FUNCOL_RE = re.compile(r"^_?c10d_functional(_autograd)?::(?!wait_tensor|_wrap)")
WAIT_RE = re.compile(r"^_?c10d_functional(_autograd)?::wait_tensor$")
WRAP_RE = re.compile(r"^_?c10d_functional(_autograd)?::_wrap_tensor_autograd$")
FSDP_RE = re.compile(r"^(FSDP::|FullyShardedDataParallel\.)")
REWAIT_NS = 100_000   # a second wait on one tensor this soon after the first is the same blocking


@record
class GlooWork:
    """Per transfer row (in the order given): what the issuing thread says of it."""

    lane: np.ndarray         # int32 host thread of the worker that ran it; -1 ran on its issuer's thread
    issuer: np.ndarray       # int64 row of the c10d op that issued it; -1 not paired
    fsdp: np.ndarray         # bool: issued under an FSDP annotation
    blocked_lo: np.ndarray   # int64 [lo, hi): the issuer blocked in wait_tensor on it; lo == hi none
    blocked_hi: np.ndarray
    issued_lo: np.ndarray    # int64 [lo, hi): the call that issued it (a functional collective, else the
    issued_hi: np.ndarray    # c10d op), where the issuing thread is in communication too; lo == hi none
    wrapped_lo: np.ndarray   # int64 [lo, hi): funcol's wrap of that call's output (_wrap_tensor_autograd)
    wrapped_hi: np.ndarray   # right after it on the issuing thread; lo == hi none


def link(rt: RankTrace, window_rows: np.ndarray, rows: np.ndarray) -> GlooWork:
    """rows: the rank's gloo transfer rows; window_rows: the analysis window's host rows."""
    t, c = rt.events, rt.comms
    issuers = issuer_threads(t, window_rows)
    lane = np.where(np.isin(t.thread[rows], issuers), -1, t.thread[rows]).astype(np.int32)
    ops = window_rows[t.name_mask(lambda s: bool(ISSUE_RE.match(s)) and s not in P2P_OPS)[window_rows]
                      & (t.kind[window_rows] == Kind.CPU_OP)]
    worker = np.flatnonzero(lane >= 0)
    issuer = np.full(rows.size, -1, np.int64)
    pick = fifo_pairs(comm_column(c.row, c.in_nelems, rows[worker]), t.ts_ns[rows[worker]],
                      comm_column(c.row, c.in_nelems, ops), t.ts_ns[ops])
    issuer[worker[pick >= 0]] = ops[pick[pick >= 0]]
    lo, hi = _blocked(rt, window_rows, issuer)
    ilo, ihi, wlo, whi = _issued(t, issuer)
    return GlooWork(lane=lane, issuer=issuer, fsdp=_by_fsdp(t, issuer), blocked_lo=lo, blocked_hi=hi,
                    issued_lo=ilo, issued_hi=ihi, wrapped_lo=wlo, wrapped_hi=whi)


def _issued(t, issuer: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per transfer: the span of the call that issued it on its issuer's thread: the outermost
    functional collective around the c10d op (DTensor's), else the c10d op itself; and the span of
    funcol's wrap of that call's output (the first `_wrap_tensor_autograd` on the thread to start
    after the call, within REWAIT_NS: funcol wraps what the op returns at once). (lo, hi, wrap lo,
    wrap hi); lo == hi none."""
    lo, hi = np.zeros(issuer.size, np.int64), np.zeros(issuer.size, np.int64)
    wlo, whi = np.zeros(issuer.size, np.int64), np.zeros(issuer.size, np.int64)
    paired = np.flatnonzero(issuer >= 0)
    ops = issuer[paired]
    inner = enclosing(t, t.ts_ns[ops], t.thread[ops], FUNCOL_RE.match, kinds=(Kind.CPU_OP,))
    funcol = inner >= 0
    call = ops.copy()
    call[funcol] = _outermost(t, inner[funcol], FUNCOL_RE.match)
    lo[paired], hi[paired] = t.ts_ns[call], t.end_ns[call]
    wrap = _wrap_of(t, call, funcol)
    got = wrap >= 0
    wlo[paired[got]], whi[paired[got]] = t.ts_ns[wrap[got]], t.end_ns[wrap[got]]
    return lo, hi, wlo, whi


def _wrap_of(t, calls: np.ndarray, funcol: np.ndarray) -> np.ndarray:
    """Per call (a functional collective where funcol), the row of the wrap of its output: the
    first `_wrap_tensor_autograd` on its thread to start at its end or after, within REWAIT_NS
    (the outer one, where wraps nest as the calls do); -1 none."""
    out = np.full(calls.size, -1, np.int64)
    wraps = np.flatnonzero(t.name_mask(WRAP_RE.match) & t.mask(Kind.CPU_OP))
    if wraps.size == 0 or not funcol.any():
        return out
    for th in distinct(t.thread[calls[funcol]]):
        mine = wraps[t.thread[wraps] == th]
        if mine.size == 0:
            continue
        mine = mine[np.lexsort((-t.end_ns[mine], t.ts_ns[mine]))]        # by start; of two, the longer first
        sel = np.flatnonzero(funcol & (t.thread[calls] == th))
        end = t.end_ns[calls[sel]]
        j = np.searchsorted(t.ts_ns[mine], end, side="left")
        ok = j < mine.size
        w = mine[np.minimum(j, mine.size - 1)]
        ok &= t.ts_ns[w] - end <= REWAIT_NS
        out[sel[ok]] = w[ok]
    return out


def _outermost(t, rows: np.ndarray, match) -> np.ndarray:
    """Each row (one matching `match`), or the outermost row matching it on its thread that
    contains it. Functional collectives nest: under a Python dispatch mode (DTensor's
    redistribution runs one), the program's `_c10d_functional::all_reduce` dispatches the op again
    inside itself, and the outer call's own time (hundreds of µs on a CPU) is the issuing too."""
    out = rows.copy()
    cand = np.flatnonzero(t.name_mask(match) & t.mask(Kind.CPU_OP))
    for th in distinct(t.thread[rows]):
        c = cand[t.thread[cand] == th]
        if c.size == 0:
            continue
        c = c[np.lexsort((-t.end_ns[c], t.ts_ns[c]))]           # by start; of two, the longer first
        ends = t.end_ns[c]
        opened = np.maximum.accumulate(np.concatenate(([np.iinfo(np.int64).min], ends[:-1])))
        top = np.maximum.accumulate(np.where(t.ts_ns[c] >= opened, np.arange(c.size), 0))   # its outermost
        sel = np.flatnonzero(t.thread[rows] == th)
        by_row = np.argsort(c)
        pos = by_row[np.minimum(np.searchsorted(c[by_row], rows[sel]), c.size - 1)]   # its place in c
        found = c[pos] == rows[sel]
        up = c[top[pos]]
        ok = found & (t.ts_ns[up] <= t.ts_ns[rows[sel]]) & (t.end_ns[up] >= t.end_ns[rows[sel]])
        out[sel[ok]] = up[ok]
    return out


def comm_column(comm_rows: np.ndarray, col: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A CommTable column's values at event rows (comm_rows: the table's rows, ascending); -1
    where a row is not in the table."""
    if comm_rows.size == 0:
        return np.full(rows.size, -1, np.int64)
    pos = np.minimum(np.searchsorted(comm_rows, rows), comm_rows.size - 1)
    return np.where(comm_rows[pos] == rows, col[pos], -1).astype(np.int64)


def issuer_threads(t, window_rows: np.ndarray) -> np.ndarray:
    """Threads that issue collectives (run `c10d::*` or functional-collective ops): the program's.
    A gloo span on any other thread ran on a worker of its process group."""
    calls = t.name_mask(lambda s: bool(ISSUE_RE.match(s) or FUNCOL_RE.match(s) or WAIT_RE.match(s)))
    sel = window_rows[calls[window_rows] & (t.kind[window_rows] == Kind.CPU_OP)]
    return distinct(t.thread[sel])


def _by_fsdp(t, issuer: np.ndarray) -> np.ndarray:
    """Per transfer: issued by FSDP itself, under its annotation and not through a functional
    collective (FSDP2's hooks run DTensor redistributions too: those are tensor-parallel)."""
    out = np.zeros(issuer.size, bool)
    paired = np.flatnonzero(issuer >= 0)
    at, th = t.ts_ns[issuer[paired]], t.thread[issuer[paired]]
    under_fsdp = enclosing(t, at, th, FSDP_RE.match) >= 0
    out[paired] = under_fsdp & (enclosing(t, at, th, FUNCOL_RE.match, kinds=(Kind.CPU_OP,)) < 0)
    return out


def _blocked(rt: RankTrace, window_rows: np.ndarray, issuer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per transfer: the wait_tensor(s) its issuer blocked in on it, [lo, hi): the first, joined by
    a second that follows it within REWAIT_NS (DTensor waits twice on one tensor; the second
    returns at once). A later wait on the same tensor (a step later, on a tensor kept) is no
    blocking on this transfer and is not joined: a hull would span the step between. lo == hi none."""
    t, c = rt.events, rt.comms
    lo, hi = np.full(issuer.size, np.iinfo(np.int64).max), np.zeros(issuer.size, np.int64)
    paired = np.flatnonzero(issuer >= 0)
    ops = issuer[paired]
    funcol = enclosing(t, t.ts_ns[ops], t.thread[ops], FUNCOL_RE.match, kinds=(Kind.CPU_OP,)) >= 0
    paired, ops = paired[funcol], ops[funcol]
    waits = window_rows[t.name_mask(WAIT_RE.match)[window_rows] & (t.kind[window_rows] == Kind.CPU_OP)]
    # what a functional collective returns is what its c10d op wrote: its output argument, or
    # (all_reduce, in place) its input
    out, into = comm_column(c.row, c.out_nelems, ops), comm_column(c.row, c.in_nelems, ops)
    pick = _waited_on(comm_column(c.row, c.in_nelems, waits), t.ts_ns[waits],
                      np.where(out >= 0, out, into), t.ts_ns[ops])
    got = np.flatnonzero(pick >= 0)
    got = got[np.argsort(t.ts_ns[waits[got]], kind="stable")]
    for i, r in zip(paired[pick[got]].tolist(), waits[got].tolist()):
        a, b = int(t.ts_ns[r]), int(t.end_ns[r])
        if hi[i] == 0:
            lo[i], hi[i] = a, b
        elif a <= hi[i] + REWAIT_NS:      # the second wait right after the first: one blocked stretch
            hi[i] = max(hi[i], b)
    return np.minimum(lo, hi), hi


def _waited_on(key: np.ndarray, time: np.ndarray, op_key: np.ndarray, op_time: np.ndarray) -> np.ndarray:
    """For each wait, the index of the op it waited on; -1 none issued before it. Per key, with
    the waits and the ops in time order and issued_i ops issued before wait i, wait i is on op
    a_i = min(a_(i-1) + 1, issued_i - 1): the next one, or the last issued (a second wait)."""
    out = np.full(key.size, -1, np.int64)
    for waits, ops in _by_key(key, time, op_key, op_time):
        i = np.arange(waits.size)
        issued = np.searchsorted(op_time[ops], time[waits], side="right")
        a = i + np.minimum(0, np.minimum.accumulate(issued - 1 - i))      # the recurrence, unrolled
        out[waits[a >= 0]] = ops[a[a >= 0]]
    return out


def fifo_pairs(key: np.ndarray, time: np.ndarray, src_key: np.ndarray, src_time: np.ndarray) -> np.ndarray:
    """For each item, the index of the source it pairs with; -1 none. Per key, the k-th item (in
    time order) pairs with the k-th source; a key where some item would come before its source
    is not paired at all (the order is not what it seems: nothing is guessed)."""
    out = np.full(key.size, -1, np.int64)
    for items, srcs in _by_key(key, time, src_key, src_time):
        n = min(items.size, srcs.size)
        if np.all(src_time[srcs[:n]] <= time[items[:n]]):
            out[items[:n]] = srcs[:n]
    return out


def _by_key(key: np.ndarray, time: np.ndarray, src_key: np.ndarray, src_time: np.ndarray):
    """Per key known (>= 0) on both sides: (items, sources) of that key, each in time order."""
    for k in np.intersect1d(distinct(key[key >= 0]), distinct(src_key[src_key >= 0]), assume_unique=True):
        items, srcs = np.flatnonzero(key == k), np.flatnonzero(src_key == k)
        yield items[np.argsort(time[items], kind="stable")], srcs[np.argsort(src_time[srcs], kind="stable")]
