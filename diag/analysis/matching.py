"""Match the instances of one collective across the ranks of its group.

A collective's kernel on one rank lasts from that rank's arrival to the end of the
transfer, so it includes waiting for the last rank. Matched across the group, the
shortest instance is the transfer time (it belongs to the rank that arrived last), and
each rank's excess over it is wait time. Instances are matched by (group, collective,
order of occurrence within the group on that rank); a send pairs with the matching
receive of its peer (2-member groups, where the peer is known); the ranks' clocks are compared
only for such a pair on one host (below).

A send and its receive need not end together: a nonblocking send (torch.distributed.pipelining's
runtime schedules post `isend` and wait on it at the step's end) spans from its issue to that wait,
and the receive from its posting to the data's arrival, which includes waiting for the sender; the
shortest of the two can be either wait. Where both ranks ran on one host (the traces' host_name,
or Kineto's file names), their timestamps are one clock's, and a receive posted before its send
began times the transfer on it: from the send's start to the receive's end. Elsewhere the
shortest stands. The waits stay each member's excess over the shorter span, the basis the
straggler analysis reads (a send's span open while its rank computes is no wait for a peer).

When the trace does not say the group (old traces), instances are matched across all
ranks only if every rank of the world is present and each shows the same sequence of
collectives; that inference is reported, and otherwise the instance stays unmatched. A complete
match on such an inferred group also says the group's size (the ranks matched), which the trace
did not: busbw needs it for the bus factor.
"""
from __future__ import annotations

import numpy as np

from ..trace.kinds import Coll
from .collectives import RankComms
from ..record import record

INFERRED_GROUP = "*"


@record
class Matched:
    """Per instance of a rank's collectives: its transfer, its wait, and whether it came last."""

    transfer_ns: np.ndarray   # per instance: shortest duration in its match (a send/recv pair of one
                              # host: timed on its clock, see above), -1 unmatched
    wait_ns: np.ndarray       # per instance: duration - the shortest in its match, 0 unmatched
    last: np.ndarray          # per instance: this rank arrived last in its match
    complete: np.ndarray      # per instance: every member of the group had a trace
    match_id: np.ndarray      # per instance: id of its match, -1 unmatched
    group_size: np.ndarray    # per instance: ranks in its complete match on an inferred group, else 0


P2P_BASE = 64                     # key codes: a collective's Coll value; p2p: P2P_BASE + direction


def _codes(rc: RankComms, group_id: dict, members_of: dict, infer: bool):
    """Per instance: (group id, key code), the pair an instance is matched on (with its order
    of occurrence); group id -1 where it cannot be matched. A send pairs with its receive: the
    code of both is P2P_BASE + direction (0: the group's first member sends). Only a 2-member
    group names the peer; in a larger one the trace does not say who the other side is."""
    n = len(rc)
    gid = np.full(n, -1, np.int64)
    code = rc.coll.astype(np.int64)
    p2p = np.isin(rc.coll, (Coll.SEND, Coll.RECV))
    for g in set(rc.group):
        if g is None:
            continue
        if g not in group_id:
            group_id[g] = len(group_id)
            try:
                members_of[g] = [int(x) for x in g.split(",")]
            except ValueError:
                members_of[g] = []
        sel = np.fromiter((x == g for x in rc.group), bool, n)
        gid[sel] = group_id[g]
        m = members_of[g]
        sp = sel & p2p
        if sp.any():
            if len(m) == 2 and rc.rank in m:
                # direction: 0 when m[0] sends; a send here is sent by rc.rank, a receive by the peer
                sender_is_me = rc.coll[sp] == Coll.SEND
                code[sp] = P2P_BASE + np.where(sender_is_me, int(rc.rank != m[0]), int(rc.rank == m[0]))
            else:
                gid[sp] = -1
    if infer:
        none = np.fromiter((x is None for x in rc.group), bool, n) & ~p2p
        gid[none] = group_id.setdefault(INFERRED_GROUP, len(group_id))
    gid[rc.coll == Coll.SEND_RECV] = -1      # one piece of an all-to-all or a batched p2p: peers unknown
    return gid, code


