"""Stragglers: ranks that make the others wait, one rank or a set of them.

Two kinds of evidence, both from durations (hosts' clocks are not aligned):
- collectives: in each matched collective the rank that arrived last waited least; it is
  credited with the others' wait unless it was itself late for having waited earlier in the
  step (a pipeline neighbour or another collective delayed it). The straggler is the smallest
  set of ranks that together caused most of the credited delay: one rank; a few that take
  turns arriving last (each host-bound in its own moments); or the ranks of one slow node,
  which the traces may say (their header's `host_name`, Kineto's since 2024, else Kineto's default
  file name `<host>_<pid>.<ns>.pt.trace.json`; `localhost` names no one machine);
- steps: a rank whose median step time is well above the others'.
When no collective could be matched across ranks, nobody can tell who is late: that is said,
not "no straggler".
"""
from __future__ import annotations

import os
import re
from collections import defaultdict
from typing import Optional

import numpy as np

from ..trace.columns import median
from ..trace.kinds import Coll
from . import intervals as iv
from .collectives import RankComms
from .matching import Matched
from .results import RankResult, Straggler, StragglerBasis, StragglerKind

P2P = (Coll.SEND, Coll.RECV, Coll.SEND_RECV)

MIN_DELAY_NS = 20_000          # a wait under 20 us is noise, not a straggler
SET_SHARE = 0.6                # the set caused at least 60% of the credited delay
CORE_SHARE = 0.4               # or a smaller set standing far above the rest caused at least 40% of it
MAX_SET_SHARE = 0.5            # ... and is at most half of the ranks analysed
SET_LIFT = 1.5                 # ... with a share of the delay 1.5x its share of the ranks, at least
SET_GAP = 2.0                  # ... and its least member caused twice what any rank outside it did
TIE_SHARE = 0.8                # a rank that caused 80% of the least member's delay is one of them
MEMBER_SHARE = 0.25            # each member caused a quarter of an even split of the set's delay, at least
MAX_ARRIVALS = 200             # late arrivals carried per straggler (the largest delays): enough to find them
MIN_EVENTS = 3                 # ... and was last in three collectives, at least
SLOW_STEP = 1.10               # median step 10% above the median of the ranks
# torch.profiler.tensorboard_trace_handler names a file "<hostname>_<pid>.<time_ns>.pt.trace.json"
KINETO_FILE = re.compile(r"^(.+)_\d+\.\d+\.pt\.trace\.json(?:\.gz)?$")


def _step_order(rc: RankComms) -> np.ndarray:
    """A rank's instances in the order it ran them: by step, then start."""
    return np.lexsort((rc.start_ns, rc.step))


def _waited_before(rc: RankComms, m: Matched, order: np.ndarray) -> np.ndarray:
    """Per instance: ns this rank already spent waiting earlier in the same step (`order`:
    `_step_order(rc)`)."""
    wait = m.wait_ns[order].astype(np.int64)
    run = np.cumsum(wait) - wait                                 # waited before, over all steps
    step = rc.step[order]
    first = np.r_[True, step[1:] != step[:-1]] if step.size else np.zeros(0, bool)
    starts = np.flatnonzero(first)
    run -= np.repeat(run[starts], np.diff(np.r_[starts, step.size]))   # ... within its step
    out = np.empty(len(rc), np.int64)
    out[order] = run
    return out


