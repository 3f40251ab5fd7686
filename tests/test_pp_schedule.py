"""The pipeline schedule read from the trace, and the bubble measured as the waits on neighbours.

Hand-made Kineto traces give exact cases worked by hand (µs): which waits count, which
point-to-point ops are the pipeline's when nothing names their group, each schedule family's
name and ideal, and "unknown, with the reason" where the trace cannot show the bubble.

Real runs of tests/workloads/torch_native_3d.py (torchtitan-style: DeviceMesh (pp, dp, tp) =
(2, 2, 2), FSDP2, gloo, no diag labels, no diag_run.json) check that 1F1B, GPipe and
interleaved 1F1B are recognised with their m and v, that each stage's order is the schedule's
(torch's own for interleaved 1F1B), and that the bubble of each stage is within 25% of an
independent measure made here from the raw JSON: per ProfilerStep, the main thread's idle time
that ends where a point-to-point span ends (its wait), summed over the stage's ranks. Only the
wait counts, not every idle moment while a transfer is open: torch.distributed.pipelining waits
on its sends at the end of the step, so their spans cover most of it.
"""
from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import ROOT
from diag.analysis import diagnose
from diag.report.fmt import pipeline_caption, pipeline_rows
from diag.trace import load_job
from kineto import TraceBuilder

US = 1e-6
P2P = {"c10d::send", "c10d::recv_", "gloo:send", "gloo:recv"}


# -- hand-made traces -----------------------------------------------------------------------------
def annotation(b: TraceBuilder, name: str, ts: float, dur: float) -> None:
    b.cpu_op(name, ts, dur, cat="user_annotation")


def p2p(b: TraceBuilder, op: str, ts: float, dur: float, peer: int, span_end: float) -> None:
    """A c10d send/recv posting to `peer` (within its group) at ts, and gloo's span from just
    after the post to the return of its wait at span_end, as gloo records them."""
    b.cpu_op(f"c10d::{op}", ts, dur)
    b.events[-1]["args"]["Concrete Inputs"] = ["", "", str(peer), "0"]
    annotation(b, f"gloo:{op.rstrip('_')}", ts + dur / 2, span_end - ts - dur / 2)


def write(b: TraceBuilder, folder, pp_ranks=None) -> None:
    doc = b.doc()
    if pp_ranks:
        doc["distributedInfo"]["pg_config"] = [
            {"pg_name": "0", "pg_desc": "default_pg", "pg_size": b.world_size, "ranks": list(range(b.world_size))},
            {"pg_name": "1", "pg_desc": "mesh_pp", "pg_size": len(pp_ranks), "ranks": pp_ranks}]
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"rank{b.rank}_trace.json"), "w") as f:
        json.dump(doc, f)


def cpu_rank(rank: int, world: int) -> TraceBuilder:
    """Two steps of 1000 µs (the analysis window keeps the first), gloo, no GPU."""
    b = TraceBuilder(rank=rank, world_size=world, backend="gloo")
    b.step(1, 0, 1000).step(2, 1000, 1000).cpu_op("aten::add", 995, 3).cpu_op("aten::mm", 1001, 499)
    return b


def test_waits_on_neighbours_are_the_bubble_and_open_sends_are_not(tmp_path):
    """Stage 1 waits 10-200 for its receive (its c10d::recv_ 10-11 included) and 880-900 for a
    send posted at 400; the idle 600-650 while that send is open is not a wait; c10d::send
    400-401 blocks. 190 + 1 + 20 = 211 µs in a step of 1000. Stage 0 shows no transfer at all:
    unknown, with the reason, and "unknown" in the report."""
    b = cpu_rank(1, 2)
    b.cpu_op("aten::mm", 2, 7)
    annotation(b, "PP:1RECV_F0", 10, 2)
    p2p(b, "recv_", 10, 1, peer=0, span_end=200)
    annotation(b, "PP:1F0", 12, 383)
    b.cpu_op("aten::mm", 201, 189)
    annotation(b, "PP:1SEND_F0", 399, 3)
    p2p(b, "send", 400, 1, peer=0, span_end=900)
    b.cpu_op("aten::mm", 401, 199).cpu_op("aten::mm", 650, 230).cpu_op("aten::mm", 905, 85)
    write(b, tmp_path, pp_ranks=[0, 1])
    write(cpu_rank(0, 2), tmp_path, pp_ranks=[0, 1])
    d = diagnose(load_job(str(tmp_path)))
    s0, s1 = d.pipeline.stages
    assert s1.bubble_s == pytest.approx(211 * US, abs=1e-9)
    assert s1.bubble_fraction == pytest.approx(0.211, abs=1e-6)
    assert s0.bubble_s is None and s0.bubble_fraction is None and "no pipeline send/recv" in s0.unknown
    assert pipeline_rows(d)[0][2:4] == ["unknown", "unknown"]
    assert "Stage 0: bubble unknown (no pipeline send/recv" in pipeline_caption(d)