def _occurrence(pair: np.ndarray) -> np.ndarray:
    """Per element: how many earlier elements carry the same value (its order of occurrence)."""
    if pair.size == 0:
        return pair
    order = np.argsort(pair, kind="stable")
    s = pair[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    run = np.repeat(starts, np.diff(np.r_[starts, s.size]))
    occ = np.empty(pair.size, np.int64)
    occ[order] = np.arange(pair.size) - run
    return occ


def _can_infer(comms: list[RankComms], world: int | None, smaller_groups: bool = False) -> bool:
    """Unnamed collectives ran in the world group only if no smaller group exists to run them in
    (`smaller_groups`: the traces' pg_config lists one) and every rank shows the same sequence."""
    if not world or len(comms) != world or world < 2 or smaller_groups:
        return False
    seqs = {tuple(rc.coll[[g is None for g in rc.group]].tolist()) for rc in comms}
    return len(seqs) == 1 and len(next(iter(seqs))) > 0


def _one_clock(transfer, pos_a, pos_b, start, end, is_send, host) -> np.ndarray:
    """The pairs' transfer where both of a send/recv pair ran on one host and the receive was
    posted first: the receive's end less the send's start, where that is positive and shorter than
    the shorter span; else as given (per pair: positions pos_a, pos_b of its two members). A
    receive posted after the send began may find the bytes there already: its end less the send's
    start would then hold the receiver's own delay, and its span alone only the copy out."""
    same = (host[pos_a] >= 0) & (host[pos_a] == host[pos_b]) & (is_send[pos_a] != is_send[pos_b])
    send, recv = np.where(is_send[pos_a], pos_a, pos_b), np.where(is_send[pos_a], pos_b, pos_a)
    on_clock = end[recv] - start[send]
    better = same & (start[recv] <= start[send]) & (on_clock > 0) & (on_clock < transfer)
    return np.where(better, on_clock, transfer)


def match(comms: list[RankComms], world: int | None, smaller_groups: bool = False,
          hosts: list | None = None, epoch_ns: list | None = None) -> tuple[list[Matched], bool]:
    """Per rank, the matched view of its instances; and whether groups were inferred.

    hosts, epoch_ns: per comms entry, the host it ran on (None unknown) and where its clock's 0
    lies on the host's clock (ns); a send/recv pair of one host is timed on that clock.
    Instances are matched on (group, key code, order of occurrence on the rank); all ranks'
    instances are sorted together once, so the cost is O(instances log instances)."""
    present = {rc.rank for rc in comms}
    infer = _can_infer(comms, world, smaller_groups)
    group_id: dict = {}
    members_of: dict = {}
    cols = {k: [] for k in ("gid", "code", "occ", "ri", "ii", "dur", "start", "send", "host")}
    host_id = {}
    for ri, rc in enumerate(comms):
        gid, code = _codes(rc, group_id, members_of, infer)
        ok = np.flatnonzero(gid >= 0)
        pair = gid[ok] * 256 + code[ok]
        cols["gid"].append(gid[ok])
        cols["code"].append(code[ok])
        cols["occ"].append(_occurrence(pair))
        cols["ri"].append(np.full(ok.size, ri, np.int64))
        cols["ii"].append(ok)
        cols["dur"].append(rc.dur_ns[ok].astype(np.int64))
        # a clock past int64 in ns (a baseTimeNanoseconds out of any real range): not compared
        h = hosts[ri] if hosts and epoch_ns and epoch_ns[ri] is not None and abs(epoch_ns[ri]) < 1 << 62 else None
        cols["start"].append(rc.start_ns[ok].astype(np.int64) + (int(epoch_ns[ri]) if h is not None else 0))
        cols["send"].append(rc.coll[ok] == Coll.SEND)
        cols["host"].append(np.full(ok.size, -1 if h is None else host_id.setdefault(h, len(host_id)), np.int64))
    out = [Matched(np.full(len(rc), -1, np.int64), np.zeros(len(rc), np.int64), np.zeros(len(rc), bool),
                   np.zeros(len(rc), bool), np.full(len(rc), -1, np.int64), np.zeros(len(rc), np.int64))
           for rc in comms]
    if not any(len(c) for c in cols["gid"]):
        return out, infer
    gid, code, occ, ri, ii, dur, start, send, host = (np.concatenate(cols[k]) for k in (
        "gid", "code", "occ", "ri", "ii", "dur", "start", "send", "host"))
    # one match per (group, code, occurrence); within it, by duration then order of appearance
    order = np.lexsort((np.arange(gid.size), dur, occ, code, gid))
    g, c, o = gid[order], code[order], occ[order]
    new = np.r_[True, (g[1:] != g[:-1]) | (c[1:] != c[:-1]) | (o[1:] != o[:-1])]
    starts = np.flatnonzero(new)
    sizes = np.diff(np.r_[starts, order.size])
    match_of = np.repeat(np.arange(starts.size), sizes)          # per sorted position
    # match ids in order of first appearance (rank order, then instance order), as numbered before
    first = np.minimum.reduceat(order, starts)
    mid = np.empty(starts.size, np.int64)
    mid[np.argsort(first, kind="stable")] = np.arange(starts.size)
    shortest = dur[order][starts]                                # the shortest of each match
    transfer = shortest.copy()
    pairs = np.flatnonzero((c[starts] >= P2P_BASE) & (sizes == 2))
    if pairs.size and (host >= 0).any():
        a, b = order[starts[pairs]], order[starts[pairs] + 1]
        transfer[pairs] = _one_clock(transfer[pairs], a, b, start, start + dur, send, host)
    names = {v: k for k, v in group_id.items()}
    expected = np.array([2 if cc >= P2P_BASE else len(present) if names[gg] == INFERRED_GROUP
                         else len(members_of.get(names[gg], [])) or names[gg].count(",") + 1
                         for gg, cc in zip(g[starts].tolist(), c[starts].tolist())], np.int64)
    complete = sizes == expected
    inferred = g[starts] == group_id.get(INFERRED_GROUP, -1)
    found_size = np.where(complete & inferred, sizes, 0)        # the group is whoever matched
    kpos = np.flatnonzero(sizes[match_of] >= 2)                 # matched: a match of two or more
    k, a = order[kpos], match_of[kpos]
    by = np.argsort(ri[k], kind="stable")
    kpos, k, a = kpos[by], k[by], a[by]
    bounds = np.searchsorted(ri[k], np.arange(len(comms) + 1))
    for r, m in enumerate(out):
        lo, hi = bounds[r], bounds[r + 1]
        if lo == hi:
            continue
        j, aa = ii[k[lo:hi]], a[lo:hi]
        m.transfer_ns[j], m.wait_ns[j] = transfer[aa], dur[k[lo:hi]] - shortest[aa]
        m.last[j], m.complete[j], m.match_id[j] = new[kpos[lo:hi]], complete[aa], mid[aa]
        m.group_size[j] = found_size[aa]
    return out, infer
