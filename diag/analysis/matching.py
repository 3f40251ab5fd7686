"""Match the instances of one collective across the ranks of its group.

A collective's kernel on one rank lasts from that rank's arrival to the end of the
transfer, so it includes waiting for the last rank. Matched across the group, the
shortest instance is the transfer time (it belongs to the rank that arrived last), and
each rank's excess over it is wait time. Instances are matched by (group, collective,
order of occurrence within the group on that rank); a send pairs with the matching
receive of its peer (2-member groups, where the peer is known); hosts' clocks are never
compared.

When the trace does not say the group (old traces), instances are matched across all
ranks only if every rank of the world is present and each shows the same sequence of
collectives; that inference is reported, and otherwise the instance stays unmatched.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..trace.kinds import Coll
from .collectives import RankComms

INFERRED_GROUP = "*"


@dataclass
class Matched:
    transfer_ns: np.ndarray   # per instance: shortest duration in its match, -1 unmatched
    wait_ns: np.ndarray       # per instance: duration - transfer, 0 unmatched
    last: np.ndarray          # per instance: this rank arrived last in its match
    complete: np.ndarray      # per instance: every member of the group had a trace
    match_id: np.ndarray      # per instance: id of its match, -1 unmatched


def _p2p_key(rc: RankComms, i: int, g: str):
    """A send pairs with its receive: (group, sender, receiver). Only a 2-member group names
    the peer; in a larger one the trace does not say who the other side is."""
    members = [int(x) for x in g.split(",")]
    if len(members) != 2 or rc.rank not in members:
        return None
    peer = members[0] if members[1] == rc.rank else members[1]
    sender, receiver = (rc.rank, peer) if rc.coll[i] == Coll.SEND else (peer, rc.rank)
    return (g, "p2p", sender, receiver)


def _keys(rc: RankComms, world: int, infer: bool):
    seen: dict = defaultdict(int)
    keys = []
    for i in range(len(rc)):
        g = rc.group[i]
        if rc.coll[i] in (Coll.SEND, Coll.RECV):
            k = _p2p_key(rc, i, g) if g is not None else None
        elif rc.coll[i] == Coll.SEND_RECV:
            k = None                      # one piece of an all-to-all or a batched p2p: peers unknown
        elif g is None and not infer:
            k = None
        else:
            k = (g if g is not None else INFERRED_GROUP, int(rc.coll[i]))
        keys.append(None if k is None else (*k, seen[k]))
        if k is not None:
            seen[k] += 1
    return keys


def _can_infer(comms: list[RankComms], world: int | None) -> bool:
    if not world or len(comms) != world or world < 2:
        return False
    seqs = {tuple(rc.coll[[g is None for g in rc.group]].tolist()) for rc in comms}
    return len(seqs) == 1 and len(next(iter(seqs))) > 0


def match(comms: list[RankComms], world: int | None) -> tuple[list[Matched], bool]:
    """Per rank, the matched view of its instances; and whether groups were inferred."""
    present = {rc.rank for rc in comms}
    infer = _can_infer(comms, world)
    members: dict = defaultdict(list)           # key -> [(rank index, instance index)]
    for ri, rc in enumerate(comms):
        for ii, k in enumerate(_keys(rc, world or 0, infer)):
            if k is not None:
                members[k].append((ri, ii))
    out = [Matched(np.full(len(rc), -1, np.int64), np.zeros(len(rc), np.int64), np.zeros(len(rc), bool),
                   np.zeros(len(rc), bool), np.full(len(rc), -1, np.int64)) for rc in comms]
    for mid, (key, inst) in enumerate(members.items()):
        if len(inst) < 2:
            continue
        durs = np.array([comms[ri].dur_ns[ii] for ri, ii in inst])
        transfer = int(durs.min())
        group = key[0]
        expected = (2 if key[1] == "p2p" else len(present) if group == INFERRED_GROUP
                    else group.count(",") + 1)
        ranks = {comms[ri].rank for ri, _ in inst}
        complete = len(ranks) == expected
        last_i = int(np.argmin(durs))
        for j, (ri, ii) in enumerate(inst):
            m = out[ri]
            m.transfer_ns[ii], m.wait_ns[ii] = transfer, int(durs[j]) - transfer
            m.last[ii], m.complete[ii], m.match_id[ii] = j == last_i, complete, mid
    return out, infer