def _group_medians(key: np.ndarray, value: np.ndarray, groups: int) -> np.ndarray:
    """np.median of value per key in 0..groups-1 (NaN where a key has none), sorted once."""
    out = np.full(groups, np.nan)
    if key.size == 0:
        return out
    order = np.lexsort((value, key))
    k, v = key[order], value[order].astype(np.float64)
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    n = np.diff(np.r_[starts, k.size])
    out[k[starts]] = (v[starts + (n - 1) // 2] + v[starts + n // 2]) / 2
    return out


def _credits(comms: list[RankComms], matched: list[Matched]):
    """(credits, roots).

    credits: per matched collective, the rank that made the others wait, for how long, and where
    its instance is: (rank, delay ns, index into comms, instance index). The last to arrive is
    credited unless it was itself late because it had waited more earlier in the step (for a
    pipeline neighbour or another collective) than the ranks now waiting for it: then it only
    passed a delay on. Pipeline send/recv are the schedule, not lateness, and are never credited.

    roots: per matched collective or pipeline send/recv whose wait has a cause, (the rank at the
    root of it, ((waiting rank, when its wait for the root began, ns on its own clock, that
    wait, ns), ...)). The root is the last arriver, unless it passed a delay on: then the root
    of the match it waited in longest earlier in the step. A rank late for TP makes its TP peer
    late for DP, and late to send to the next stage: those waits are the late rank's too, each
    up to the delay passed on (the root's, or less where a link of the chain was shorter); the
    rest of a longer wait is the waiting rank's own (a pipeline's fill). A late rank's own
    pipeline send counts up to the longest delay it caused at a collective in that step. A
    chain that reaches a wait nobody caused has none.
    """
    cols = {k: [] for k in ("mid", "rank", "wait", "last", "before", "ri", "ii", "start", "p2p")}
    orders = [_step_order(rc) for rc in comms]
    for ri, (rc, m) in enumerate(zip(comms, matched)):
        sel = np.flatnonzero(m.match_id >= 0)
        cols["p2p"].append(np.isin(rc.coll[sel], P2P))
        cols["mid"].append(m.match_id[sel])
        cols["rank"].append(np.full(sel.size, rc.rank, np.int64))
        cols["wait"].append(m.wait_ns[sel])
        cols["last"].append(m.last[sel])
        cols["before"].append(_waited_before(rc, m, orders[ri])[sel])
        cols["ri"].append(np.full(sel.size, ri, np.int64))
        cols["ii"].append(sel)
        cols["start"].append(rc.start_ns[sel])
    if not any(c.size for c in cols["mid"]):
        return [], []
    mid, rank, wait, last, before, ri, ii, start, p2p = (
        np.concatenate(cols[k]) for k in ("mid", "rank", "wait", "last", "before", "ri", "ii", "start", "p2p"))
    n = int(mid.max()) + 1
    # the (first) last-arriver of each match, and the medians of the others
    lasts = np.flatnonzero(last)
    first_last = np.full(n, -1, np.int64)
    with_last, at = np.unique(mid[lasts], return_index=True)    # the earliest entry of each
    first_last[with_last] = lasts[at]
    has_others = np.bincount(mid[~last], minlength=n) > 0
    delay = _group_medians(mid[~last], wait[~last], n)
    others_before = _group_medians(mid[~last], before[~last], n)
    waiting = np.flatnonzero(~last)
    waiting = waiting[np.argsort(mid[waiting], kind="stable")]      # the waiting entries by match
    waiting_mid = mid[waiting]
    cause: dict = {}             # match -> (last arriver's entry, passed on)
    credits = []
    for a in np.flatnonzero((first_last >= 0) & has_others).tolist():
        i = first_last[a]
        if delay[a] < MIN_DELAY_NS:
            continue
        passed_on = bool(before[i] - others_before[a] >= 0.5 * delay[a])
        cause[a] = (i, passed_on)
        if not passed_on and not p2p[i]:      # a pipeline transfer is the schedule: never credited
            credits.append((int(rank[i]), float(delay[a]), int(ri[i]), int(ii[i])))
    earlier = _LongestEarlierWait(comms, matched, orders)
    late_by: dict = {}           # (rank, step) -> the longest delay it was credited with at a collective
    for r, d, i_r, i_i in credits:
        key = (r, int(comms[i_r].step[i_i]))
        late_by[key] = max(late_by.get(key, 0.0), d)
    root: dict = {}              # match -> (root rank, the delay it carries, ns) or None

    def root_of(a: int) -> Optional[tuple[int, float]]:
        chain = []
        while a in cause and a not in root and a not in chain:
            chain.append(a)
            i, passed_on = cause[a]
            if not passed_on:                # a late sender's own transfer: as late as at its collectives
                cap = late_by.get((int(rank[i]), int(comms[ri[i]].step[ii[i]])), 0.0) if p2p[i] else np.inf
                root[a] = (int(rank[i]), min(float(delay[a]), cap))
                break
            a = earlier.match(int(ri[i]), int(ii[i]))
        found = root.get(a)
        for b in reversed(chain):            # a delay passed on is at most the one it came from
            if found is not None and b not in root:
                found = (found[0], min(float(delay[b]), found[1]))
            root[b] = found
        return root.get(chain[0]) if chain else found

    roots = []
    for a in cause:
        r = root_of(a)
        if r is not None:
            w = waiting[np.searchsorted(waiting_mid, a):np.searchsorted(waiting_mid, a, side="right")]
            own = not cause[a][1] and not p2p[first_last[a]]    # the root's own collective: all of it
            caused = (wait[w] if own else np.minimum(wait[w], r[1])).astype(np.int64)   # the late tail
            roots.append((r[0], tuple(zip(rank[w].tolist(), (start[w] + wait[w] - caused).tolist(),
                                          caused.tolist()))))
    return credits, roots


class _LongestEarlierWait:
    """The match in which a rank waited longest earlier in an instance's step (-1: none over
    MIN_DELAY_NS), on that rank's own order of instances."""

    def __init__(self, comms: list[RankComms], matched: list[Matched], orders: list[np.ndarray]) -> None:
        self.comms, self.matched, self.orders, self.index = comms, matched, orders, {}

    def match(self, ri: int, ii: int) -> int:
        rc, m, order = self.comms[ri], self.matched[ri], self.orders[ri]
        if ri not in self.index:           # each instance's place in the order, and the steps in it
            pos = np.empty_like(order)
            pos[order] = np.arange(order.size)
            self.index[ri] = pos, rc.step[order]
        pos, steps = self.index[ri]
        lo = int(np.searchsorted(steps, rc.step[ii], side="left"))
        before = order[lo:pos[ii]]
        if not before.size:
            return -1
        j = before[int(np.argmax(m.wait_ns[before]))]
        return int(m.match_id[j]) if m.wait_ns[j] >= MIN_DELAY_NS else -1


def others_wait_s(roots: list, members: list[int], ranks: list[int]) -> Optional[float]:
    """What the ranks outside the set lost waiting for it, mean per rank over the window
    (seconds): each one's waits in the matches whose root is a member (`_credits`), as time
    (the union of [start, start + wait] of its instances: collectives in flight at once, gloo's
    async DP buckets for one, wait for the late rank together), summed over them and divided by
    the number of ranks outside the set: about what the step would shorten by if the set were on
    time. A rank outside every group with a member waited nothing for it; members waiting for
    each other (ranks taking turns) are not counted. None when every rank is in the set."""
    outside = [r for r in ranks if r not in members]
    if not outside:
        return None
    inside = set(members)
    spans: dict = {}
    for r0, waits in roots:
        if r0 in inside:
            for r, t, w in waits:
                if r not in inside and w > 0:
                    spans.setdefault(r, []).append((t, t + w))
    waited = 0
    for pairs in spans.values():
        a = np.array(pairs, dtype=np.int64)
        waited += iv.length(iv.merge(a[:, 0], a[:, 1]))
    return waited * 1e-9 / len(outside)


def _tally(credits: list) -> tuple[dict, dict]:
    """Per rank: how many collectives it delayed, and the delay it caused (ns)."""
    count, caused = defaultdict(int), defaultdict(float)
    for rank, delay, *_ in credits:
        count[rank] += 1
        caused[rank] += delay
    return count, caused


def smallest_set(count: dict, caused: dict, n_ranks: int) -> list[int]:
    """The fewest ranks that together caused SET_SHARE of the delay, with any rank that caused
    nearly as much as the least of them (equals are not left out at random), ascending; [] when
    no set is worth naming: a member with under MIN_EVENTS collectives or under MEMBER_SHARE of
    an even split of the set's delay, or a set of several that does not stand out."""
    total = sum(caused.values())
    order = sorted(caused, key=lambda r: (-caused[r], r))        # the biggest first: the fewest members
    cum = np.cumsum([caused[r] for r in order])
    k = int(np.searchsorted(cum, SET_SHARE * total)) + 1
    k += sum(caused[r] >= TIE_SHARE * caused[order[k - 1]] for r in order[k:])
    members, share = order[:k], cum[k - 1] / total
    next_one = caused[order[k]] if k < len(order) else 0.0      # the biggest outside the set
    if k > 1 and not _stands_out(k, share, caused[order[k - 1]], next_one, n_ranks):
        # the 60% set is noise-like; a smaller set that still caused most of the delay and stands
        # far above every other rank is the straggler (one rank asleep among ranks jittering by turns)
        k = next((j for j in range(1, k) if cum[j - 1] >= CORE_SHARE * total and _stands_out(
            j, cum[j - 1] / total, caused[order[j - 1]], caused[order[j]], n_ranks)), 0)
        if not k:
            return []
        members, share = order[:k], cum[k - 1] / total
    even = share * total / k
    if any(count[r] < MIN_EVENTS or caused[r] < MEMBER_SHARE * even for r in members):
        return []
    return sorted(members)


def _stands_out(k: int, share: float, least: float, next_one: float, n_ranks: int) -> bool:
    """A set of k ranks is a straggler, not the noise of many ranks late by turns, when it is at
    most MAX_SET_SHARE of the ranks, its share of the delay is SET_LIFT times its share of the
    ranks, and its least member caused SET_GAP times what the next rank outside it did."""
    return (k <= MAX_SET_SHARE * n_ranks and share >= SET_LIFT * k / max(n_ranks, 1)
            and least >= SET_GAP * next_one)


def _block(ranks: list[int]) -> bool:
    """Three or more consecutive ranks (ascending)."""
    return len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1))


