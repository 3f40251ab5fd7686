"""The idle between a rank's consecutive pipeline actions (ActionGaps), and the step-time model
paying it per action.

Hand-made traces give cases worked by hand (µs). Real traces, CPU and GPU, check the figure
against truth read here from the raw JSON: the gaps between the actions diag found (their
spans are checked against the raw annotations and compute in test_gantt_labels), less what the
raw events cover there (every host op on a host timeline, every kernel, copy and set on a GPU),
summed in this file's own code.
"""
from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import replace

import numpy as np
import pytest

from kineto import TraceBuilder

from diag.advise import Config, Links, Workload, simulate, step_time
from diag.advise.calibrate import calibrate
from diag.advise.model import place, stage_costs
from diag.advise.schedule import step_program
from diag.advise.synth import write_job
from diag.analysis import diagnose
from diag.analysis.rankpass import summarize
from diag.analysis.results import ActionGaps
from diag.trace import load_job
from diag.trace.job import load_rank

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "sample_traces")
MS = 1e-3


# -- hand-made traces -----------------------------------------------------------------------------
def test_gaps_between_annotated_actions_less_what_runs_there(tmp_path):
    """Host, two steps. Step 1: PP:0F0 10-100, PP:0F1 130-200 (a 10 µs op at 110 in the gap: 20 idle),
    PP:0B0 200-300 (no gap), PP:0B1 350-400 (idle 350 - 300 = 50, an op on another thread at 320-330
    covers 10 of it: 40). Step 2: DualPipeV's overlapped pair 1010-1100 counts twice, its second
    action with no gap; PP:0F2 1150-1200: 50 idle. An op before the first action (step 2, 1001) is
    in no gap. Step 3, the window's last, is left out as every per-step figure leaves it. 20 + 40 + 50 =
    110 µs over 3 + 2 gaps, 4 + 3 actions."""
    b = TraceBuilder(rank=0, world_size=2, backend="gloo").step(1, 0, 1000).step(2, 1000, 1000).step(3, 2000, 1000)
    for name, lo, hi in (("PP:0F0", 10, 100), ("PP:0F1", 130, 200), ("PP:0B0", 200, 300), ("PP:0B1", 350, 400),
                         ("PP:(0F3;0B2)OVERLAP_F_B", 1010, 1100), ("PP:0F2", 1150, 1200)):
        b.cpu_op(name, lo, hi - lo, cat="user_annotation")
        b.cpu_op("aten::mm", lo + 1, hi - lo - 2)
    b.cpu_op("aten::copy_", 110, 10)
    b.cpu_op("aten::add", 320, 10, tid=7)
    b.cpu_op("aten::zero_", 1001, 5)
    b.cpu_op("PP:0F0", 2010, 50, cat="user_annotation").cpu_op("PP:0F1", 2100, 50, cat="user_annotation")
    g = summarize(load_rank(b.write(str(tmp_path / "rank0.json")))).result.action_gaps
    assert (g.gaps, g.actions) == (5, 7)
    assert g.idle_s == pytest.approx(110e-6, abs=1e-12)
    assert g.per_gap_s == pytest.approx(22e-6, abs=1e-12)