def test_unnamed_p2p_counts_only_towards_a_pipeline_neighbour(tmp_path):
    """p = 4, nothing names the ops' group: stage 0 receiving from stage 2 is not a pipeline
    transfer (waited 100-300, not counted); sending to stage 1 is (waited 500-540)."""
    b = cpu_rank(0, 4)
    b.cpu_op("aten::mm", 0, 100)
    p2p(b, "recv_", 100, 1, peer=2, span_end=300)
    b.cpu_op("aten::mm", 300, 200)
    p2p(b, "send", 500, 1, peer=1, span_end=540)
    b.cpu_op("aten::mm", 540, 400)
    write(b, tmp_path, pp_ranks=[0, 1, 2, 3])
    (s0,) = diagnose(load_job(str(tmp_path))).pipeline.stages
    assert s0.bubble_s == pytest.approx(40 * US, abs=1e-9)


def test_no_steps_no_bubble(tmp_path):
    b = TraceBuilder(rank=1, world_size=2, backend="gloo")
    b.cpu_op("aten::mm", 0, 100)
    p2p(b, "recv_", 100, 1, peer=0, span_end=300)
    write(b, tmp_path, pp_ranks=[0, 1])
    (s1,) = diagnose(load_job(str(tmp_path))).pipeline.stages
    assert s1.bubble_s is None and "no ProfilerStep" in s1.unknown


def test_gpu_p2p_of_unknown_group_is_measured_where_not_under_compute(tmp_path):
    """GPU, the layout given (--pp 2), a SendRecv kernel naming no group: 100-300 exposed, and
    350-450 under compute until 400: 200 + 50 µs waited in a step of 1000."""
    b = TraceBuilder(rank=1, world_size=2)
    b.step(1, 0, 1000).step(2, 1000, 1000)
    b.kernel("gemm", 10, 90, launch_us=5).kernel("ncclDevKernel_SendRecv", 100, 200, stream=9, launch_us=6)
    b.kernel("gemm", 300, 100, launch_us=7).kernel("ncclDevKernel_SendRecv", 350, 100, stream=9, launch_us=8)
    b.kernel("gemm", 1010, 100, launch_us=1005)
    write(b, tmp_path)
    (s1,) = diagnose(load_job(str(tmp_path)), pp=2).pipeline.stages
    assert s1.bubble_s == pytest.approx(250 * US, abs=1e-9)


def compute_rank(rank: int, order: list[str]) -> TraceBuilder:
    """A stage that runs `order` (F = a matmul, B = autograd nodes) with a c10d send between
    actions and no schedule annotations, then clips gradients and steps the optimizer (neither
    is a forward)."""
    b = cpu_rank(rank, 2)
    t = 10.0
    for i, a in enumerate(order):
        if a == "F":
            b.cpu_op("aten::linear", t, 20).cpu_op("aten::mm", t + 1, 18)
        else:
            b.cpu_op("autograd::engine::evaluate_function: MmBackward0", t, 10)
            b.cpu_op("autograd::engine::evaluate_function: AddBackward0", t + 12, 10)
        if i % 2 == 0:
            p2p(b, "send", t + 25, 1, peer=1 - rank, span_end=t + 30)
        t += 40
    b.cpu_op("aten::_foreach_norm", t, 5)
    annotation(b, "Optimizer.step#AdamW.step", t + 10, 30)
    b.cpu_op("aten::mm", t + 11, 5)
    return b


