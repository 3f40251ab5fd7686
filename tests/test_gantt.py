"""One step per stage as segments (diag.analysis.gantt), on hand-made traces worked by hand."""
from __future__ import annotations

import os

import numpy as np
import pytest

from kineto import TraceBuilder

from diag.analysis import diagnose
import diag.analysis.gantt as gantt
from diag.analysis.gantt import KINDS, NS, Segment, rank_step, step_segments
from diag.analysis import intervals as iv
from diag.trace import load_job
from diag.trace.job import load_rank

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GEMM = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def segments(parts: dict, lo: int, hi: int) -> list[Segment]:
    """The reference: disjoint interval sets by (kind, label) -> consecutive segments over [lo, hi), gaps as idle."""
    found = []
    for (kind, label), s in parts.items():
        a, b = iv.clip(s, lo, hi)
        found += [(int(x), int(y), kind, label) for x, y in zip(a, b)]
    found.sort(key=lambda f: f[:2])
    out, at = [], lo
    for x, y, kind, label in found:
        if x > at:
            out.append(Segment("idle", (at - lo) * NS, (x - lo) * NS))
        out.append(Segment(kind, (x - lo) * NS, (y - lo) * NS, label))
        at = max(at, y)
    if hi > at:
        out.append(Segment("idle", (at - lo) * NS, (hi - lo) * NS))
    return out


def coalesce(segs: list[Segment], min_idle_s: float) -> list[Segment]:
    """The reference: idle gaps shorter than min_idle_s between two segments of one kind and label join them (host
    traces are gaps of microseconds between operators), then neighbours of one kind and label merge.
    A gap between two actions stays a gap: a label never reaches past its action."""
    out: list[Segment] = []
    for i, s in enumerate(segs):
        short_gap = (s.kind == "idle" and s.end_s - s.start_s < min_idle_s and 0 < i < len(segs) - 1
                     and (segs[i - 1].kind, segs[i - 1].label) == (segs[i + 1].kind, segs[i + 1].label))
        kind, label = (segs[i - 1].kind, segs[i - 1].label) if short_gap else (s.kind, s.label)
        if out and (out[-1].kind, out[-1].label) == (kind, label):
            out[-1].end_s = s.end_s
        else:
            out.append(Segment(kind, s.start_s, s.end_s, label))
    return out


def _spans(row) -> list[tuple[str, float, float]]:
    return [(s.kind, round(s.start_s * 1e6, 3), round(s.end_s * 1e6, 3)) for s in row.segments]


def gpu_trace(path: str) -> str:
    """Step 1 of a pipeline stage on a GPU (µs): forward 100-300, a receive 350-500, backward 520-800
    under a DP all-reduce 700-860, a send 820-850, the optimizer 870-880. Step 2 is left out of the
    window (HTA convention: the last step)."""
    b = TraceBuilder(rank=0, world_size=2).step(1, 0, 1000).step(2, 1000, 1000)
    b.kernel(GEMM, 100, 200, launch_us=50)
    b.cpu_op("diag:comm:pp:recv:4096", 320, 10, cat="user_annotation")
    b.kernel(SENDRECV, 350, 150, stream=24, launch_us=325)
    b.cpu_op("autograd::engine::evaluate_function: MmBackward0", 510, 50)
    b.kernel(GEMM, 520, 280, launch_us=515)
    b.cpu_op("diag:comm:dp:all_reduce:1024", 600, 5, cat="user_annotation")
    b.kernel(ALLREDUCE, 700, 160, stream=28, launch_us=602)
    b.cpu_op("diag:comm:pp:send:4096", 810, 5, cat="user_annotation")
    b.kernel(SENDRECV, 820, 30, stream=24, launch_us=812)
    b.cpu_op("Optimizer.step#AdamW.step", 860, 40)
    b.kernel(GEMM, 870, 10, launch_us=865)
    b.kernel(GEMM, 1100, 100, launch_us=1050)
    return b.write(path)


def test_gpu_step_segments_by_hand(tmp_path):
    row = rank_step(load_rank(gpu_trace(str(tmp_path / "rank0.json"))))
    assert row.step == 1 and row.rank == 0 and row.stage is None
    assert row.step_s == pytest.approx(780e-6)     # first kernel start to last kernel end of step 1
    assert _spans(row) == [("forward", 0, 200), ("idle", 200, 250), ("send/recv", 250, 400), ("idle", 400, 420),
                           ("backward", 420, 700), ("collective", 700, 720), ("send/recv", 720, 750),
                           ("collective", 750, 760), ("idle", 760, 770), ("optimizer", 770, 780)]
    assert row.total("send/recv") == pytest.approx(180e-6)
    assert sum(row.total(k) for k in KINDS) == pytest.approx(row.step_s)


