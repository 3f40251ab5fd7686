"""Point-to-point operations in Flight Recorder dumps, matched between peers (#21).

A pipeline hang is usually a send with no matching recv. Each send/recv entry names its peers in
its profiling name (`nccl:send 0->1`, `nccl:recv 1<-0`), as ranks of its process group, which
the group's members (sorted) turn into global ranks, as PyTorch's fr_trace does. Its p2p_seq_id
counts every point-to-point op of the rank in the group, not per pair, so the sends of `src` to
`dst` are matched with the recvs of `dst` from `src` in order, per (group, sender, receiver), as
fr_trace matches them (a send with the next recv from that sender). A pair with more sends than
recvs (or the other way) leaves the first unmatched one: the peer never posted the matching recv
(send); the rank that did waits in it unless its dump says it completed.

Assumes the two buffers hold the pair's ops from the same point on (a buffer that wrapped in the
middle of a pair's traffic shifts the count; sizes that disagree in matched pairs say so).
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Optional

from ..layout import axis_name
from ..trace.commtable import group_key
from ..trace.flightrec import FRDump, FREntry
from .frresults import FRP2P, FRWaiter

_PEERS = re.compile(r"^\S*?(send|recv)\s+(\d+)\s*(->|<-)\s*(\d+)")


def peers(e: FREntry, members: list[int], default: bool) -> Optional[tuple[str, int, int]]:
    """(send | recv, global src, global dst) from the entry's profiling name; None when it names no
    peers or they fall outside the group's members."""
    m = _PEERS.match(e.op.split(":", 1)[-1])
    if not m:
        return None
    kind, a, arrow, b = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
    src, dst = (a, b) if arrow == "->" else (b, a)
    if (kind, arrow) not in (("send", "->"), ("recv", "<-")):
        return None
    ranks = sorted(members)
    if not default and not ranks:
        return None
    if ranks and not (src < len(ranks) and dst < len(ranks)):
        return None
    return kind, (ranks[src] if ranks else src), (ranks[dst] if ranks else dst)


def match_p2p(dumps: list[FRDump], groups: dict, grid, bytes_of) -> tuple[list[FRP2P], int]:
    """(the unmatched pairs, each with its verdict; how many p2p entries named no usable peers)."""
    sends: dict = defaultdict(list)
    recvs: dict = defaultdict(list)
    unread = 0
    for d in dumps:
        for e in sorted((e for e in d.entries if e.p2p), key=lambda e: e.created_ns):
            desc, members = groups.get(e.pg, (e.desc, []))
            if e.op.split(":")[-1].split(" ")[0] == "coalesced":
                continue             # a batch's closing entry: its ops are entries of their own
            p = peers(e, members, desc == "default_pg")
            if p is None or d.rank not in (p[1], p[2]):
                unread += 1
                continue
            kind, src, dst = p
            if kind == "send" and src == d.rank:
                sends[(e.pg, src, dst)].append(e)
            elif kind == "recv" and dst == d.rank:
                recvs[(e.pg, src, dst)].append(e)
            else:
                unread += 1
    dumped = {d.rank for d in dumps}
    tracked = {d.rank for d in dumps if any(e.state in ("started", "completed") for e in d.entries)}
    out = []
    for key in sorted(set(sends) | set(recvs)):
        pg, src, dst = key
        s, r = sends[key], recvs[key]
        if len(s) == len(r) or src not in dumped or dst not in dumped:
            continue
        desc, members = groups.get(pg, ("", []))
        if len(s) > len(r):
            e, posted, absent, ours = s[len(r)], src, dst, "send"
        else:
            e, posted, absent, ours = r[len(s)], dst, src, "recv"
        waits = not (posted in tracked and e.state == "completed")
        axis = axis_name(grid.axis_of(group_key(members))) if members and len(members) > 1 else "unknown"
        if desc == "default_pg":
            axis = "world"
        x = FRP2P(pg=pg, desc=desc, axis=axis, ranks=list(members), src=src, dst=dst, posted=posted, absent=absent,
                  op=ours, seq=e.seq, bytes=bytes_of(e), since_ns=e.created_ns, state=e.state,
                  waiting=[FRWaiter(posted, e.created_ns)] if waits else [], matched=min(len(s), len(r)))
        out.append(x)
    return out, unread
