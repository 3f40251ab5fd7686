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
from typing import Optional

from ..layout import axis_name
from ..trace.commtable import group_key
from ..trace.flightrec import FRDump, FREntry
from ..trace.kinds import Coll, op_name
from .bandwidth import message_bytes
from .frresults import FRGroup, FRWaiter
from .layoutfind import JobLayout, find_layout


WORLD = "world"          # FRGroup.axis of torch's default process group


def group_members(dumps: list[FRDump]) -> dict[str, tuple[str, list[int]]]:
    """pg name -> (desc, members): pg_config's ranks where a dump gives them, else the ranks that
    recorded the group (gloo)."""
    desc: dict[str, str] = {}
    given: dict[str, list[int]] = {}
    seen: dict[str, set] = defaultdict(set)
    for d in dumps:
        for name, (ds, ranks) in d.groups.items():
            desc.setdefault(name, ds)
            if ranks:
                given.setdefault(name, ranks)
        for e in d.entries:
            desc.setdefault(e.pg, e.desc)
            seen[e.pg].add(d.rank)
    return {name: (desc.get(name, ""), given.get(name) or sorted(seen[name]))
            for name in sorted(set(given) | set(seen), key=lambda n: (len(n), n))}


def name_axes(dumps: list[FRDump], groups: dict) -> JobLayout:
    """The layout from the groups' descriptions (layoutfind, as for a trace's pg_config)."""
    per_rank: dict[int, list] = defaultdict(list)
    for name, (desc, ranks) in groups.items():
        for r in ranks:
            per_rank[r].append([name, desc, ranks])
    world = max((max(r) + 1 for _, r in groups.values() if r), default=None)
    return find_layout([per_rank[r] for r in sorted(per_rank)], world)


def entry_bytes(e: FREntry, n: int) -> Optional[int]:
    return message_bytes(e.coll, e.in_nelems, e.out_nelems, e.dtype_bytes, n)


def op_word(e: FREntry) -> str:
    """diag's name of the op (trace.kinds.op_name); one it does not know, as the dump spells it."""
    return op_name(e.coll) if e.coll != Coll.UNKNOWN else (e.op.split(":")[-1].split(" ")[0] or e.op)


def _clock(ns: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ns / 1e9))


def size_words(b: Optional[float]) -> str:
    if b is None:
        return "size unknown"
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b / k:.3g} {unit}"
    return f"{b:.0f} B"


def _mismatch(by_rank: dict[int, dict[int, FREntry]], members: list[int], n: int) -> tuple[Optional[int], Optional[str]]:
    """The first collective every member entered with a different op or size, in words."""
    common = set.intersection(*(set(by_rank[r]) for r in members)) if members else set()
    for seq in sorted(common):
        seen = {r: (op_word(by_rank[r][seq]), entry_bytes(by_rank[r][seq], n)) for r in members}
        if len(set(seen.values())) > 1:
            first = seen[members[0]]
            odd = [r for r in members if seen[r] != first]
            r = odd[0]
            return seq, (f"rank {r} entered #{seq} as {seen[r][0]} ({size_words(seen[r][1])}), rank {members[0]} "
                         f"as {first[0]} ({size_words(first[1])})")
    return None, None


def group_state(name: str, desc: str, members: list[int], dumps: dict[int, FRDump], grid: JobLayout) -> FRGroup:
    """Where one group stands, and its verdict line."""
    # the default group is the world, whatever axis has the same members (dp 2 on 2 ranks)
    axis = WORLD if desc == "default_pg" else axis_name(grid.axis_of(group_key(members)))
    dumped = [r for r in members if r in dumps]
    by_rank = {r: {e.seq: e for e in dumps[r].entries if e.pg == name and not e.p2p} for r in dumped}
    last = {r: max(by_rank[r], default=0) for r in dumped}
    g = FRGroup(pg=name, desc=desc, axis=axis, ranks=members, last_common_seq=min(last.values(), default=None),
                undumped=[r for r in members if r not in dumps])
    g.mismatch_seq, g.mismatch = _mismatch(by_rank, dumped, len(members))
    label = f"{axis if axis != 'unknown' else desc or 'group ' + name} group {members}"
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
    elif dumped:
        g.verdict = f"{label}: every dumped member entered #{g.last_common_seq} last; nobody is behind"
    if g.mismatch and g.missing:
        g.verdict += f"; earlier, #{g.mismatch_seq} was entered with different ops or sizes: {g.mismatch}"
    if g.undumped:
        g.verdict += f"; no dump of {_ranks(g.undumped)}: its state is unknown"
    return g


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def hang_groups(dumps: list[FRDump], groups: dict, grid: JobLayout) -> list[FRGroup]:
    """Every group's state, the cause first: a group whose missing ranks wait in no collective
    themselves; then the groups stuck because a member waits elsewhere; then mismatches; then the rest."""
    by = {d.rank: d for d in dumps}
    out = [group_state(name, desc, ranks, by, grid) for name, (desc, ranks) in groups.items() if ranks]
    inside = {}
    for g in out:
        for w in g.waiting:
            inside.setdefault(w.rank, g)
    for g in out:
        elsewhere = [r for r in g.missing if r in inside and inside[r] is not g]
        g.blocked = elsewhere
        for r in elsewhere:
            o = inside[r]
            g.verdict += f"; rank {r} itself waits in {o.verdict.split(':')[0]} {o.next_op} #{o.next_seq}"
    return sorted(out, key=lambda g: (not g.missing, bool(g.blocked), g.mismatch is None, len(g.ranks)))


def cause_ranks(groups: list[FRGroup]) -> list[int]:
    """Ranks some group waits for that wait in no collective themselves: where to look first."""
    waiting = {w.rank for g in groups for w in g.waiting}
    return sorted({r for g in groups for r in g.missing} - waiting)
