"""A hang from Flight Recorder dumps: per process group, who never entered which collective.

The question on a stuck job is "which rank, which collective?". Each rank's dump lists the
collectives it entered, numbered per process group (collective_seq_id). Matching those numbers
across a group's members (as PyTorch's fr_trace does) gives, per group, the last collective every
member entered, the members that never entered the next one (the cause), the members inside it
(waiting since their entry time), and the first collective that members entered with different
ops or sizes. A group's members come from the dump's pg_config; gloo leaves pg_config empty, and
then they are the ranks whose dumps name the group (a group's name is the same on its members).
Groups are named by axis through the layout finder, from their descriptions (mesh_dp, ...).
"""
from __future__ import annotations

import time
from collections import defaultdict
from functools import lru_cache
from typing import Optional

from ..layout import axis_name, axis_of_desc
from ..trace.commtable import group_key
from ..trace.flightrec import FRDump, FREntry
from ..trace.kinds import Coll, op_name
from .bandwidth import message_bytes
from .frresults import FRGroup, FRWaiter
from .layoutfind import JobLayout, find_layout


WORLD = "world"          # FRGroup.axis of torch's default process group
DEFAULT_PG = "default_pg"
NO_DESC = ("", "undefined")   # torch's description of a group created without one


def group_members(dumps: list[FRDump], world: Optional[int] = None) -> dict[str, tuple[str, list[int]]]:
    """pg name -> (desc, members): pg_config's ranks where a dump gives them; else the default group
    is ranks 0..world-1, and any other group the ranks that recorded it (gloo: see inferred_groups)."""
    desc: dict[str, str] = {}
    given: dict[str, list[int]] = {}
    seen: dict[str, set] = defaultdict(set)
    for d in dumps:
        for name, (ds, ranks) in d.groups.items():
            if ds or name not in desc:      # an old pg_config gives ranks alone: the entries the name
                desc[name] = desc.get(name) or ds
            if ranks:
                given.setdefault(name, ranks)
        for e in d.entries:
            if not desc.get(e.pg):
                desc[e.pg] = e.desc
            seen[e.pg].add(d.rank)
    world = world or world_size(dumps)[0]

    def members(name):
        if given.get(name):
            return given[name]
        return list(range(world)) if desc.get(name) == DEFAULT_PG and world else sorted(seen[name])
    return {name: (desc.get(name, ""), members(name))
            for name in sorted(set(given) | set(seen), key=lambda n: (len(n), n))}


def inferred_groups(dumps: list[FRDump]) -> set[str]:
    """Groups whose members no dump gives (gloo leaves pg_config empty): taken from who recorded them."""
    given = {name for d in dumps for name, (_, ranks) in d.groups.items() if ranks}
    return {e.pg for d in dumps for e in d.entries if e.desc != DEFAULT_PG} - given


def complete_members(groups: dict, guessed: set, grid: JobLayout) -> tuple[dict, set]:
    """Groups whose members were taken from the dumps (gloo), completed from the job's layout where
    their description names an axis and the layout has that axis: a rank without a dump is then
    known to be a member. (groups, the names still guessed)."""
    lay = grid.layout
    if lay is None:
        return groups, guessed
    out, left = dict(groups), set(guessed)
    for name in guessed:
        desc, ranks = groups.get(name, ("", []))
        axis = axis_of_desc(desc)
        if not ranks or not axis or axis not in lay.axes or lay.size(axis) <= 1 or max(ranks) >= lay.world_size:
            continue
        full = sorted(lay.group_of(ranks[0], axis))
        if set(ranks) <= set(full):
            out[name] = (desc, full)
            left.discard(name)
    return out, left


def world_size(dumps: list[FRDump]) -> tuple[Optional[int], bool]:
    """(world size, known?): the highest member of any group in pg_config (NCCL lists the default
    group there); else the highest rank dumped + 1, a lower bound (gloo dumps carry no members)."""
    config = [ranks for d in dumps for _, (desc, ranks) in d.groups.items() if ranks]
    top = max([r for ranks in config for r in ranks] + [d.rank for d in dumps], default=None)
    if top is None:
        return None, False
    return top + 1, bool(config)      # NCCL's pg_config lists every group of the rank, the default one too