def rank_span(ranks: list[int]) -> str:
    """[8, ..., 15] -> '8-15'; [3, 6] -> '3 and 6'; [1, 5, 9] -> '1, 5 and 9'."""
    if _block(ranks):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


ANY_HOST = re.compile(r"^(localhost(\.localdomain)?|127\.0\.0\.1|::1)?$", re.I)   # names every machine may have


def _named_host(path: str) -> Optional[str]:
    """The host Kineto's default file name (`<host>_<pid>.<ns>.pt.trace.json`) gives; None: other names."""
    m = KINETO_FILE.match(os.path.basename(path))
    return m.group(1) if m else None


def file_host(path: str, header_host: Optional[str] = None) -> Optional[str]:
    """The host a trace was taken on: its header's host_name, else Kineto's default file name's;
    None where neither names one machine (no name, or `localhost`, which containers on different
    machines may all be called)."""
    host = header_host or _named_host(path)
    return None if host is None or ANY_HOST.match(host) else host


def rank_hosts(ranks: list[RankResult], hosts: Optional[list] = None) -> dict[int, str]:
    """Rank -> host: `hosts` (one per rank, in order: file_host of each trace, its header's host_name
    else its Kineto file name), else the file names alone; {} unless every rank's says it."""
    named = hosts if hosts is not None else [file_host(r.file) for r in ranks]
    out = {r.rank: h for r, h in zip(ranks, named) if h}
    return out if len(out) == len(ranks) else {}