def test_the_posts_counted_apart(tmp_path):
    """Step 1: PP:0F0 10-100, PP:0SEND_F0 100-130 around c10d::send 102-128 (26 us), which a Python dispatch
    mode re-dispatches as an inner c10d::send 110-120 (the innermost: 10), PP:1RECV_F0 130-140 around
    c10d::recv_ 131-139 and its re-dispatch starting with it, 131-137 (6), PP:0F1 140-200, PP:0UNSHARD 200-205 (nothing run inside), c10d::recv_ 205-215
    (10) with no annotation around it, PP:0B0 215-300; step 2: PP:0SEND_B0 1300-1320 around c10d::send
    1301-1319 (18) between PP:0F2 and PP:0B2; step 3, the window's last, left out with its post. A
    c10d::send on another thread (gloo's, 150-190) is not the rank's post. Posts: 10, 6, 10, 18 us: 4, median
    10. The gaps are idle where no op runs: 2 + 3 + 1 around the first two posts, the unshard's 5, 1 + 1
    around step 2's: 13 us. (The trace lists the inner send first: the order of the file does not matter.)"""
    b = TraceBuilder(rank=0, world_size=2, backend="gloo").step(1, 0, 1000).step(2, 1000, 1000).step(3, 2000, 1000)
    for name, lo, hi in (("PP:0F0", 10, 100), ("PP:0SEND_F0", 100, 130), ("PP:1RECV_F0", 130, 140),
                         ("PP:0F1", 140, 200), ("PP:0UNSHARD", 200, 205),
                         ("PP:0B0", 215, 300), ("PP:0F2", 1010, 1300), ("PP:0SEND_B0", 1300, 1320),
                         ("PP:0B2", 1320, 1400), ("PP:0F3", 2010, 2050), ("PP:0SEND_F3", 2050, 2090),
                         ("PP:0B3", 2090, 2100)):
        b.cpu_op(name, lo, hi - lo, cat="user_annotation")
    for name, lo, hi in (("c10d::send", 110, 120), ("c10d::send", 102, 128), ("c10d::recv_", 131, 139),
                         ("c10d::recv_", 131, 137),
                         ("c10d::recv_", 205, 215), ("c10d::send", 1301, 1319), ("c10d::send", 2051, 2089)):
        b.cpu_op(name, lo, hi - lo)
    b.cpu_op("c10d::send", 150, 40, tid=7)
    g = summarize(load_rank(b.write(str(tmp_path / "rank0.json")))).result.action_gaps
    assert (g.gaps, g.actions, g.posts) == (3, 5, 4)
    assert g.idle_s == pytest.approx(13e-6, abs=1e-12)
    assert g.post_median_s == pytest.approx(10e-6, abs=1e-12)


def test_a_transfer_in_flight_does_not_cover_the_gap_but_its_wait_does(tmp_path):
    """Step 1: PP:0F0 10-100; PP:0SEND_F0 posts c10d::send 100-110, whose gloo:send runs 105-400 (in flight
    until the step's end); PP:0F1 130-200: 20 us idle (110-130), where the in-flight send covered all of it.
    PP:1RECV_B0 posts c10d::recv_ 200-205, its gloo:recv 203-240; PP:0B0 250-300 waits for nothing more:
    the thread idles 205-240 until the data is there (its wait: the neighbour's time, not the runtime's)
    and 240-250 (10). 30 us over 2 gaps; 0 before, the gloo:send covering both."""
    b = TraceBuilder(rank=0, world_size=2, backend="gloo").step(1, 0, 1000).step(2, 1000, 1000)
    for name, lo, hi in (("PP:0F0", 10, 100), ("PP:0SEND_F0", 100, 112), ("PP:0F1", 130, 200),
                         ("PP:1RECV_B0", 200, 206), ("PP:0B0", 250, 300)):
        b.cpu_op(name, lo, hi - lo, cat="user_annotation")
    for lo, hi in ((10, 100), (130, 200), (250, 300)):
        b.cpu_op("aten::mm", lo + 1, hi - lo - 2)
    b.cpu_op("c10d::send", 100, 10).cpu_op("gloo:send", 105, 295, cat="user_annotation")
    b.cpu_op("c10d::recv_", 200, 5).cpu_op("gloo:recv", 203, 37, cat="user_annotation")
    s = summarize(load_rank(b.write(str(tmp_path / "rank0.json"))))
    g = s.result.action_gaps
    assert (g.gaps, g.actions, g.posts) == (2, 3, 2)
    assert g.idle_s == pytest.approx(30e-6, abs=1e-12)
    # the breakdown counts the send in flight as communication: all 30 us of it, none of its idle
    assert g.in_flight_s == pytest.approx(30e-6, abs=1e-12)


def test_no_gaps_without_two_actions_in_a_step(tmp_path):
    b = TraceBuilder(rank=0, world_size=2, backend="gloo").step(1, 0, 1000).step(2, 1000, 1000)
    b.cpu_op("PP:0F0", 10, 90, cat="user_annotation")
    b.cpu_op("PP:0B0", 1010, 90, cat="user_annotation")
    b.cpu_op("aten::mm", 20, 50)
    assert summarize(load_rank(b.write(str(tmp_path / "rank0.json")))).result.action_gaps is None