def test_1f1b_read_from_compute_order_without_annotations(tmp_path):
    orders = {0: "FFBFBB", 1: "FBFBFB"}           # p = 2, m = 3: 1F1B, not GPipe (FFFBBB)
    for r, o in orders.items():
        write(compute_rank(r, list(o)), tmp_path, pp_ranks=[0, 1])
    p = diagnose(load_job(str(tmp_path))).pipeline
    assert (p.schedule, p.m, p.v) == ("1f1b", 3, 1)
    assert [s.order for s in p.stages] == [["F0", "F1", "B0", "F2", "B1", "B2"], ["F0", "B0", "F1", "B1", "F2", "B2"]]
    assert "read from the order of forward and backward compute" in p.source
    assert p.ideal_fraction == pytest.approx(1 / 4)


def annotated_rank(rank: int, world: int, actions: list[str]) -> TraceBuilder:
    b = cpu_rank(rank, world)
    for i, a in enumerate(actions):
        annotation(b, f"PP:{a}", 10 + 20 * i, 15)
    return b


ZB = {"zb1p": {0: ["0F0", "2F0", "2I0", "0F1", "2W0", "0I0", "0W0", "2F1", "2I1", "2W1", "0I1", "0W1"],
               1: ["1F0", "3F0", "3I0", "3W0", "1I0", "1W0", "1F1", "3F1", "3I1", "3W1", "1I1", "1W1"]},
      "zbv": {0: ["0F0", "0F1", "3F0", "3I0", "3F1", "0I0", "3W0", "0W0", "3I1", "0I1", "3W1", "0W1"],
              1: ["1F0", "1F1", "2F0", "2I0", "2F1", "1I0", "2W0", "1W0", "2I1", "1I1", "2W1", "1W1"]},
      "dualpipev": {0: ["0F0", "3F0", "(0F1;3B0)OVERLAP_F_B", "3F1", "0I0", "0W0", "3B1", "0B1"],
                    1: ["1F0", "2F0", "1F1", "2I0", "2F1", "1I0", "2W0", "2B1", "1B1", "1W0"]},
      "looped-bfs": {0: ["0F0", "0F1", "2F0", "2F1", "2B0", "2B1", "0B0", "0B1"],
                     1: ["1F0", "1F1", "3F0", "3F1", "3B0", "3B1", "1B0", "1B1"]}}
IDEAL = {"zb1p": 1 / (3 * 2 * 2 + 1), "zbv": 0.0, "dualpipev": 0.0, "looped-bfs": 1 / (2 * 2 + 1)}


@pytest.mark.parametrize("name", sorted(ZB))
def test_multi_chunk_schedules_by_their_annotations(tmp_path, name):
    """PP:<action> names: I/W split backwards make a zero-bubble schedule (V-shaped stages: ZB-V,
    an OVERLAP_F_B pair: DualPipeV); all forwards before any backward on v = 2 chunks: looped BFS."""
    for r, acts in ZB[name].items():
        write(annotated_rank(r, 2, acts), tmp_path, pp_ranks=[0, 1])
    p = diagnose(load_job(str(tmp_path))).pipeline
    assert (p.schedule, p.m, p.v) == (name, 2, 2)
    assert p.ideal_fraction == pytest.approx(IDEAL[name])
    assert p.stages[0].order[:2] == [a.split(";")[0].strip("(") for a in ZB[name][0][:2]]


def test_given_values_win_and_are_said(tmp_path):
    for r, o in {0: "FFBFBB", 1: "FBFBFB"}.items():
        write(compute_rank(r, list(o)), tmp_path, pp_ranks=[0, 1])
    p = diagnose(load_job(str(tmp_path)), shape={"num_micro_batches": 8, "pipeline_schedule": "gpipe"}).pipeline
    assert (p.schedule, p.m, p.v) == ("gpipe", 8, 1)
    assert p.ideal_fraction == pytest.approx(1 / 9)
    assert p.source.startswith("schedule and m given")


# -- real runs of a torchtitan-style job ----------------------------------------------------------
SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b")
P, M = 2, 4