def _node_of(members: list[int], hosts: dict[int, str]) -> Optional[str]:
    """The host whose analysed ranks are exactly `members`, in a job of two or more hosts."""
    on = {hosts.get(r) for r in members}
    if len(set(hosts.values())) < 2 or len(on) != 1 or None in on:
        return None
    host = on.pop()
    return host if sorted(r for r, h in hosts.items() if h == host) == members else None


def _shape(members: list[int], hosts: dict[int, str]) -> tuple[StragglerKind, str, str, Optional[str]]:
    """(kind, who, reason, node) of a set of late ranks."""
    if len(members) == 1:
        return StragglerKind.RANK, f"rank {members[0]}", "arrives last at collectives", None
    who = f"ranks {rank_span(members)}"
    node = _node_of(members, hosts)
    if node:
        return (StragglerKind.NODE, f"{who} (node {node})", f"arrive last at collectives: every rank of node "
                f"{node} and no other (hosts from the traces' headers or file names)", node)
    if _block(members) and not hosts:
        return (StragglerKind.BLOCK, f"{who} (one node?)", f"arrive last at collectives: a contiguous block of "
                f"{len(members)} ranks, one node? (the traces do not say which host each rank ran on)", None)
    on = f" (on {', '.join(sorted({hosts[r] for r in members}))})" if hosts else ""
    return StragglerKind.TURNS, who, "take turns arriving last at collectives" + on, None