# -- real traces: truth from the raw JSON ---------------------------------------------------------
def _merged(pairs: list) -> list:
    out = []
    for a, z in sorted(pairs):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], z)
        else:
            out.append([a, z])
    return out


TRANSFERS = ("gloo:send", "gloo:recv")          # a transfer gloo runs, from its post until its wait returns
P2P = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")
COMM = ("gloo:", "c10d::", "_c10d_functional", "c10d_functional", "nccl:", "diag:comm:", "record_param_comms")


def _covered(busy: list, lo: int, hi: int) -> int:
    return sum(max(0, min(hi, z) - max(lo, a)) for a, z in busy)


def _waits(ev: list, off: int, main, steps: list) -> list:
    """The thread's waits for its transfers, from the raw JSON: each point-to-point op or gloo span in the
    steps that ends while the thread runs no op (but such ops), from where that idle began (not before
    the span's own start) to its end."""
    def ns(x):
        return round(x * 1000) - off
    busy = _merged([(ns(e["ts"]), ns(e["ts"] + e["dur"])) for e in ev
                    if e.get("cat") == "cpu_op" and e["tid"] == main and e["name"] not in P2P])
    idle = []
    for lo, hi in _merged(steps):
        at = lo
        for a, z in busy:
            if z <= at or a >= hi:
                continue
            if a > at:
                idle.append((at, a))
            at = max(at, z)
        if at < hi:
            idle.append((at, hi))
    out = []
    for e in ev:
        if e["name"] in P2P + TRANSFERS:
            lo, end = ns(e["ts"]), ns(e["ts"] + e["dur"])
            for a, z in idle:
                if a <= end <= z and end > max(a, lo) and any(s <= end and lo < t for s, t in steps):
                    out.append((max(a, lo), end))
    return out