@pytest.fixture(scope="module")
def native_runs(tmp_path_factory):
    out = {}
    for sched in SCHEDULES:
        folder = str(tmp_path_factory.mktemp(sched))
        cmd = [sys.executable, os.path.join(ROOT, "tests", "workloads", "torch_native_3d.py"), "--out", folder,
               "--schedule", sched, "--microbatches", str(M)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
        (it,) = os.listdir(os.path.join(folder, "profile_traces"))
        out[sched] = os.path.join(folder, "profile_traces", it)
    return out


def torch_order(sched: str, stage: int) -> list[str]:
    """The schedule's order of one stage: torch's own pipeline order for interleaved 1F1B (built
    from stand-in stages), the textbook definitions for GPipe and 1F1B (torch 2.13's IR for
    Schedule1F1B misnumbers the last stage's micro-batches, though it runs them in order)."""
    if sched == "gpipe":
        return [f"F{i}" for i in range(M)] + [f"B{i}" for i in range(M)]
    if sched == "1f1b":
        return ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"] if stage == 0 else \
            ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    from torch.distributed.pipelining import ScheduleInterleaved1F1B
    v = 2
    stages = [SimpleNamespace(group_size=P, group_rank=stage, num_stages=P * v, stage_index=stage + k * P,
                              is_first=stage + k * P == 0, is_last=stage + k * P == P * v - 1,
                              stage_index_to_group_rank={}) for k in range(v)]
    order = ScheduleInterleaved1F1B(stages, n_microbatches=M).pipeline_order[stage]
    return [str(a) for a in order if a is not None]


def waited_on_neighbours(path: str) -> float:
    """Independent measure, seconds: in the first ProfilerStep, the main thread's idle time that
    ends where a point-to-point span (c10d op or gloo span) ends, from the later of its start and
    the end of the last CPU op before it."""
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    step = min((e for e in ev if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    lo, hi, main = step["ts"], step["ts"] + step["dur"], step["tid"]
    busy = []
    for a, b in sorted((e["ts"], e["ts"] + e["dur"]) for e in ev
                       if e["tid"] == main and e["cat"] == "cpu_op" and e["name"] not in P2P):
        if busy and a <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], b)
        else:
            busy.append([a, b])
    starts = [a for a, _ in busy]
    waits = []
    for e in ev:
        if e["name"] not in P2P:
            continue
        end = e["ts"] + e["dur"]
        i = bisect.bisect_left(starts, end) - 1             # last busy stretch starting before the end
        if i >= 0 and busy[i][1] > end:                     # the thread was busy when it ended
            continue
        w0 = max(e["ts"], busy[i][1] if i >= 0 else lo, lo)
        if w0 < min(end, hi):
            waits.append([w0, min(end, hi)])
    total, reach = 0.0, lo
    for a, b in sorted(waits):
        a = max(a, reach)
        if b > a:
            total, reach = total + b - a, b
    return total * US


@pytest.mark.slow
@pytest.mark.parametrize("sched", SCHEDULES)
def test_native_schedule_m_v_and_order(native_runs, sched):
    p = diagnose(load_job(native_runs[sched])).pipeline
    assert (p.schedule, p.m, p.v, p.p) == (sched, M, 2 if sched == "interleaved-1f1b" else 1, P)
    assert "read from the" in p.source
    for s in p.stages:
        assert s.order == torch_order(sched, s.stage), (s.stage, s.order)
    want = (P - 1) / ((2 if sched == "interleaved-1f1b" else 1) * M + P - 1)
    assert p.ideal_fraction == pytest.approx(want)


@pytest.mark.slow
@pytest.mark.parametrize("sched", SCHEDULES)
def test_native_bubble_is_the_waits_on_neighbours(native_runs, sched):
    d = diagnose(load_job(native_runs[sched]))
    for s in d.pipeline.stages:
        files = [os.path.join(native_runs[sched], f"rank{r}_trace.json") for r in s.ranks]
        independent = sum(map(waited_on_neighbours, files)) / len(files)
        assert s.bubble_s is not None and s.bubble_s > 0, s         # measured, and not a zero
        assert s.bubble_s == pytest.approx(independent, rel=0.25), (s.stage, s.bubble_s, independent)