def test_other_step_by_number_and_missing_step(tmp_path):
    rt = load_rank(gpu_trace(str(tmp_path / "rank0.json")))
    assert rank_step(rt, step=1).step == 1
    assert rank_step(rt, step=2) is None          # outside the analysis window
    assert rank_step(rt, step=7) is None


def test_host_step_segments_by_hand(tmp_path):
    """A CPU-only (gloo) step, host timeline: the ProfilerStep span is the step."""
    b = TraceBuilder(rank=1, world_size=2, backend="gloo").step(3, 0, 200)
    b.cpu_op("aten::mm", 10, 40)
    b.cpu_op("diag:comm:pp:recv:4096", 50, 50, cat="user_annotation")
    b.cpu_op("autograd::engine::evaluate_function: MmBackward0", 100, 50)
    b.cpu_op("aten::mm", 105, 45)
    b.cpu_op("Optimizer.step#AdamW.step", 160, 20, cat="user_annotation")   # as torch writes it
    b.cpu_op("aten::add_", 165, 15)
    row = rank_step(load_rank(b.write(str(tmp_path / "rank1.json"))))
    assert row.step == 3 and row.step_s == pytest.approx(200e-6)
    assert _spans(row) == [("idle", 0, 10), ("forward", 10, 50), ("send/recv", 50, 100), ("backward", 100, 150),
                           ("idle", 150, 165), ("optimizer", 165, 180), ("idle", 180, 200)]


def test_coalesce_joins_short_gaps_between_one_kind():
    segs = [Segment("forward", 0, 1), Segment("idle", 1, 1.01), Segment("forward", 1.01, 2),
            Segment("idle", 2, 2.5), Segment("backward", 2.5, 3), Segment("idle", 3, 3.01)]
    out = coalesce(segs, min_idle_s=0.05)
    want = [("forward", 0, 2), ("idle", 2, 2.5), ("backward", 2.5, 3), ("idle", 3, 3.01)]
    assert [(s.kind, s.start_s, s.end_s) for s in out] == want
    ns = [(k, round(a * 1e9), round(b * 1e9)) for k, a, b in
          [("forward", 0, 1), ("forward", 1.01, 2), ("backward", 2.5, 3)]]
    parts = {(k, None): iv.merge(np.array([a for kk, a, _ in ns if kk == k]), np.array([b for kk, _, b in ns if kk == k]))
             for k in ("forward", "backward")}
    got = step_segments(parts, 0, round(3.01e9), min_idle_s=0.05)
    assert [(s.kind, s.start_s, s.end_s) for s in got] == [(k, pytest.approx(a), pytest.approx(b)) for k, a, b in want]


@pytest.mark.parametrize("sample", ["tp2_pp2_dp2", "h200_tp2_pp2_dp2", "pp2_m2", "h200_single"])
def test_step_segments_are_the_two_loops(sample, monkeypatch):
    """step_segments (numpy) makes what segments then coalesce make, to the bit, on every row the
    diagnosis draws of CPU and GPU samples, at the diagnosis's idle threshold and at others."""
    made, seen = gantt.step_segments, []

    def both(parts, lo, hi, min_idle_s):
        for m in (min_idle_s, 0.0, 1e-6, 1e-4, 1e-3):
            got = made(parts, lo, hi, m)
            assert got == coalesce(segments(parts, lo, hi), m)
            seen.append(len(got))
        return made(parts, lo, hi, min_idle_s)

    monkeypatch.setattr(gantt, "step_segments", both)
    diagnose(load_job(os.path.join(ROOT, "sample_traces", sample)))
    assert seen and min(seen) > 3


def test_sample_pipeline_one_row_per_stage():
    job = load_job(os.path.join(ROOT, "sample_traces", "tp2_pp2_dp2"))
    g = diagnose(job).gantt
    assert [(r.stage, r.rank) for r in g.rows] == [(0, 0), (1, 4)]    # tp 0, dp 0 of each stage
    assert g.timeline == "host" and len({r.step for r in g.rows}) == 1
    for r in g.rows:
        assert r.segments[0].start_s == 0 and r.segments[-1].end_s == pytest.approx(r.step_s)
        assert all(a.end_s == pytest.approx(b.start_s) for a, b in zip(r.segments, r.segments[1:]))
        assert r.total("send/recv") > 0 and r.total("backward") > 0 and r.total("forward") > 0
    # 1F1B with p=2: the last stage waits for the first forward, so a receive comes before its first
    # action (what runs before it, the step's set-up, is compute outside every action: unlabelled)
    first = next(s for s in g.rows[1].segments if s.label or (s.kind == "send/recv" and s.end_s - s.start_s > 1e-3))
    assert first.kind == "send/recv"
