"""Measured memory: each rank's peak and its curve, from the trace's `[memory]` events.

Problem: whether a change fits depends on what a rank really holds at its peak; the memory model
(diag.advise.memory) is only as good as the measured peak it is calibrated on. A trace recorded
with `profile_memory=True` carries the allocator's running total after every allocation and free
(trace.memevents); the peak over the analysed window is the largest of them, on the device the
rank computes on (its GPU; the CPU for a CPU-only run). The curve is cut into CURVE_POINTS time
buckets and keeps each bucket's largest total, so the peak is always one of its points.

Per rank (RankMemory, in the rank's summary) here; over the job (MemoryUsage: per rank, one curve
per pipeline stage, and the source of the job's peak) in `memory_usage`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import field
from typing import Optional

import numpy as np

from ..trace.memevents import CPU
from ..trace.table import RankTrace
from .results import MemoryCurve, MemoryUsage, RankPeak
from .steps import Window
from ..record import record

CURVE_POINTS = 300
# The CPU allocator's total in the profiler starts at zero when the profiler does (c10's
# ProfiledCPUMemoryReporter counts only blocks it saw allocated); CUDA's caching allocator reports
# its own running total, everything the process holds on the device.
GPU_OR_GIVEN = ("a GPU run's trace with profile_memory=True, or diag_run.json's peak_memory_bytes, would make "
                "the peak known")
CPU_LOWER_BOUND = ("the CPU allocator's total in a trace counts only what was allocated while the profiler "
                   "recorded, not the weights and optimizer states made before: a lower bound, not used to "
                   "calibrate the memory model")
HOW_TO_MEASURE = ("record the trace with torch.profiler's profile_memory=True (its `[memory]` events), "
                  "or give the peak in diag_run.json's peak_memory_bytes (the instrumented trainer writes it on GPU)")


def _empty() -> np.ndarray:
    return np.zeros(0, np.int64)


@record
class RankMemory:
    """One rank's measured memory, from its trace alone."""

    device: Optional[str] = None       # whose allocator: "GPU 0", "CPU"
    peak_bytes: int = -1               # the largest Total Allocated in the window; -1: unknown (see why)
    events: int = 0                    # memory events of that device in the window
    t_ns: np.ndarray = field(default_factory=_empty)        # each point's time after origin
    allocated: np.ndarray = field(default_factory=_empty)   # each bucket's largest Total Allocated
    why: Optional[str] = None          # why peak_bytes is unknown


def compute_device(rt: RankTrace) -> Optional[int]:
    """The GPU a rank computes on (the one most of its GPU events ran on); None without GPU events."""
    t = rt.events
    gpu = t.device[t.gpu_mask()]
    return int(Counter(gpu.tolist()).most_common(1)[0][0]) if gpu.size else None


def _device_rows(rt: RankTrace, gpu: bool) -> tuple[np.ndarray, str]:
    """The memory events of the rank's compute device, and its name."""
    m = rt.memory
    if not gpu:
        return np.flatnonzero(m.device_type == CPU), "CPU"
    on_gpu = m.device_type != CPU
    ids = Counter(m.device_id[on_gpu].tolist())
    dev = compute_device(rt)
    if dev not in ids and ids:
        dev = ids.most_common(1)[0][0]          # Kineto's GPU pid is not always the device id
    return np.flatnonzero(on_gpu & (m.device_id == dev)), f"GPU {dev}"


def curve(t_ns: np.ndarray, values: np.ndarray, points: int = CURVE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most `points` points: the largest value of each of `points` equal time buckets, at its time."""
    if t_ns.size <= points:
        return t_ns, values
    lo, span = int(t_ns.min()), int(t_ns.max() - t_ns.min()) + 1
    bucket = (t_ns - lo) * points // span
    order = np.lexsort((-values, bucket))          # by bucket, the largest first
    first = order[np.r_[True, bucket[order][1:] != bucket[order][:-1]]]
    first.sort()
    return t_ns[first], values[first]


def rank_memory(rt: RankTrace, w: Window, timeline: str) -> RankMemory:
    """The rank's peak and curve over the analysed window: memory events before the last
    ProfilerStep when there are two or more steps (the window's convention), else all."""
    if not len(rt.memory):
        return RankMemory(why="the trace has no memory events: " + HOW_TO_MEASURE)
    rows, device = _device_rows(rt, timeline == "gpu")
    if not rows.size:
        return RankMemory(device=device, why=f"the trace's memory events are none on the {device}: " + HOW_TO_MEASURE)
    rows = rows[np.argsort(rt.memory.ts_ns[rows], kind="stable")]    # threads' events interleave in the file
    ts = rt.memory.ts_ns[rows]
    steps = w.steps
    if len(steps) >= 2:
        rows, ts = rows[ts < steps.start_ns[-1]], ts[ts < steps.start_ns[-1]]
    if not rows.size:
        return RankMemory(device=device, why="no memory event in the analysed window (before the last ProfilerStep)")
    allocated = rt.memory.allocated[rows]
    origin = min(int(ts.min()), int(steps.start_ns[0])) if len(steps) else int(ts.min())
    t, a = curve(ts - origin, allocated)
    return RankMemory(device=device, peak_bytes=int(allocated.max()), events=int(rows.size), t_ns=t, allocated=a)


def memory_usage(ranks: list[tuple[int, RankMemory]], stage_of, given_peak: Optional[int],
                 given_source: Optional[str]) -> tuple[MemoryUsage, Optional[int]]:
    """The job's measured memory from each (rank, RankMemory), and the job's peak: the one given
    (diag_run.json, ...) when there is one, else the largest peak the traces measured.
    stage_of(rank) -> pp stage or None."""
    peaks = [RankPeak(rank=r, stage=stage_of(r), peak_bytes=m.peak_bytes if m.peak_bytes >= 0 else None,
                      device=m.device, events=m.events, why=m.why, lower_bound=m.device == "CPU" and m.peak_bytes >= 0)
             for r, m in ranks]
    measured = [p.peak_bytes for p in peaks if p.peak_bytes is not None and not p.lower_bound]
    if given_peak:
        peak, source = given_peak, given_source
    elif measured:
        peak, source = max(measured), "trace memory events"
    else:
        peak, source = None, None
    whys = sorted({p.why for p in peaks if p.why} | ({CPU_LOWER_BOUND + "; " + GPU_OR_GIVEN}
                                                      if any(p.lower_bound for p in peaks) else set()))
    out = MemoryUsage(peak_source=source, ranks=peaks, curves=_curves(ranks, stage_of),
                      unknown=None if peak else ("; ".join(whys) or "no rank analysed: " + HOW_TO_MEASURE))
    return out, peak


def _curves(ranks: list[tuple[int, RankMemory]], stage_of) -> list[MemoryCurve]:
    """One curve per stage (per job when the stages are unknown): its rank with the highest peak."""
    best: dict = {}
    for r, m in ranks:
        if m.peak_bytes < 0:
            continue
        st = stage_of(r)
        if st not in best or m.peak_bytes > best[st][1].peak_bytes:
            best[st] = (r, m)
    return [MemoryCurve(stage=st, rank=r, t_s=(m.t_ns * 1e-9).tolist(), allocated_bytes=m.allocated.tolist())
            for st, (r, m) in sorted(best.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]