def name_axes(dumps: list[FRDump], groups: dict, meta: Optional[dict] = None, sizes: Optional[dict] = None,
              config: Optional[dict] = None) -> JobLayout:
    """The layout from the groups' descriptions (layoutfind, as for a trace's pg_config), else from
    the sizes given (flags, then a framework config file, then diag_run.json): layoutfind's one order."""
    per_rank: dict[int, list] = defaultdict(list)
    for name, (desc, ranks) in groups.items():
        for r in ranks:
            per_rank[r].append([name, desc, ranks])
    world = max((max(r) + 1 for _, r in groups.values() if r), default=None)
    hint = (meta or {}).get("world_size")
    if isinstance(hint, int) and hint >= (world or 0):
        world = hint                       # the dumps of the last ranks may be missing
    configs = [per_rank[r] for r in sorted(per_rank)]
    try:
        return find_layout(configs, world, flags=sizes, config=config, meta=meta)
    except ValueError as e:                # sizes that do not fit the world: the dumps' names alone
        grid = find_layout(configs, world)
        grid.notes.append(f"the layout's sizes do not fit the dumps ({e}): groups named by their descriptions alone")
        return grid


def entry_bytes(e: FREntry, n: int) -> Optional[int]:
    return _bytes(e.coll, e.in_nelems, e.out_nelems, e.dtype_bytes, n)


@lru_cache(maxsize=4096)          # a buffer repeats a few sizes thousands of times
def _bytes(coll, in_nelems, out_nelems, dtype, n) -> Optional[int]:
    return message_bytes(coll, in_nelems, out_nelems, dtype, n)


def op_word(e: FREntry) -> str:
    """diag's name of the op (trace.kinds.op_name); one it does not know, as the dump spells it."""
    return _op_word(e.coll, e.op)


@lru_cache(maxsize=1024)
def _op_word(coll: Coll, op: str) -> str:
    return op_name(coll) if coll != Coll.UNKNOWN else (op.split(":")[-1].split(" ")[0] or op)


def _clock(ns: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ns / 1e9))


def size_words(b: Optional[float]) -> str:
    if b is None:
        return "size unknown"
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b / k:.3g} {unit}"
    return f"{b:.0f} B"


def _raw(e: FREntry) -> tuple:
    return e.coll, e.op if e.coll == Coll.UNKNOWN else "", e.in_nelems, e.out_nelems, e.dtype_bytes


def _mismatch(by_rank: dict[int, dict[int, FREntry]], members: list[int], n: int) -> tuple[Optional[int], Optional[str]]:
    """The first collective every member entered with a different op or size, in words."""
    common = set.intersection(*(set(by_rank[r]) for r in members)) if members else set()
    for seq in sorted(common):
        if len({_raw(by_rank[r][seq]) for r in members}) == 1:      # as recorded alike: no need for words
            continue
        seen = {r: (op_word(by_rank[r][seq]), entry_bytes(by_rank[r][seq], n)) for r in members}
        if len(set(seen.values())) > 1:
            first = seen[members[0]]
            odd = [r for r in members if seen[r] != first]
            r = odd[0]
            return seq, (f"rank {r} entered #{seq} as {seen[r][0]} ({size_words(seen[r][1])}), rank {members[0]} "
                         f"as {first[0]} ({size_words(first[1])})")
    return None, None


