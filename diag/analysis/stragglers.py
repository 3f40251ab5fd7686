"""Stragglers: ranks that make the others wait.

Two kinds of evidence, both from durations (hosts' clocks are not aligned):
- collectives: in each matched collective the rank that arrived last waited least; a rank
  that is last in most of them, and not because it had itself waited earlier in the step
  (a pipeline neighbour or another collective delayed it), delays its groups;
- steps: a rank whose median step time is well above the others'.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..trace.kinds import Coll
from .collectives import RankComms
from .matching import Matched
from .results import RankResult, Straggler

P2P = (Coll.SEND, Coll.RECV, Coll.SEND_RECV)

MIN_DELAY_NS = 20_000          # a wait under 20 us is noise, not a straggler
LAST_SHARE = 0.6               # credited with at least 60% of the delays
MIN_EVENTS = 3
SLOW_STEP = 1.10               # median step 10% above the median of the ranks


def _waited_before(rc: RankComms, m: Matched) -> np.ndarray:
    """Per instance: ns this rank already spent waiting earlier in the same step."""
    order = np.lexsort((rc.start_ns, rc.step))
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
    """Per matched collective, the rank that made the others wait, and for how long.

    The last to arrive is credited unless it was itself late because it had waited more
    earlier in the step (for a pipeline neighbour or another collective) than the ranks now
    waiting for it: then it only passed a delay on. Pipeline send/recv are the schedule,
    not lateness, and are never credited.
    """
    cols = {k: [] for k in ("mid", "rank", "wait", "last", "before")}
    for rc, m in zip(comms, matched):
        sel = np.flatnonzero((m.match_id >= 0) & ~np.isin(rc.coll, P2P))
        cols["mid"].append(m.match_id[sel])
        cols["rank"].append(np.full(sel.size, rc.rank, np.int64))
        cols["wait"].append(m.wait_ns[sel])
        cols["last"].append(m.last[sel])
        cols["before"].append(_waited_before(rc, m)[sel])
    if not any(c.size for c in cols["mid"]):
        return []
    mid, rank, wait, last, before = (np.concatenate(cols[k]) for k in ("mid", "rank", "wait", "last", "before"))
    n = int(mid.max()) + 1
    # the (first) last-arriver of each match, and the medians of the others
    lasts = np.flatnonzero(last)
    first_last = np.full(n, -1, np.int64)
    with_last, at = np.unique(mid[lasts], return_index=True)    # the earliest entry of each
    first_last[with_last] = lasts[at]
    has_others = np.bincount(mid[~last], minlength=n) > 0
    delay = _group_medians(mid[~last], wait[~last], n)
    others_before = _group_medians(mid[~last], before[~last], n)
    credits = []
    for a in np.flatnonzero((first_last >= 0) & has_others).tolist():
        i = first_last[a]
        passed_on = before[i] - others_before[a] >= 0.5 * delay[a]
        if delay[a] >= MIN_DELAY_NS and not passed_on:
            credits.append((int(rank[i]), float(delay[a])))
    return credits


def collective_stragglers(comms: list[RankComms], matched: list[Matched], steps: int) -> list[Straggler]:
    credits = _credits(comms, matched)
    if not credits:
        return []
    count, caused = defaultdict(int), defaultdict(float)
    for rank, delay in credits:
        count[rank] += 1
        caused[rank] += delay
    out = []
    for rank, n in sorted(count.items(), key=lambda kv: -caused[kv[0]]):
        if n >= MIN_EVENTS and n >= LAST_SHARE * len(credits):
            per_step = f", {caused[rank] * 1e-6 / steps:,.2f} ms per step" if steps else ""
            out.append(Straggler(rank=rank, reason="arrives last at collectives", evidence=(
                f"last to arrive, and not for waiting itself, in {n} of {len(credits)} collectives that "
                f"waited {MIN_DELAY_NS // 1000} us or more for a rank; the others waited "
                f"{caused[rank] * 1e-6:,.2f} ms in all{per_step}")))
    return out


def step_stragglers(ranks: list[RankResult]) -> list[Straggler]:
    times = {r.rank: r.step_time_s for r in ranks if r.step_time_s}
    if len(times) < 2:
        return []
    med = float(np.median(list(times.values())))
    return [Straggler(rank=r, reason="slow steps",
                      evidence=f"median step {t * 1e3:,.1f} ms vs {med * 1e3:,.1f} ms across ranks ({t / med:.2f}x)")
            for r, t in sorted(times.items()) if med > 0 and t > SLOW_STEP * med]
