"""The process group of each gloo transfer, found across ranks where the traces name none.

gloo's `gloo:*` spans carry no process-group args, and which worker thread (`pt_gloo_runloop`)
serves which group is written nowhere. What is known for certain:

1. each process group has its own worker threads (gloo's default is two per group; a unit here
   is one or two threads of a rank), and a thread serves no other group;
2. every member of a group runs the same collectives on it: the same multiset of (op, element
   count), whatever the order its two threads happened to take them in;
3. `pg_config` lists each rank's groups with their members, and FSDP's collectives (issued under
   its own annotations) run in a data-parallel group (one of the layout's, where it is known).

So, per rank, a unit of threads can serve a group only if every other member of that group with
a trace has a unit that ran the same multiset, and (for FSDP's) if the group's axis is
data-parallel. Every way of covering the rank's threads with such units, one group each and no
group twice, covering as many threads as can be, is found; a thread whose group is the same in
all of them gets it. Two groups whose members ran the same collectives (a tensor- and a
data-parallel group of one pipeline stage often do) stay unknown unless FSDP's annotations set
them apart: ambiguous is unknown, never guessed.

Point-to-point transfers (gloo's `gloo:send` / `gloo:recv`, on the posting thread) join the
rank's pipeline group when the layout makes it two ranks: the only peer there is.
"""
from __future__ import annotations

from collections import Counter
from itertools import combinations
from typing import Optional

import numpy as np

from ..layout import AXES, UNKNOWN
from ..trace.columns import distinct
from ..trace.kinds import Coll
from .collectives import RankComms
from .layoutfind import JobLayout, group_key

THREADS_PER_GROUP = 2          # ProcessGroupGloo's default (`ProcessGroupGloo.Options._threads`)
DATA_PARALLEL = frozenset(a for a in AXES if a.startswith("dp"))
SEARCH_BUDGET = 200_000        # cover-search steps per rank; past it the rank's threads stay unknown


def join_groups(comms: list[RankComms], pg_configs: list[list], jl: Optional[JobLayout]) -> None:
    """Give the gloo transfers of every rank whose trace names no group their group, size and axis
    (pg_configs: per rank, layoutfind.compact_pg_config; in the order of comms)."""
    lanes = {rc.rank: _lane_sets(rc) for rc in comms}
    shapes = {r: {_shape(u, ls) for u in _units(ls)} for r, ls in lanes.items()}
    for rc, pgs in zip(comms, pg_configs):
        if lanes[rc.rank]:
            found = _lanes_to_groups(rc, lanes[rc.rank], _groups_of(rc.rank, pgs), shapes, jl)
            lane, unnamed = _gloo(rc)[0], _unnamed(rc)
            for la, key in found.items():
                _set_group(rc, (lane == la) & unnamed, key, jl)
        _pipeline_peer(rc, jl)


def _unnamed(rc: RankComms) -> np.ndarray:
    return np.fromiter((g is None for g in rc.group), bool, len(rc))


def _gloo(rc: RankComms) -> tuple[np.ndarray, np.ndarray]:
    """(lane, sig) per instance; -1 throughout for a summary made before they were recorded."""
    if rc.lane.size != len(rc) or rc.sig.size != len(rc):
        return np.full(len(rc), -1, np.int32), np.full(len(rc), -1, np.int64)
    return rc.lane, rc.sig


def _lane_sets(rc: RankComms) -> dict[int, Counter]:
    """Worker thread -> the multiset of (op, elements) it ran, for transfers with no group named."""
    lane, sig = _gloo(rc)
    ok = (lane >= 0) & (sig >= 0)
    if not ok.any():                                  # no gloo worker here (a GPU trace, say)
        return {}
    ok &= _unnamed(rc)
    return {int(la): Counter(sig[ok & (lane == la)].tolist()) for la in distinct(lane[ok])}


def _units(lanes: dict[int, Counter]) -> list[tuple]:
    """The units a group's threads can form on a rank: each thread alone, and each pair."""
    ids = sorted(lanes)
    return [(la,) for la in ids] + list(combinations(ids, THREADS_PER_GROUP))


def _shape(unit: tuple, lanes: dict[int, Counter]) -> tuple:
    total = sum((lanes[la] for la in unit), Counter())
    return tuple(sorted(total.items()))


