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
    out = np.zeros(len(rc), dtype=np.int64)
    order = np.lexsort((rc.start_ns, rc.step))
    acc, step = 0, None
    for i in order.tolist():
        if rc.step[i] != step:
            acc, step = 0, rc.step[i]
        out[i] = acc
        acc += int(m.wait_ns[i])
    return out


def _credits(comms: list[RankComms], matched: list[Matched]):
    """Per matched collective, the rank that made the others wait, and for how long.

    The last to arrive is credited unless it was itself late because it had waited more
    earlier in the step (for a pipeline neighbour or another collective) than the ranks now
    waiting for it: then it only passed a delay on. Pipeline send/recv are the schedule,
    not lateness, and are never credited.
    """
    members = defaultdict(list)
    for rc, m in zip(comms, matched):
        before = _waited_before(rc, m)
        coll = ~np.isin(rc.coll, P2P)
        for i in np.flatnonzero((m.match_id >= 0) & coll):
            members[int(m.match_id[i])].append((rc.rank, int(m.wait_ns[i]), bool(m.last[i]), int(before[i])))
    credits = []
    for mem in members.values():
        last = [x for x in mem if x[2]]
        others = [x for x in mem if not x[2]]
        if not last or not others:
            continue
        rank, _, _, before = last[0]
        delay = float(np.median([w for _, w, _, _ in others]))
        passed_on = before - float(np.median([b for _, _, _, b in others])) >= 0.5 * delay
        if delay >= MIN_DELAY_NS and not passed_on:
            credits.append((rank, delay))
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