def raw_truth(path: str, pp, transfers_cover: bool = False) -> tuple[float, int]:
    """(idle s, gaps) between the actions `pp` holds, from the raw JSON: on a GPU every kernel, copy and
    set covers time; on a host timeline every host op and communication span but the transfers in flight
    (gloo:send, gloo:recv: the runtime's Python runs beside them), and the thread's waits for those.
    transfers_cover: those in flight too, as the breakdown counts them (communication, not idle)."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    gpu = any(e.get("cat") == "kernel" for e in ev)
    rt = load_rank(path)
    t = rt.events
    first = int(np.flatnonzero(t.name_mask(lambda s: s.startswith("ProfilerStep")))[0])
    name = t.symbols[int(t.name_id[first])]
    (st,) = [e for e in ev if e["name"] == name and e.get("cat") == "user_annotation"]
    off = round(st["ts"] * 1000) - int(t.ts_ns[first])      # diag's clock: the trace's, in ns, from an origin

    def span(e):
        return round(e["ts"] * 1000) - off, round((e["ts"] + e["dur"]) * 1000) - off
    if gpu:
        busy = _merged([span(e) for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")])
    else:
        marks = {int(e["name"][13:]): span(e) for e in ev
                 if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation"}
        busy = _merged([span(e) for e in ev if e.get("cat") == "cpu_op" or (
            e.get("cat") == "user_annotation" and e["name"].startswith(COMM)
            and (transfers_cover or e["name"] not in TRANSFERS))]
            + _waits(ev, off, st["tid"], [marks[s] for s in sorted(set(pp.act_step.tolist()))]))
    idle, gaps = 0, 0
    for step in sorted(set(pp.act_step.tolist())):
        sel = pp.act_step == step
        acts = sorted(zip(pp.act_start_ns[sel].tolist(), pp.act_end_ns[sel].tolist()))
        reached = acts[0][1]
        for a, z in acts[1:]:
            gaps += 1
            if a > reached:
                idle += (a - reached) - _covered(busy, reached, a)
            reached = max(reached, z)
    return idle * 1e-9, gaps


@pytest.mark.parametrize("trace", ["pp2_m2/rank-0", "pp2_m2/rank-1", "tp2_pp2_dp2/rank-0", "tp2_pp2_dp2/rank-7",
                                   "h200_pp2_memory/rank-0", "h200_pp2_memory/variants/interleaved/rank-1",
                                   "h200_tp2_pp2_dp2/rank-0"])
def test_real_traces_against_the_raw_json(trace):
    """CPU 1F1B (actions from the compute's order), GPU 1F1B, GPU interleaved (PP:<action>)."""
    path = os.path.join(SAMPLES, trace + ".pt.trace.json.gz")
    s = summarize(load_rank(path))
    g = s.result.action_gaps
    idle, gaps = raw_truth(path, s.pp)
    assert g is not None and g.gaps == gaps and gaps > 0
    assert g.idle_s == pytest.approx(idle, abs=gaps * 2e-9)    # a ns of rounding at each end of a gap
    shown, _ = raw_truth(path, s.pp, transfers_cover=True)     # what the breakdown's idle holds of it
    assert g.idle_s - g.in_flight_s == pytest.approx(shown, abs=gaps * 4e-9)
    assert 0 < g.idle_s - g.in_flight_s < s.result.breakdown.idle_s


def raw_posts(path: str, steps: set) -> list[float]:
    """The host spans (s) of the transfers' posts in the raw JSON's ProfilerStep#N of the `steps` given: the
    point-to-point ops on the thread that marks the steps, each not wrapping another one."""
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    marks = [e for e in ev if e["name"].startswith("ProfilerStep#") and e.get("cat") == "user_annotation"]
    main = marks[0]["tid"]
    marks = [m for m in marks if int(m["name"][13:]) in steps]
    ops = [e for e in ev if e["name"] in P2P and e.get("cat") == "cpu_op" and e["tid"] == main]
    inner = [e for e in ops if not any(o is not e and e["ts"] <= o["ts"] and o["ts"] + o["dur"] <= e["ts"] + e["dur"]
                                       for o in ops)]
    return [e["dur"] * 1e-6 for e in inner if any(m["ts"] <= e["ts"] < m["ts"] + m["dur"] for m in marks)]


def _posts_against_the_raw_json(path: str, least: int) -> float:
    s = summarize(load_rank(path))
    g = s.result.action_gaps
    spans = raw_posts(path, set(s.pp.act_step.tolist()))
    assert g is not None and g.posts == len(spans) >= least
    assert g.post_median_s == pytest.approx(float(np.median(spans)), abs=2e-9)
    return g.post_median_s


@pytest.mark.parametrize("trace,least", [("pp2_m2/rank-0", 4), ("pp2_m2/rank-1", 4), ("tp2_pp2_dp2/rank-7", 4),
                                         ("h200_pp2_memory/variants/interleaved/rank-0", 24)])
def test_posts_of_real_runs_against_the_raw_json(trace, least):
    """CPU 1F1B (gloo; the trainer's comm tap re-dispatches each op: the inner one is the post) and an
    H200 interleaved run (NCCL: the host's posts of its 24 transfers a step)."""
    _posts_against_the_raw_json(os.path.join(SAMPLES, trace + ".pt.trace.json.gz"), least)


@pytest.mark.slow
def test_posts_of_a_torchtitan_style_cpu_run_against_the_raw_json(native3d_run):
    """A job not ours (tests/workloads/torch_native_3d.py, TP 2 x PP 2 x DP 2 over gloo, interleaved 1F1B,
    one layer a stage, m = 4, micro-batches of 3 x 32 tokens: its defaults): every rank's 24 posts a step
    and their median host span as the raw JSON has them, and its gaps between actions. Calibrated on it (no diag_run.json: the shape
    given, the schedule and v read from the trace), the model pays each post the mean of the ranks' medians."""
    top = os.path.join(native3d_run("interleaved-1f1b"), "profile_traces")
    run = os.path.join(top, sorted(os.listdir(top), key=lambda x: int(x.split("_")[-1]))[-1])
    medians = [_posts_against_the_raw_json(os.path.join(run, name), 24) for name in sorted(os.listdir(run))]
    for name in sorted(os.listdir(run)):             # the runtime's gaps, its transfers in flight across them
        path = os.path.join(run, name)
        s = summarize(load_rank(path))
        idle, gaps = raw_truth(path, s.pp)
        assert s.result.action_gaps.gaps == gaps > 0
        assert s.result.action_gaps.idle_s == pytest.approx(idle, abs=gaps * 2e-9) and idle > 0
    d = diagnose(load_job(run), pp=2, shape=dict(num_layers=4, micro_batch_size=3, num_micro_batches=4,
                                                 seq_length=32, hidden_size=64))
    cal = calibrate(d)
    assert (cal.config.schedule, cal.config.virtual_stages) == ("interleaved", 2)    # as the trace shows it
    assert any(a.startswith("schedule interleaved-1f1b, v = 2 as the trace shows it") for a in cal.assumptions)
    assert cal.workload.post_host_s == pytest.approx(float(np.mean(medians)), rel=1e-12) and min(medians) > 0
    assert any(a.startswith(f"a transfer's post {cal.workload.post_host_s * 1e3:.3g} ms of the rank's thread")
               for a in cal.assumptions)


# -- the model ------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule,v,actions", [("1f1b", 1, 8), ("gpipe", 1, 8), ("interleaved", 2, 16),
                                                ("zb1p", 1, 12)])
