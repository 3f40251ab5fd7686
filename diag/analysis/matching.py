"""Match the instances of one collective across the ranks of its group.

A collective's kernel on one rank lasts from that rank's arrival to the end of the
transfer, so it includes waiting for the last rank. Matched across the group, the
shortest instance is the transfer time (it belongs to the rank that arrived last), and
each rank's excess over it is wait time. Instances are matched by (group, collective,
order of occurrence within the group on that rank); hosts' clocks are never compared.

When the trace does not say the group (old traces), instances are matched across all
ranks only if every rank of the world is present and each shows the same sequence of
collectives; that inference is reported, and otherwise the instance stays unmatched.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .collectives import RankComms

INFERRED_GROUP = "*"


@dataclass
class Matched:
    transfer_ns: np.ndarray   # per instance: shortest duration in its match, -1 unmatched
    wait_ns: np.ndarray       # per instance: duration - transfer, 0 unmatched
    last: np.ndarray          # per instance: this rank arrived last in its match
    complete: np.ndarray      # per instance: every member of the group had a trace
    match_id: np.ndarray      # per instance: id of its match, -1 unmatched


def _keys(rc: RankComms, world: int, infer: bool):
    seen: dict = defaultdict(int)
    keys = []
    for i in range(len(rc)):
        g = rc.group[i]
        if g is None:
            if not infer:
                keys.append(None)
                continue
            g = INFERRED_GROUP
        k = (g, int(rc.coll[i]))
        keys.append((g, int(rc.coll[i]), seen[k]))
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
        expected = len(present) if group == INFERRED_GROUP else group.count(",") + 1
        ranks = {comms[ri].rank for ri, _ in inst}
        complete = len(ranks) == expected
        last_i = int(np.argmin(durs))
        for j, (ri, ii) in enumerate(inst):
            m = out[ri]
            m.transfer_ns[ii], m.wait_ns[ii] = transfer, int(durs[j]) - transfer
            m.last[ii], m.complete[ii], m.match_id[ii] = j == last_i, complete, mid
    return out, infer