def _groups_of(rank: int, pgs: list) -> list[str]:
    """The keys of the groups `rank` belongs to, of two ranks or more, once each."""
    keys = [group_key(ranks) for _, _, ranks in pgs]
    return list(dict.fromkeys(k for k in keys if k and k.count(",") >= 1 and str(rank) in k.split(",")))


def _feasible(rc: RankComms, unit: tuple, shape: tuple, groups: list[str], shapes: dict,
              jl: Optional[JobLayout]) -> list[str]:
    """The groups a unit of rc's threads can serve: every other member with a trace ran the same
    multiset on some unit of its own (at least one such member), and FSDP's transfers run in a
    data-parallel group (where the layout names the group's axis)."""
    fsdp = bool(rc.fsdp.size) and bool(rc.fsdp[np.isin(rc.lane, unit)].any())
    out = []
    for key in groups:
        others = [int(m) for m in key.split(",") if int(m) != rc.rank and int(m) in shapes]
        if not others or any(shape not in shapes[m] for m in others):
            continue
        if fsdp and not _may_be_data_parallel(key, jl):
            continue
        out.append(key)
    return out


def _may_be_data_parallel(key: str, jl: Optional[JobLayout]) -> bool:
    """Can FSDP run in this group? Yes where its axis is data-parallel, or where nothing names any
    axis; no where the layout is known and the group is none of its data-parallel ones."""
    axis = jl.axis_of(key) if jl is not None else UNKNOWN
    if axis != UNKNOWN:
        return AXES[axis] in DATA_PARALLEL
    return jl is None or (jl.layout is None and not jl.axis_of_key)


def _lanes_to_groups(rc: RankComms, lanes: dict[int, Counter], groups: list[str], shapes: dict,
                     jl: Optional[JobLayout]) -> dict[int, str]:
    """Thread -> group key, where every widest cover of the rank's threads agrees."""
    options = {u: _feasible(rc, u, _shape(u, lanes), groups, shapes, jl) for u in _units(lanes)}
    options = {u: g for u, g in options.items() if g}
    seen = _covers(sorted(lanes), options)
    return {la: next(iter(keys)) for la, keys in seen.items() if len(keys) == 1 and None not in keys}


def _covers(lanes: list[int], options: dict[tuple, list[str]]) -> dict[int, set]:
    """Over all assignments of units (one group each, no group twice, no thread twice) that cover
    the most threads: per thread, the set of groups it gets (None: left out by one of them).
    {} when the search runs out of budget."""
    width, seen, steps = 0, {}, 0

    def go(i: int, taken: set, used: set, chosen: dict) -> None:
        nonlocal width, seen, steps
        steps += 1
        if steps > SEARCH_BUDGET:
            raise _TooMany
        if i == len(lanes):
            if len(chosen) > width:
                width, seen = len(chosen), {}
            if len(chosen) == width:
                for la in lanes:
                    seen.setdefault(la, set()).add(chosen.get(la))
            return
        la = lanes[i]
        if la in taken:
            return go(i + 1, taken, used, chosen)
        for unit, keys in options.items():
            if la in unit and not taken.intersection(unit):
                for key in keys:
                    if key not in used:
                        go(i + 1, taken | set(unit), used | {key}, {**chosen, **{x: key for x in unit}})
        go(i + 1, taken | {la}, used, chosen)           # this thread left without a group
    try:
        go(0, set(), set(), {})
    except _TooMany:
        return {}
    return seen


class _TooMany(Exception):
    """The cover search ran past its budget."""


def _set_group(rc: RankComms, sel: np.ndarray, key: str, jl: Optional[JobLayout]) -> None:
    for i in np.flatnonzero(sel):
        rc.group[i] = key
    rc.group_size[sel] = key.count(",") + 1
    if jl is not None:
        rc.axis[sel & (rc.axis == UNKNOWN)] = jl.axis_of(key)


def _pipeline_peer(rc: RankComms, jl: Optional[JobLayout]) -> None:
    """Sends and receives with no group named run in the rank's pipeline group, when the layout
    makes that group two ranks (the peer is then the other one)."""
    pp = jl.group_of(rc.rank, "pp") if jl is not None else None
    if pp is None or pp[1] != 2:
        return
    lane, sig = _gloo(rc)
    p2p = np.isin(rc.coll, (Coll.SEND, Coll.RECV)) & (lane < 0) & (sig >= 0)      # gloo's, on the posting thread
    if p2p.any():
        _set_group(rc, p2p & _unnamed(rc), pp[0], jl)