def test_the_runtime_is_paid_before_every_action_but_the_first(schedule, v, actions):
    """p = 2, m = 4: 1F1B and GPipe run 2m actions a stage, interleaving 2mv, ZB1P 3m (F, I, W)."""
    w = Workload(num_layers=4, fwd_s_per_layer=MS, action_host_s=0.3 * MS)
    c = Config(pp=2, num_micro_batches=4, schedule=schedule, virtual_stages=v)
    for rank in range(2):
        main = step_program(schedule, 4, place(c.grid, rank), stage_costs(w, c, Links()), 0)["main"]
        runtime = [i for i in main if i.name == "pp runtime"]
        assert len(runtime) == actions - 1 and {i.what for i in runtime} == {"idle"}
        assert {i.dur_s for i in runtime} == {0.3 * MS}
    one = replace(c, pp=1, schedule="1f1b", virtual_stages=1)     # no pipelining runtime at PP 1
    main = step_program("1f1b", 4, place(one.grid, 0), stage_costs(w, one, Links()), 0)["main"]
    assert not [i for i in main if i.name == "pp runtime"]


@pytest.mark.parametrize("schedule,v,posts", [("1f1b", 1, (0, 0)), ("gpipe", 1, (0, 0)), ("interleaved", 2, (24, 24)),
                                              ("zb1p", 1, (8, 8))])
def test_posts_are_paid_at_each_send_and_receive_of_the_multi_stage_runtime(schedule, v, posts):
    """p = 2, m = 4: interleaved (v 2), virtual stages 0 and 2 on rank 0, 1 and 3 on rank 1: the three links
    between neighbouring virtual stages carry 4 activations forward and 4 gradients back each, a send on
    one rank and a receive on the other: rank 0 sends 12 (0->1, 2->3, 2->1) and receives 12 (1->2, 3->2,
    1->0), rank 1 alike, as the H200
    sample's 24 posts a step; ZB1P stage 0 sends 4 forwards and receives 4 input gradients. 1F1B and
    GPipe post inside their loop: none priced."""
    w = Workload(num_layers=4, fwd_s_per_layer=MS, post_host_s=0.2 * MS)
    c = Config(pp=2, num_micro_batches=4, schedule=schedule, virtual_stages=v)
    for rank in range(2):
        main = step_program(schedule, 4, place(c.grid, rank), stage_costs(w, c, Links()), 0)["main"]
        paid = [i for i in main if i.name == "pp post"]
        assert len(paid) == posts[rank] == len([i for i in main if i.what in ("send", "recv")]) * bool(posts[rank])
        assert {i.dur_s for i in paid} <= {0.2 * MS} and {i.what for i in paid} <= {"idle"}


