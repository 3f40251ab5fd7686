"""Aggregate matched communication instances per parallel axis, op and message size.

busbw uses the transfer time (shortest matched instance) when the whole group's traces
are present; otherwise the rank's own kernel time, which includes waiting, and says so. Its
group size n is the trace's, else the size of a complete match on an inferred group (old
traces name no group). Wait is only measured on matched instances: where none matched it is
unknown (None), not zero.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np

from ..trace.columns import median, percentile
from ..hardware import intra_node_link
from ..trace import kinds
from . import intervals as iv
from .benchcurve import op_name
from .bandwidth import BUCKETS, busbw_array, size_bucket_array
from .collectives import AXES, CALLS, SPANS, RankComms
from .matching import Matched
from .results import AxisOverlap, CommOpStat, RankComm

NS = 1e-9
PLATEAU_SHARE = 0.9          # "on the plateau": at least 90% of the best busbw measured


def _axis_name(a: int) -> str:
    return AXES[a] if 0 <= a < len(AXES) else "unknown"


def _concat(comms: list[RankComms], matched: list[Matched]) -> dict:
    cols = {k: np.concatenate([getattr(rc, k) for rc in comms]) if comms else np.zeros(0)
            for k in ("coll", "axis", "group_size", "nbytes", "dur_ns", "exposed_ns", "step")}
    cols["rank"] = np.concatenate([np.full(len(rc), rc.rank) for rc in comms]) if comms else np.zeros(0)
    for k in ("transfer_ns", "wait_ns", "complete", "match_id"):
        cols[k] = np.concatenate([getattr(m, k) for m in matched]) if matched else np.zeros(0)
    found = np.concatenate([m.group_size for m in matched]) if matched else np.zeros(0)
    cols["group_size"] = np.where(cols["group_size"] > 0, cols["group_size"], found)   # the trace's first
    return cols


def _wait_s(wait_ns: np.ndarray, match_id: np.ndarray, n_ranks: int) -> Optional[float]:
    """Wait per rank over the instances given; None when none of them was matched (unmeasured)."""
    if not (match_id >= 0).any():
        return None
    return float(wait_ns.sum()) * NS / max(n_ranks, 1)


def op_stats(comms: list[RankComms], matched: list[Matched], n_ranks: int,
             device: Optional[str], link_gbps: Optional[float], bench=None) -> list[CommOpStat]:
    """bench: a measured busbw curve (analysis.benchcurve.BenchCurve), or None."""
    c = _concat(comms, matched)
    if c["coll"].size == 0:
        return []
    bucket = size_bucket_array(c["nbytes"])
    use_transfer = c["complete"].astype(bool) & (c["transfer_ns"] > 0)
    secs = np.where(use_transfer, c["transfer_ns"], c["dur_ns"]) * NS
    bw = busbw_array(c["coll"], c["nbytes"], secs, c["group_size"]) / 1e9
    link = intra_node_link(device) if link_gbps is None else ("given", link_gbps * 1e9)
    groups = defaultdict(list)
    for i, key in enumerate(zip(c["axis"].tolist(), c["coll"].tolist(), bucket.tolist())):
        groups[key].append(i)
    out = []
    for (axis, coll, b), idx in groups.items():
        idx = np.array(idx)
        valid = np.isfinite(bw[idx]) & (bw[idx] > 0)
        transfer = use_transfer[idx][valid]
        basis = None
        vals = bw[idx][valid]
        if vals.size:
            if transfer.any():
                vals, basis = vals[transfer], "transfer"
            else:
                basis = "kernel (includes wait)"
        ranks = len(set(c["rank"][idx].tolist()))
        med = float(median(vals)) if vals.size else None
        nb = c["nbytes"][idx]
        peak = link[1] / 1e9 if link else None
        out.append(CommOpStat(
            axis=_axis_name(axis), op=kinds.op_name(coll),
            size_bucket=BUCKETS[b] if 0 <= b < len(BUCKETS) else "unknown", calls=int(idx.size), ranks=ranks,
            median_bytes=float(median(nb[nb >= 0])) if (nb >= 0).any() else None,
            time_s=float(c["dur_ns"][idx].sum()) * NS / max(n_ranks, 1),
            exposed_s=float(c["exposed_ns"][idx].sum()) * NS / max(n_ranks, 1),
            wait_s=_wait_s(c["wait_ns"][idx], c["match_id"][idx], n_ranks),
            busbw_median_gbps=med, busbw_p95_gbps=percentile(vals, 95) if vals.size else None,
            busbw_basis=basis, link=link[0] if link else None, link_peak_gbps=peak,
            efficiency=med / peak if med is not None and peak else None,
            group_size=_median_size(c["group_size"][idx])))
    if bench is not None:
        for o in out:
            _against_bench(o, bench)
    out.sort(key=lambda s: -s.exposed_s)
    return out


def busbw_unknown_notes(ops: list[CommOpStat]) -> list[str]:
    """Why a collective's busbw is "-": its message size, or its group size, is not in the traces."""
    named = lambda xs: ", ".join(dict.fromkeys(f"{o.axis}:{o.op}" for o in xs))  # noqa: E731 - once each
    no_bytes = [o for o in ops if o.busbw_median_gbps is None and o.median_bytes is None]
    no_n = [o for o in ops if o.busbw_median_gbps is None and o.median_bytes is not None and o.group_size is None]
    notes = [f"busbw unknown for {named(no_bytes)}: the traces record no message size (neither NCCL's "
             "`In msg nelems` nor the ops' `Input Dims`: torch.profiler's record_shapes=True)"] if no_bytes else []
    if no_n:
        notes.append(f"busbw unknown for {named(no_n)}: the group size is unknown (the traces name no group, "
                     "and the instances were not matched across all ranks)")
    return notes


