"""Collective timings over a whole Flight Recorder buffer, and who is late over time.

The profiler shows a few steps; the Flight Recorder holds the last thousands of collectives of
every group. Instances are matched across their group by (group, sequence number), as the trace
analysis matches them (DESIGN.md, collective bandwidth): where the dumps are timed (NCCL with
TORCH_NCCL_ENABLE_TIMING), the shortest member's duration is the transfer time and gives busbw,
and each member's excess over it is its wait. Gloo records no durations: then busbw is unknown,
said so, never zero.

Lateness: in each instance, how long after the first member each member entered it. From
durations where every member has one (the late member's is the shortest: no clocks involved);
else from the entry times, which assumes the hosts' clocks agree (ranks of one host do; NTP'd
hosts to about a millisecond). The last to enter is credited with each other member's wait for
it, from that member's entry; a member's waits for one rank in collectives in flight at once
(gloo's async gradient buckets) count once, as the time they cover. Summed per rank over windows
of the buffer's time, as the others' wait per second of run, a rank that became late after N
steps shows where it started.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np

from ..trace.columns import median, percentile
from ..trace.flightrec import FRDump, FREntry
from . import intervals as iv
from .bandwidth import busbw
from .frresults import FRLate, FROpTiming
from .hang import entry_bytes, op_word

WINDOWS = 8                    # the buffer's time split in this many windows
LATE_MS_PER_S = 100.0          # others' wait for one rank per second of run that counts as late (10%)
LATE_LEAD = 3.0                # ... and at least this many times any other rank's
LATE_MIN_MS = 50.0             # ... and at least this much in the window (short buffers are all noise)
LATE_WINDOWS = 2               # ... in two windows at least: one hiccup on a shared host is no slowdown
LATE_OF_TYPICAL = 0.3          # ... each at least 30% of its typical late window's (noise before a slowdown)


def instances(dumps: list[FRDump], groups: dict) -> list[tuple[str, list[FREntry], list[int]]]:
    """(pg name, entries, ranks) of each collective every member of its group recorded."""
    rec: dict = defaultdict(dict)
    for d in dumps:
        for e in d.entries:
            if not e.p2p:
                rec[(e.pg, e.seq)][d.rank] = e
    out = []
    for (pg, _), by in rec.items():
        members = groups.get(pg, ("", []))[1]
        if len(members) > 1 and all(r in by for r in members):
            out.append((pg, [by[r] for r in members], members))
    return out


def _offsets_ns(entries: list[FREntry]) -> tuple[np.ndarray, bool]:
    """How long after the first member each entered; (offsets, from durations?)."""
    durs = [e.duration_s for e in entries]
    if all(d is not None for d in durs):
        d = np.array(durs) * 1e9
        return d.max() - d, True
    t = np.array([e.created_ns for e in entries], np.int64)
    return (t - t.min()).astype(float), False


def op_timings(found: list, axis_of: dict) -> list[FROpTiming]:
    """Per axis × op × group size over all matched instances."""
    acc: dict = defaultdict(lambda: {"bytes": [], "transfer": [], "wait": [], "bw": [], "n": 0})
    for pg, entries, members in found:
        n = len(members)
        a = acc[(axis_of.get(pg, "unknown"), op_word(entries[0]), n)]
        a["n"] += 1
        b = entry_bytes(entries[0], n)
        if b is not None:
            a["bytes"].append(b)
        durs = [e.duration_s for e in entries]
        if all(d is not None for d in durs):
            t = min(durs)
            a["transfer"].append(t)
            a["wait"] += [d - t for d in durs]
            bw = busbw(entries[0].coll, b, t, n) if t > 0 else None
            if bw is not None:
                a["bw"].append(bw / 1e9)
    return [_op_stat(key, a) for key, a in sorted(acc.items())]


def _med(xs) -> Optional[float]:
    return float(median(xs)) if xs else None


def _op_stat(key: tuple, a: dict) -> FROpTiming:
    axis, op, n = key
    timed = bool(a["transfer"])
    why = None
    if not timed:
        why = ("the dumps carry no durations: TORCH_NCCL_ENABLE_TIMING=1 on NCCL records them; "
               "gloo records none")
    elif not a["bw"]:
        why = "message size unknown (no sizes or dtype recorded)"
    return FROpTiming(axis=axis, op=op, group_size=n, instances=a["n"], median_bytes=_med(a["bytes"]),
                      transfer_median_s=_med(a["transfer"]),
                      transfer_p95_s=percentile(a["transfer"], 95) if timed else None,
                      wait_median_s=_med(a["wait"]), busbw_median_gbps=_med(a["bw"]), unknown=why)


def late_ranks(found: list) -> tuple[list[FRLate], str, Optional[str], Optional[float]]:
    """Ranks the others wait for, window by window; (late, basis, why unknown, window seconds)."""
    first = {}
    for pg, entries, _ in found:
        first[pg] = min(first.get(pg, entries[0].seq), entries[0].seq)
    # a group's first collective also waits for the slowest process start-up: not a slowdown
    found = [f for f in found if f[1][0].seq != first[f[0]]]
    if not found:
        return [], "", "no collective was recorded by every member of its group", None
    starts = np.array([min(e.created_ns for e in es) for _, es, _ in found], np.int64)
    t0, t1 = int(starts.min()), int(starts.max()) + 1
    edges = np.linspace(t0, t1, WINDOWS + 1)
    width_s = (t1 - t0) / WINDOWS / 1e9
    if width_s <= 0:
        return [], "", "the buffer spans no time", None
    spans: dict = defaultdict(list)     # (late rank, waiting rank) -> [(start, end) ns]
    timed = 0
    for pg, entries, members in found:
        off, from_dur = _offsets_ns(entries)
        timed += from_dur
        last = int(np.argmax(off))
        for j, e in enumerate(entries):     # the others waited for the last to enter: its wait
            if j != last and off[last] > off[j]:
                spans[(members[last], members[j])].append((e.created_ns, e.created_ns + int(off[last] - off[j])))
    lo, hi = edges[:-1].astype(np.int64), edges[1:].astype(np.int64)
    hi[-1] = max(int(hi[-1]), max((b for pairs in spans.values() for _, b in pairs), default=0))
    waited: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(WINDOWS))
    for (late, _), pairs in spans.items():   # collectives in flight at once wait together: time, not a sum
        a = np.array(pairs, dtype=np.int64)
        waited[late] += iv.lengths_in_windows(iv.merge(a[:, 0], a[:, 1]), lo, hi) / 1e6
    basis = ("entry into each collective after its group's first member, " +
             ("from durations (no clocks)" if timed == len(found) else
              "from the hosts' entry times (assumes their clocks agree)") +
             f"; the others' wait per second of run, in {WINDOWS} windows of {width_s:.3g} s")
    return _late(waited, edges, width_s), basis, None, width_s


def _late(waited: dict, edges: np.ndarray, width_s: float) -> list[FRLate]:
    out = []
    ranks = sorted(waited)
    rate = {r: waited[r] / width_s for r in ranks}          # ms of others' wait per s
    for r in ranks:
        others = np.max([rate[o] for o in ranks if o != r], axis=0) if len(ranks) > 1 else np.zeros(WINDOWS)
        late = (rate[r] >= LATE_MS_PER_S) & (rate[r] >= LATE_LEAD * others) & (waited[r] >= LATE_MIN_MS)
        if late.sum() < LATE_WINDOWS:
            continue
        late &= rate[r] >= LATE_OF_TYPICAL * median(rate[r][late])   # a hiccup before a slowdown
        since, until = _episode(late)
        if until - since < LATE_WINDOWS:
            continue
        before = float(rate[r][:since].mean()) if since else 0.0
        during = float(rate[r][since:until].mean())
        out.append(FRLate(rank=r, since_ns=int(edges[since]), until_ns=None if until == WINDOWS else int(edges[until]),
                          waited_before_ms_per_s=before, waited_after_ms_per_s=during,
                          evidence=f"late in windows {since + 1}-{until} of {WINDOWS}"
                                   f"{' (to the end)' if until == WINDOWS else ''}: the others waited "
                                   f"{during:.0f} ms per s of run for it (before: {before:.0f})"))
    return sorted(out, key=lambda x: -x.waited_after_ms_per_s)


def _episode(late: np.ndarray) -> tuple[int, int]:
    """[since, until) fitting late windows best as one step up and, if it ends, one step down:
    the fewest windows on the wrong side, a window off the trend does not move the onset."""
    n, best, cut = len(late), None, (0, 0)
    for a in range(n):
        for b in range(a + 1, n + 1):
            wrong = int(late[:a].sum() + (~late[a:b]).sum() + late[b:].sum())
            if best is None or wrong < best or (wrong == best and b - a > cut[1] - cut[0]):
                best, cut = wrong, (a, b)
    return cut