def test_posts_on_the_critical_path_worked_by_hand():
    """ZB1P, p = 2, m = 1, one layer a stage, free links, forward f, input and weight gradients f each
    (backward 2f, weight share 1/2), post p. Stage 0 F0 [0, f], posts its send: the activation is there at
    f + p; stage 1 posts its receive, F0 [f + 2p, 2f + 2p], I0 [.., 3f + 2p], posts its send: the gradient
    at 3f + 3p, then W0; stage 0 posts its receive, I0 [3f + 4p, 4f + 4p], W0 [.., 5f + 4p]: 5f + 4p a step,
    5f without the posts; 1F1B runs the same 6f (p = 2, m = 1: 3f + 3f) with them or not."""
    f, p = 1 * MS, 0.3 * MS
    w = Workload(num_layers=2, fwd_s_per_layer=f, post_host_s=p)
    zb = Config(pp=2, num_micro_batches=1, schedule="zb1p")
    assert step_time(w, zb, Links()) == pytest.approx(5 * f + 4 * p, rel=1e-9)
    assert step_time(replace(w, post_host_s=0.0), zb, Links()) == pytest.approx(5 * f, rel=1e-9)
    assert step_time(w, Config(pp=2, num_micro_batches=1), Links()) == pytest.approx(6 * f, rel=1e-9)


def test_runtime_on_the_critical_path_worked_by_hand():
    """p = 2, free links, forward f a stage, backward 2f, runtime a. m = 1: stage 1 runs F0 then
    a, B0; stage 0 waits for B0's gradient, then a, B0: 3f + 3f + 2a. m = 2: stage 0 F0 [0, f],
    a, F1 [f+a, 2f+a]; stage 1 F0 [f, 2f], a, B0 [2f+a, 4f+a], a, F1 [4f+2a, 5f+2a], a, B1
    [5f+3a, 7f+3a]; stage 0 B0 after its gradient and a [4f+2a, 6f+2a], B1 [7f+4a, 9f+4a]."""
    f, a = 1 * MS, 0.3 * MS
    w = Workload(num_layers=2, fwd_s_per_layer=f, action_host_s=a)
    assert step_time(w, Config(pp=2, num_micro_batches=1), Links()) == pytest.approx(6 * f + 2 * a, rel=1e-9)
    assert step_time(w, Config(pp=2, num_micro_batches=2), Links()) == pytest.approx(9 * f + 4 * a, rel=1e-9)
    assert step_time(replace(w, action_host_s=0.0), Config(pp=2, num_micro_batches=2), Links()) == \
        pytest.approx(9 * f, rel=1e-9)


# -- calibration ----------------------------------------------------------------------------------
def _job(tmp_path, pp: int = 2):
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS)
    c = Config(pp=pp, num_micro_batches=4)
    write_job(simulate(w, c, Links(), steps=4), str(tmp_path), c, w)
    return diagnose(load_job(str(tmp_path)))


def _given(d, idle_ms: list, gap_ms: list, gaps_a_step: int) -> None:
    """Each rank's idle per step and the idle in its gaps between actions, as its trace would say."""
    for r, i, g in zip(d.ranks, idle_ms, gap_ms):
        n = r.window_steps
        r.breakdown = replace(r.breakdown, idle_s=i * MS * n)
        r.action_gaps = ActionGaps(idle_s=g * MS * n, gaps=gaps_a_step * n, actions=(gaps_a_step + 1) * n)


def test_calibration_takes_the_gaps_out_of_the_launch_overhead(tmp_path):
    """PP 2, m = 4, 2 layers a stage: 4 x 4 x 2 = 32 modelled kernels a stage a step. Stage 0 idles
    10 ms a step, 2.1 of it in its 7 gaps between actions (0.3 ms each); stage 1 6 ms, 1.4 in its
    gaps (0.2 ms each). The runtime: 0.25 ms an action (the ranks' mean); the launch overhead the
    median of what is left, (7.9 + 4.6) / 2 / 32 ms, where it was (10 + 6) / 2 / 32 without."""
    d = _job(tmp_path)
    _given(d, [10, 6], [2.1, 1.4], 7)
    cal = calibrate(d)
    assert cal.workload.action_host_s == pytest.approx(0.25 * MS, rel=1e-9)
    assert cal.workload.launch_overhead_s == pytest.approx((7.9 + 4.6) / 2 / 32 * MS, rel=1e-9)
    assert any("pipelining runtime's host time 0.25 ms between two actions" in a for a in cal.assumptions)
    for r in d.ranks:
        r.action_gaps = None                  # a rank without them: none is priced, the idle all launch
    cal = calibrate(d)
    assert cal.workload.action_host_s == 0.0
    assert cal.workload.launch_overhead_s == pytest.approx((10 + 6) / 2 / 32 * MS, rel=1e-9)