def group_state(name: str, desc: str, members: list[int], dumps: dict[int, FRDump], grid: JobLayout,
                maybe_members: tuple = ()) -> FRGroup:
    """Where one group stands, and its verdict line. `maybe_members`: ranks without a dump that may
    be members (a group whose members were taken from the dumps)."""
    # the default group is the world, whatever axis has the same members (dp 2 on 2 ranks)
    axis = WORLD if desc == DEFAULT_PG else axis_name(grid.axis_of(group_key(members)))
    dumped = [r for r in members if r in dumps]
    by_rank = {r: {e.seq: e for e in dumps[r].entries if e.pg == name and not e.p2p} for r in dumped}
    last = {r: max(by_rank[r], default=0) for r in dumped}
    g = FRGroup(pg=name, desc=desc, axis=axis, ranks=members, last_common_seq=min(last.values(), default=None),
                undumped=[r for r in members if r not in dumps])
    g.mismatch_seq, g.mismatch = _mismatch(by_rank, dumped, len(members))
    label = group_label(axis, desc, name, members)
    if dumped and max(last.values()) > g.last_common_seq:
        # the first collective past the last common one that some member entered (the next number,
        # unless a dump skips numbers: a wrapped ring buffer, or a damaged one)
        g.next_seq = min(q for r in dumped for q in by_rank[r] if q > g.last_common_seq)
        g.missing = [r for r in dumped if last[r] < g.next_seq]
        inside = [r for r in dumped if g.next_seq in by_rank[r]]
        g.waiting = [FRWaiter(r, by_rank[r][g.next_seq].created_ns) for r in inside]
        e = by_rank[inside[0]][g.next_seq]
        g.next_op, g.next_bytes = op_word(e), entry_bytes(e, len(members))
        who = ", ".join(f"rank {w.rank}" for w in g.waiting[:4]) + (" ..." if len(g.waiting) > 4 else "")
        since = min(w.since_ns for w in g.waiting)
        g.verdict = (f"{label}: {_ranks(g.missing)} never entered {g.next_op} #{g.next_seq} "
                     f"({size_words(g.next_bytes)}); {who} {'waits' if len(g.waiting) == 1 else 'wait'} in it "
                     f"since {_clock(since)} UTC")
    elif g.mismatch:
        g.verdict = f"{label}: collective #{g.mismatch_seq} entered with different ops or sizes: {g.mismatch}"
    elif dumped and not g.undumped and not maybe_members \
            and (open_ := _not_completed(by_rank, dumps, dumped, g.last_common_seq)):
        # every member entered the last one, and it never completed: stuck inside (NCCL, network, GPU)
        g.not_completed = open_
        e = by_rank[open_[0]][g.last_common_seq]
        g.next_seq, g.next_op, g.next_bytes = g.last_common_seq, op_word(e), entry_bytes(e, len(members))
        g.waiting = [FRWaiter(r, by_rank[r][g.next_seq].created_ns) for r in dumped]
        states = ", ".join(f"rank {r} {by_rank[r][g.next_seq].state or 'no state'}" for r in open_[:4]) \
            + (" ..." if len(open_) > 4 else "")
        g.verdict = (f"{label}: every member entered {g.next_op} #{g.next_seq} ({size_words(g.next_bytes)}) "
                     f"and it never completed ({states}); inside since "
                     f"{_clock(min(w.since_ns for w in g.waiting))} UTC: the collective itself is stuck "
                     f"(network, NCCL or a GPU), not a rank that never came")
    elif dumped:
        g.verdict = f"{label}: every dumped member entered #{g.last_common_seq} last; nobody is behind"
    if g.mismatch and g.missing:
        g.verdict += f"; earlier, #{g.mismatch_seq} was entered with different ops or sizes: {g.mismatch}"
    if g.undumped:
        g.verdict += f"; no dump of {_ranks(g.undumped)}: its state is unknown"
    if g.undumped or maybe_members:
        # the dumped members may wait for an undumped one in their last entry here (not known done)
        done = set(_tracked(dumps, dumped))
        # (only where it is the rank's latest entry: one that went on to other collectives is not held here)
        latest = {r: max((e.created_ns for e in dumps[r].entries), default=0) for r in dumped}
        g.maybe_waiting = [FRWaiter(r, by_rank[r][last[r]].created_ns) for r in dumped
                           if last[r] and not (r in done and by_rank[r][last[r]].state == "completed")
                           and by_rank[r][last[r]].created_ns >= latest[r]]
    return g


