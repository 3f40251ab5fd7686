"""Setting the ranks' clocks against each other, from the collectives matched across them.

Problem: hosts' clocks are not aligned (and a trace's timestamps may not even share an epoch
with another's), so one rank's events cannot be drawn beside another's as they are. What the
traces do share is the collectives: a collective ends at the same moment on every rank of its
group, while its start differs by the time each rank waited for the last one. So for each pair
of ranks that meet in matched collectives (analysis.matching), the median over those instances
of the difference of their ends is the offset between their clocks; the median shrugs off the
few instances whose ends differ for other reasons (a gloo ring's last hop, a preempted thread).
Pairs are chained from the reference rank (the lowest) along the pairs with the most matched
collectives first, so every rank any group reaches gets an offset; pipeline send/recv, whose two
ends need not finish together, are used only where no collective reaches a rank. A rank nothing
ties to the reference keeps its raw clock, and that is said.
"""
from __future__ import annotations

import heapq
from collections import defaultdict

import numpy as np

from ..trace.columns import median
from ..trace.kinds import Coll
from .collectives import RankComms
from .results import ClockAlignment, ClockShift

_P2P = (Coll.SEND, Coll.RECV, Coll.SEND_RECV)


def _ends(comms: list[RankComms]):
    """Every matched instance: (match id, rank, end on the rank's trace clock in ns, is p2p)."""
    cols = {k: [] for k in ("mid", "rank", "end", "p2p")}
    for rc in comms:
        sel = np.flatnonzero(rc.match_id >= 0) if rc.match_id.size == len(rc) else np.zeros(0, np.int64)
        cols["mid"].append(rc.match_id[sel])
        cols["rank"].append(np.full(sel.size, rc.rank, np.int64))
        cols["end"].append(int(round(rc.clock0_us * 1000)) + rc.start_ns[sel] + rc.dur_ns[sel])
        cols["p2p"].append(np.isin(rc.coll[sel], _P2P))
    return tuple(np.concatenate(cols[k]) if cols[k] else np.zeros(0, np.int64) for k in ("mid", "rank", "end", "p2p"))


def pair_offsets(comms: list[RankComms]) -> dict:
    """{(a, b, p2p): [end_a - end_b, ...]} for a the lowest rank of each match and b each other member."""
    mid, rank, end, p2p = _ends(comms)
    pairs: dict = defaultdict(list)
    if mid.size == 0:
        return pairs
    order = np.lexsort((rank, mid))
    mid, rank, end, p2p = mid[order], rank[order], end[order], p2p[order]
    first = np.r_[True, mid[1:] != mid[:-1]]
    anchor = np.flatnonzero(first)[np.cumsum(first) - 1]          # per entry: its match's first entry
    others = np.flatnonzero(~first)
    for i, a in zip(others.tolist(), anchor[others].tolist()):
        pairs[(int(rank[a]), int(rank[i]), bool(p2p[i]))].append(int(end[a] - end[i]))
    return pairs


def _edges(pairs: dict) -> dict:
    """Per rank, its neighbours: [(rank, offset to add to go from this rank to it, samples, spread, p2p)]."""
    out: dict = defaultdict(list)
    for (a, b, p2p), diffs in pairs.items():
        d = np.asarray(diffs, np.int64)
        med = int(median(d))
        spread = int(median(np.abs(d - med)))
        out[a].append((b, med, d.size, spread, p2p))       # end_b + (off_a + med) = end_a + off_a
        out[b].append((a, -med, d.size, spread, p2p))
    return out


def align(comms: list[RankComms]) -> ClockAlignment:
    """Each rank's clock offset onto the reference rank's (comms carry their match ids)."""
    ranks = sorted(rc.rank for rc in comms)
    edges = _edges(pair_offsets(comms))
    if not ranks or not edges:
        return ClockAlignment(reference=None, shifts=[ClockShift(r, None) for r in ranks],
                              unknown="no collective could be matched across ranks: each rank keeps its own clock")
    ref = min(edges)
    got = {ref: ClockShift(ref, 0, via=ref)}
    # Prim's walk: the next rank reached is the one on the best pair out of those reached so far,
    # collectives before send/recv, then the most matched instances
    heap = [(p2p, -n, b, ref, off, spread) for b, off, n, spread, p2p in edges[ref]]
    heapq.heapify(heap)
    while heap:
        p2p, neg_n, b, a, off, spread = heapq.heappop(heap)
        if b in got:
            continue
        got[b] = ClockShift(b, got[a].offset_ns + off, via=a, instances=-neg_n, spread_ns=spread)
        for c, off2, n, spread2, p2p2 in edges[b]:
            if c not in got:
                heapq.heappush(heap, (p2p2, -n, c, b, off2, spread2))
    shifts = [got.get(r, ClockShift(r, None)) for r in ranks]
    left = [r for r in ranks if r not in got]
    unknown = None
    if left:
        unknown = (f"ranks {', '.join(map(str, left))} share no matched collective with rank {ref}'s groups: "
                   "they keep their own clocks")
    return ClockAlignment(reference=ref, shifts=shifts, unknown=unknown)