def _evidence(members: list[int], count: dict, caused: dict, credits: int, steps: int,
              others_s: Optional[float]) -> str:
    floor = f"{credits} collectives that waited {MIN_DELAY_NS // 1000} us or more for a rank"
    them = "it" if len(members) == 1 else "them"
    waited = "" if others_s is None else (
        f"; the other ranks waited {others_s * 1e3:,.2f} ms each for {them}"
        + (f", {others_s * 1e3 / steps:,.2f} ms per step" if steps else ""))
    if len(members) == 1:
        return f"last to arrive, and not for waiting itself, in {count[members[0]]} of {floor}{waited}"
    each = [count[r] for r in members]
    split = (", ".join(f"rank {r}: {count[r]}" for r in members) if len(members) <= 4
             else f"{min(each)} each" if min(each) == max(each) else f"{min(each)} to {max(each)} each")
    share = sum(caused[r] for r in members) / sum(caused.values())
    return (f"between them last to arrive, and not for waiting itself, in {sum(each)} of {floor} ({split}), "
            f"{100 * share:.0f}% of the delay credited to a late rank (each collective's waiting ranks' "
            f"median wait){waited}")


def collective_stragglers(comms: list[RankComms], matched: list[Matched], steps: int,
                          hosts: Optional[dict] = None) -> list[Straggler]:
    """The set of ranks the others wait for at collectives ([] or one Straggler); hosts: rank -> host."""
    credits, roots = _credits(comms, matched)
    if not credits:
        return []
    count, caused = _tally(credits)
    members = smallest_set(count, caused, len(comms))
    if not members:
        return []
    kind, who, reason, node = _shape(members, hosts or {})
    others_s = others_wait_s(roots, members, [rc.rank for rc in comms])
    return [Straggler(rank=max(members, key=lambda r: caused[r]), reason=reason,
                      evidence=_evidence(members, count, caused, len(credits), steps, others_s),
                      ranks=members, kind=kind, who=who, node=node, arrivals=_arrivals(comms, credits, members),
                      others_wait_s=others_s)]


def _arrivals(comms: list[RankComms], credits: list, members: list[int]) -> list[list]:
    """[rank, ts_us, dur_us] of the members' late instances, on each one's own trace clock (the
    file's ts): the largest delays first, up to MAX_ARRIVALS, then in time order."""
    mine = sorted((c for c in credits if c[0] in members), key=lambda c: -c[1])[:MAX_ARRIVALS]
    out = []
    for rank, _, ri, ii in mine:
        rc = comms[ri]
        out.append([rank, rc.clock0_us + int(rc.start_ns[ii]) / 1000.0, int(rc.dur_ns[ii]) / 1000.0])
    return sorted(out)


def cannot_tell(comms: list[RankComms], matched: list[Matched], world: Optional[int]) -> Optional[str]:
    """Why collectives cannot say who is late, on a job of two or more ranks with collectives;
    None when they can (or there are none: pipeline send/recv are never credited)."""
    colls = [~np.isin(rc.coll, P2P) for rc in comms]
    if max(world or 0, len(comms)) < 2 or not any(c.any() for c in colls):
        return None
    if any(((m.match_id >= 0) & c).any() for c, m in zip(colls, matched)):
        return None
    return "no collective could be matched across ranks"


def step_stragglers(ranks: list[RankResult]) -> list[Straggler]:
    times = {r.rank: r.step_time_s for r in ranks if r.step_time_s}
    if len(times) < 2:
        return []
    med = float(median(list(times.values())))
    return [Straggler(rank=r, reason="slow steps",
                      evidence=f"median step {t * 1e3:,.1f} ms vs {med * 1e3:,.1f} ms across ranks ({t / med:.2f}x)",
                      basis=StragglerBasis.STEPS)
            for r, t in sorted(times.items()) if med > 0 and t > SLOW_STEP * med]