def _not_completed(by_rank: dict, dumps: dict, dumped: list[int], seq: Optional[int]) -> list[int]:
    """Members whose entry for `seq` is not completed, among those whose dump tracks states (NCCL:
    some entry started or completed; gloo leaves every entry 'scheduled')."""
    if not seq:
        return []
    tracked = _tracked(dumps, dumped)
    return [r for r in tracked if seq in by_rank[r] and by_rank[r][seq].state != "completed"]


def _tracked(dumps: dict, ranks: list[int]) -> list[int]:
    """Ranks whose dump tracks states (NCCL: some entry started or completed; gloo: all 'scheduled')."""
    return [r for r in ranks if any(e.state in ("started", "completed") for e in dumps[r].entries)]


def group_label(axis: str, desc: str, name: str, members: list[int]) -> str:
    """'dp group [0, 2]'; with no axis known, the group by its ranks, description and name."""
    if axis != "unknown":
        return f"{axis} group {members}"
    return f"group {members} ({'' if desc in NO_DESC else desc + ', '}pg {name}, axis unknown)"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def hang_groups(dumps: list[FRDump], groups: dict, grid: JobLayout, absent: list[int] = (),
                guessed: Optional[set] = None) -> list[FRGroup]:
    """Every group's state, the cause first: a group whose missing ranks wait in no collective
    themselves; then the groups stuck because a member waits elsewhere; then mismatches; then the rest.
    `absent`: ranks of the job without a dump; a group whose members were taken from the dumps
    (gloo) may have them as members too, and says so."""
    by = {d.rank: d for d in dumps}
    guessed = (inferred_groups(dumps) if guessed is None else guessed) if absent else set()
    out = []
    for name, (desc, ranks) in groups.items():
        if not ranks:
            continue
        g = group_state(name, desc, ranks, by, grid, tuple(absent) if name in guessed else ())
        if name in guessed:
            g.verdict += (f"; members as the dumps name it (no pg_config): {_ranks(list(absent))} "
                          f"{'has' if len(absent) == 1 else 'have'} no dump and may be one")
        out.append(g)
    inside, maybe = {}, {}
    for g in out:
        for w in g.waiting:
            inside.setdefault(w.rank, g)
        for w in g.maybe_waiting:
            maybe.setdefault(w.rank, g)
    for g in out:
        elsewhere = [r for r in g.missing if r in inside and inside[r] is not g]
        g.blocked = elsewhere
        for r in elsewhere:
            o = inside[r]
            g.verdict += f"; rank {r} itself waits in {group_label(o.axis, o.desc, o.pg, o.ranks)} {o.next_op} #{o.next_seq}"
        for r in g.missing:
            if r not in inside and r in maybe and maybe[r] is not g:
                o = maybe[r]
                e = max((e for e in by[r].entries if e.pg == o.pg and not e.p2p), key=lambda e: e.seq)
                g.verdict += (f"; rank {r} itself may wait in {group_label(o.axis, o.desc, o.pg, o.ranks)} "
                              f"{op_word(e)} #{e.seq}, with {_ranks(o.undumped or list(absent))} that left no dump")
    return sorted(out, key=lambda g: (not g.missing, bool(g.blocked), g.mismatch is None, not g.not_completed,
                                      len(g.ranks)))


def cause_ranks(groups: list[FRGroup], p2p: list = ()) -> list[int]:
    """Ranks some group (or a peer's unmatched send/recv) waits for that wait in no collective or
    point-to-point op themselves: where to look first (not one that may wait beside a rank without a
    dump: its state is not known)."""
    waiting = {w.rank for g in groups for w in g.waiting + g.maybe_waiting} | {w.rank for x in p2p for w in x.waiting}
    wanted = {r for g in groups for r in g.missing} | {x.absent for x in p2p if x.waiting}
    return sorted(wanted - waiting)