def test_a_post_priced_as_the_trace_times_it_and_not_on_a_gpu():
    """sample_traces/pp2_m2 (CPU 1F1B): a post is priced at the mean of the ranks' median post, as read
    above; given medians of 0.5 and 0.7 ms, 0.6; a rank whose trace shows no post: none priced. On a GPU
    timeline none (h200_pp2_memory's interleaved variant, whose 24 posts a step the host times): the device
    waits for them only where it waits on the host, which is not priced."""
    d = diagnose(load_job(os.path.join(SAMPLES, "pp2_m2")))
    cal = calibrate(d)
    mean = float(np.mean([r.action_gaps.post_median_s for r in d.ranks]))
    assert cal.workload.post_host_s == pytest.approx(mean, rel=1e-12) and mean > 0
    for r, each in zip(d.ranks, (0.5, 0.7)):
        r.action_gaps = replace(r.action_gaps, post_median_s=each * MS)
    assert calibrate(d).workload.post_host_s == pytest.approx(0.6 * MS, rel=1e-12)
    d.ranks[1].action_gaps = replace(d.ranks[1].action_gaps, posts=0, post_median_s=None)
    assert calibrate(d).workload.post_host_s == 0.0
    d = diagnose(load_job(os.path.join(SAMPLES, "h200_pp2_memory/variants/interleaved")))
    assert d.ranks[0].action_gaps.posts == 24
    assert calibrate(d).workload.post_host_s == 0.0


def test_a_transfer_in_flight_is_paid_as_runtime_but_not_taken_out_of_the_idle(tmp_path):
    """As above, but 1.0 ms of stage 0's gaps a step and 0.4 of stage 1's lay beside a transfer in flight,
    which the breakdown counts as communication, not idle: the runtime stays 0.25 ms a gap, and only the
    rest comes out of the idle, (10 - 1.1 + 6 - 1.0) / 2 / 32 ms of launch overhead. With 12 ms of gaps
    a step on stage 0, 11 of them in flight (more than its 10 ms of idle), still priced: 12 / 7 ms a gap
    there."""
    d = _job(tmp_path)
    _given(d, [10, 6], [2.1, 1.4], 7)
    for r, f in zip(d.ranks, (1.0, 0.4)):
        r.action_gaps = replace(r.action_gaps, in_flight_s=f * MS * r.window_steps)
    cal = calibrate(d)
    assert cal.workload.action_host_s == pytest.approx(0.25 * MS, rel=1e-9)
    assert cal.workload.launch_overhead_s == pytest.approx((8.9 + 5.0) / 2 / 32 * MS, rel=1e-9)
    assert any("(1.75 ms a step over ~7 gaps, mean over ranks; 0.7 ms of it beside a transfer in flight" in a
               for a in cal.assumptions)
    r = d.ranks[0]
    r.action_gaps = replace(r.action_gaps, idle_s=12 * MS * r.window_steps, in_flight_s=11 * MS * r.window_steps)
    cal = calibrate(d)
    assert cal.workload.action_host_s == pytest.approx((12 / 7 + 0.2) / 2 * MS, rel=1e-9)
    assert cal.workload.launch_overhead_s == pytest.approx((9 + 5.0) / 2 / 32 * MS, rel=1e-9)


def test_no_runtime_without_a_pipeline(tmp_path):
    d = _job(tmp_path, pp=1)
    _given(d, [10], [2.1], 7)
    assert calibrate(d).workload.action_host_s == 0.0