def _median_size(n: np.ndarray) -> Optional[int]:
    known = n[n > 0]
    return int(median(known)) if known.size else None


def _against_bench(o: CommOpStat, bench) -> None:
    """Achievable busbw at the same axis, op and message size, and the share training got."""
    if o.median_bytes is None or o.axis == "unknown":
        return
    o.achievable_gbps = bench.busbw_at(o.axis, o.op, o.median_bytes)
    if o.achievable_gbps and o.busbw_median_gbps is not None:
        o.bench_efficiency = o.busbw_median_gbps / o.achievable_gbps
    pts = bench.points.get((o.axis, op_name(o.op)))          # [(bytes, bytes/s)] sorted by size
    if pts:
        top = max(bw for _, bw in pts)
        o.plateau_gbps = top / 1e9
        o.plateau_bytes = float(min(size for size, bw in pts if bw >= PLATEAU_SHARE * top))


def axis_overlap(comms: list[RankComms], n_ranks: int, steps: int) -> list[AxisOverlap]:
    """Per axis, mean over ranks of its communication timeline (union), the share of it under
    compute (hidden_ratio, the axis's own), and its exposed time as a partition of the rank's:
    an exposed instant two axes share (a TP call while a DP transfer is in flight) is counted
    once, for the axis whose call the issuing thread is in, else the first axis in order; so the
    axes' exposed times add up to no more than the rank's."""
    axes = sorted({int(a) for rc in comms for a in rc.axis.tolist()})
    dur, own, part = ({a: 0 for a in axes} for _ in range(3))
    for rc in comms:
        claimed = iv.EMPTY
        for cols in (CALLS, SPANS):
            for a in axes:
                sel = rc.axis == a
                if cols is SPANS:
                    u = rc.timeline(sel)          # its spans, its issuer's waits on them and calls
                    dur[a] += iv.length(u)
                    own[a] += iv.length(iv.subtract(u, rc.compute))
                mine = iv.subtract(iv.subtract(rc.timeline(sel, cols), rc.compute), claimed)
                part[a] += iv.length(mine)
                claimed = iv.union(claimed, mine)
    out = []
    k = NS / max(n_ranks, 1)
    for a in axes:
        dur_s, own_s, exp_s = dur[a] * k, own[a] * k, part[a] * k
        out.append(AxisOverlap(axis=_axis_name(a), comm_s=dur_s, exposed_s=exp_s,
                               hidden_ratio=(dur_s - own_s) / dur_s if dur_s > 0 else None,
                               exposed_per_step_s=exp_s / steps if steps else None))
    out.sort(key=lambda x: -x.exposed_s)
    return out


def _waited_s(rc: RankComms, m: Matched) -> Optional[float]:
    """The time a rank spent waiting for the last of its matches, over the window: the union of
    [start, start + wait] of its instances (collectives in flight at once, gloo's async DP
    buckets for one, wait for the late rank together: their waits are not added up); None when
    none of its instances was matched (unmeasured)."""
    if not (m.match_id >= 0).any():
        return None
    waiting = np.flatnonzero(m.wait_ns > 0)
    start = rc.start_ns[waiting].astype(np.int64)
    return iv.length(iv.merge(start, start + m.wait_ns[waiting].astype(np.int64))) * NS


def rank_comm(comms: list[RankComms], matched: list[Matched]) -> list[RankComm]:
    return [RankComm(rank=rc.rank, comm_s=float(rc.dur_ns.sum()) * NS, exposed_s=float(rc.exposed_ns.sum()) * NS,
                     wait_s=_waited_s(rc, m), matched=int((m.match_id >= 0).sum()),
                     arrived_last=int(m.last.sum()))
            for rc, m in zip(comms, matched)]
