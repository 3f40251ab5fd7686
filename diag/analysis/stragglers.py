"""Stragglers: ranks that make the others wait.

Two kinds of evidence, both from durations (hosts' clocks are not aligned):
- collectives: in each matched collective the rank that arrived last waited least; a rank
  that is last in most matched collectives, by a margin that matters, delays its groups;
- steps: a rank whose median step time is well above the others'.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from .collectives import RankComms
from .matching import Matched
from .results import RankResult, Straggler

MIN_DELAY_NS = 20_000          # a wait under 20 us is noise, not a straggler
MIN_DELAY_SHARE = 0.10         # ... or under 10% of the transfer itself
LAST_SHARE = 0.6               # last in at least 60% of the collectives that waited for someone
MIN_EVENTS = 3
SLOW_STEP = 1.10               # median step 10% above the median of the ranks


def _delays(comms: list[RankComms], matched: list[Matched]):
    """match id -> (last rank, median wait of the others, transfer)."""
    members = defaultdict(list)
    for rc, m in zip(comms, matched):
        for i in np.flatnonzero(m.match_id >= 0):
            members[int(m.match_id[i])].append((rc.rank, int(m.wait_ns[i]), bool(m.last[i]), int(m.transfer_ns[i])))
    out = {}
    for mid, mem in members.items():
        last = [r for r, _, is_last, _ in mem if is_last][0]
        others = [w for r, w, is_last, _ in mem if not is_last]
        out[mid] = (last, float(np.median(others)) if others else 0.0, mem[0][3])
    return out


def collective_stragglers(comms: list[RankComms], matched: list[Matched], steps: int) -> list[Straggler]:
    delays = _delays(comms, matched)
    significant = {mid: v for mid, v in delays.items()
                   if v[1] >= MIN_DELAY_NS and v[1] >= MIN_DELAY_SHARE * max(v[2], 1)}
    if not significant:
        return []
    count, caused = defaultdict(int), defaultdict(float)
    for last, delay, _ in significant.values():
        count[last] += 1
        caused[last] += delay
    out = []
    for rank, n in sorted(count.items(), key=lambda kv: -caused[kv[0]]):
        if n >= MIN_EVENTS and n >= LAST_SHARE * len(significant):
            per_step = f", {caused[rank] * 1e-6 / steps:,.2f} ms per step" if steps else ""
            out.append(Straggler(rank=rank, reason="arrives last at collectives", evidence=(
                f"last to arrive in {n} of {len(significant)} collectives that waited for a rank; "
                f"the others waited {caused[rank] * 1e-6:,.2f} ms in all{per_step} "
                f"(median {np.median([d for l, d, _ in significant.values() if l == rank]) * 1e-3:,.1f} us each)")))
    return out


def step_stragglers(ranks: list[RankResult]) -> list[Straggler]:
    times = {r.rank: r.step_time_s for r in ranks if r.step_time_s}
    if len(times) < 2:
        return []
    med = float(np.median(list(times.values())))
    return [Straggler(rank=r, reason="slow steps",
                      evidence=f"median step {t * 1e3:,.1f} ms vs {med * 1e3:,.1f} ms across ranks ({t / med:.2f}x)")
            for r, t in sorted(times.items()) if med > 0 and t > SLOW_STEP * med]
