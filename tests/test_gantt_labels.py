"""The pipeline Gantt's bars labelled with the action they run (F3, B3, F3.1), every rank of a
stage drawn, and the labels' absence explained.

Hand-made traces give exact cases worked by hand (µs). Real traces check the labels against
truth read here from the raw JSON, independently of diag: the `PP:<action>` / `Forward i`
annotations of torch.distributed.pipelining (our trainer's interleaved 1F1B; the
torchtitan-style workload's GPipe and interleaved 1F1B), each labelled bar inside its
annotation's span, and the order the schedule's (torch's own for interleaved 1F1B). Our
trainer's 1F1B writes no annotations: there the order is the textbook 1F1B one, and each
labelled bar holds the raw JSON's forward matrix multiplies or lies inside its autograd nodes.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sys

import pytest

from dashapp import app
from kineto import TraceBuilder
from test_pp_schedule import torch_order

from diag.analysis import diagnose
from diag.analysis.gantt import rank_step
from diag.report.html import render_html
from diag.trace import load_job
from diag.trace.job import load_rank

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "sample_traces")
GEMM = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8"
TOL_US = 0.01
sys.path.insert(0, os.path.join(ROOT, "dashboards"))
from ui import md  # noqa: E402

PP_RE = re.compile(r"^PP:(\d+)([FBIW])(\d+)$")
PAIR_RE = re.compile(r"^PP:\((\d+)([FB])(\d+);(\d+)([FB])(\d+)\)OVERLAP_F_B$")
GPIPE_RE = re.compile(r"^(Forward|Backward) (\d+)$")


def _labels(row) -> list[str]:
    """The row's labels in time order, one per run of bars of one label."""
    out = []
    for s in row.segments:
        if s.label and (not out or out[-1] != s.label):
            out.append(s.label)
    return out


def _spans(row) -> list[tuple]:
    return [(s.kind, s.label, round(s.start_s * 1e6, 3), round(s.end_s * 1e6, 3)) for s in row.segments]


# -- hand-made traces -----------------------------------------------------------------------------
def test_gpu_actions_label_the_kernels_they_launched(tmp_path):
    """GPU, step 1: PP:1F0 (host 100-200) launches a GEMM at 120 that runs 150-300, PP:1F1 (210-300)
    one at 220 running 320-400; during PP:1B0 and PP:1B1 autograd's own thread launches kernels
    running 500-700 and 720-800; a kernel launched at 705, outside every action, runs 820-830. The
    step starts at its first kernel (150): F0 0-150, F1 170-250, B0 350-550, B1 570-650, the last
    kernel unlabelled."""
    b = TraceBuilder(rank=1, world_size=2).step(1, 0, 1000).step(2, 1000, 1000)
    for name, lo, hi in (("PP:1F0", 100, 200), ("PP:1F1", 210, 300), ("PP:1B0", 400, 500), ("PP:1B1", 600, 700)):
        b.cpu_op(name, lo, hi - lo, cat="user_annotation")
    b.kernel(GEMM, 150, 150, launch_us=120).kernel(GEMM, 320, 80, launch_us=220)
    for lo, run, launch in ((410, 500, 420), (610, 720, 620)):          # on autograd's thread (tid 7)
        b.cpu_op("autograd::engine::evaluate_function: MmBackward0", lo, 80, tid=7)
        b.kernel(GEMM, run, 200 if run == 500 else 80, launch_us=launch)
        b.events[-2]["tid"] = 7                                          # its cudaLaunchKernel
    b.kernel("elementwise_kernel", 820, 10, launch_us=705).kernel(GEMM, 1100, 100, launch_us=1050)
    row = rank_step(load_rank(b.write(str(tmp_path / "rank1.json"))))
    assert _spans(row) == [("forward", "F0", 0, 150), ("idle", None, 150, 170), ("forward", "F1", 170, 250),
                           ("idle", None, 250, 350), ("backward", "B0", 350, 550), ("idle", None, 550, 570),
                           ("backward", "B1", 570, 650), ("idle", None, 650, 670), ("forward", None, 670, 680)]


def test_host_chunks_and_an_overlapped_pair(tmp_path):
    """Host: a rank holding stages 0 and 3 (V-shaped) labels chunk 0 and chunk 1; DualPipeV's
    overlapped forward/backward pair shares its span and its label; an action whose micro-batch
    is not written (`PP:0F`) stays unlabelled, as does the compute outside every action."""
    b = TraceBuilder(rank=0, world_size=2, backend="gloo").step(1, 0, 1000).step(2, 1000, 1000)
    b.cpu_op("aten::mm", 1001, 100)
    for name, lo, hi in (("PP:0F0", 10, 100), ("PP:3F0", 100, 200), ("PP:(0F1;3B0)OVERLAP_F_B", 200, 400),
                         ("PP:0F", 400, 450)):
        b.cpu_op(name, lo, hi - lo, cat="user_annotation")
        b.cpu_op("aten::mm", lo + 5, hi - lo - 10)
    b.cpu_op("aten::mm", 500, 50)
    row = rank_step(load_rank(b.write(str(tmp_path / "rank0.json"))))
    assert [(k, lab, a, z) for k, lab, a, z in _spans(row) if k == "forward"] == [
        ("forward", "F0.0", 15, 95), ("forward", "F0.1", 105, 195), ("forward", "F1.0+B0.1", 205, 395),
        ("forward", None, 405, 445), ("forward", None, 500, 550)]


# -- truth from the raw JSON ----------------------------------------------------------------------
def _events(path: str) -> list[dict]:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _trace_of(run: str, rank: int) -> str:
    (name,) = [n for n in os.listdir(run) if re.match(rf"rank-?{rank}[._]", n) and n.endswith((".json", ".json.gz"))]
    return os.path.join(run, name)


def annotated_truth(path: str, step: int) -> list[tuple[str, float, float]]:
    """(label, start µs, end µs) of the compute actions the raw JSON annotates in ProfilerStep#step,
    in time order: PP:<stage><F|B|I|W><mb> (chunk: the stage's place among the rank's stages),
    DualPipeV's PP:(<action>;<action>)OVERLAP_F_B as 'F1.0+B0.1', or Forward i / Backward i."""
    ev = _events(path)
    (st,) = [e for e in ev if e["name"] == f"ProfilerStep#{step}"]
    stages = sorted({int(m.group(1)) for e in ev if (m := PP_RE.match(e["name"]))})

    def name(stage: str, kind: str, mb: str) -> str:
        return f"{kind}{mb}" + (f".{stages.index(int(stage))}" if len(stages) > 1 else "")
    out = []
    for e in sorted(ev, key=lambda e: e["ts"]):
        if not st["ts"] <= e["ts"] < st["ts"] + st["dur"]:
            continue
        if m := PP_RE.match(e["name"]):
            out.append((name(*m.groups()), e["ts"], e["ts"] + e["dur"]))
        elif m := PAIR_RE.match(e["name"]):
            out.append((name(*m.groups()[:3]) + "+" + name(*m.groups()[3:]), e["ts"], e["ts"] + e["dur"]))
        elif m := GPIPE_RE.match(e["name"]):
            out.append((f"{m.group(1)[0]}{m.group(2)}", e["ts"], e["ts"] + e["dur"]))
    return out


def check_against_annotations(run: str, d) -> None:
    """Every drawn row (each stage's and every other rank's): labels in the order of the raw
    JSON's annotations, each labelled bar inside its annotation's span, the step's start the
    ProfilerStep's."""
    rows = d.gantt.rows + d.gantt.others
    assert len(rows) == len(d.ranks)
    for row in rows:
        truth = annotated_truth(_trace_of(run, row.rank), row.step)
        assert truth and _labels(row) == [lab for lab, _, _ in truth], row.rank
        (st,) = [e for e in _events(_trace_of(run, row.rank)) if e["name"] == f"ProfilerStep#{row.step}"]
        assert row.start_us == pytest.approx(st["ts"], abs=TOL_US)
        span = {lab: (a, z) for lab, a, z in truth}
        for s in row.segments:
            if s.label:
                a, z = span[s.label]
                assert a - TOL_US <= row.start_us + s.start_s * 1e6 <= row.start_us + s.end_s * 1e6 <= z + TOL_US


def chunked(order: list[str]) -> list[str]:
    """torch's '2F0' order of one rank -> the Gantt's labels (chunk: the stage's place on the rank)."""
    stages = sorted({int(re.match(r"\d+", a).group()) for a in order})
    return [re.sub(r"^(\d+)([FBIW]\d+)$", lambda m: m.group(2) + f".{stages.index(int(m.group(1)))}", a)
            for a in order]


@pytest.mark.slow
@pytest.mark.parametrize("sched", ["interleaved-1f1b", "zbv", "dualpipev"])
def test_our_trainers_multi_chunk_schedules(tmp_path, sched):
    """Our trainer, PP 2, v = 2, m = 4: torch.distributed.pipelining's PP:<action> annotations label
    every bar, chunk by chunk (ZB-V and DualPipeV: stages 0 and 3 on rank 0, split backwards I/W,
    DualPipeV's overlapped pairs); interleaved 1F1B in torch's own order."""
    from trainer.runner import assert_ok, run_trainer
    flags = ["--num-layers-per-virtual-pipeline-stage", "1"] if sched == "interleaved-1f1b" else []
    run = run_trainer(tmp_path, 2, "--pipeline-model-parallel-size", "2", "--train-iters", "3",
                      "--profile-wait", "1", "--profile-warmup", "1", "--profile-active", "1", "--no-trace-summary",
                      "--no-metrics", "--pipeline-schedule", sched, *flags)
    assert_ok(run)
    d = diagnose(load_job(str(tmp_path)))
    assert d.pipeline.schedule == sched
    check_against_annotations(str(tmp_path), d)
    drawn = {lab for r in d.gantt.rows for lab in _labels(r)}
    if sched == "interleaved-1f1b":
        for row in d.gantt.rows:
            assert _labels(row) == chunked(torch_order("interleaved-1f1b", row.stage))
    else:
        assert {"I0.1", "W0.1", "I3.0", "W3.0"} <= drawn
    assert any("+" in lab for lab in drawn) == (sched == "dualpipev")
    assert "PP:<action> annotations" in d.gantt.labels


@pytest.mark.slow
@pytest.mark.parametrize("sched", ["gpipe", "interleaved-1f1b"])
def test_torchtitan_style_job(native3d_run, sched):
    """torch.distributed.pipelining in a job that is not ours (PP 2 alone, m = 4, `--pp 2` given):
    GPipe's `Forward i` / `Backward i`, interleaved 1F1B's PP:<action>."""
    out = native3d_run(sched, "--pp", "2", "--dp", "1", "--tp", "1")
    (it,) = os.listdir(os.path.join(out, "profile_traces"))
    run = os.path.join(out, "profile_traces", it)
    d = diagnose(load_job(run), pp=2)
    check_against_annotations(run, d)
    for row in d.gantt.rows:
        want = torch_order(sched, row.stage)
        assert _labels(row) == (chunked(want) if sched == "interleaved-1f1b" else want)


@pytest.mark.parametrize("sample", ["pp2_m2", "tp2_pp2_dp2"])
def test_our_trainers_1f1b_from_the_compute_order(sample):
    """No annotations (Schedule1F1B): the bars follow the textbook 1F1B order of p = 2, m = 2; each
    forward's bars overlap a matrix multiply (aten::mm / aten::addmm) of the raw JSON's main thread, each backward's bars
    start and end inside autograd nodes, no action's bars cross a main-thread send/recv; every
    rank of each stage is drawn."""
    run = os.path.join(SAMPLES, sample)
    d = diagnose(load_job(run))
    assert d.pipeline.schedule == "1f1b" and d.pipeline.m == 2
    rows = d.gantt.rows + d.gantt.others
    assert sorted(r.rank for r in rows) == sorted(r.rank for r in d.ranks)          # all ranks, none capped
    assert "order of forward and backward compute" in d.gantt.labels
    for row in rows:
        assert _labels(row) == (["F0", "F1", "B0", "B1"] if row.stage == 0 else ["F0", "B0", "F1", "B1"])
        ev = _events(_trace_of(run, row.rank))
        (st,) = [e for e in ev if e["name"] == f"ProfilerStep#{row.step}"]
        main = st["tid"]
        def on_main(*names):
            return [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["tid"] == main and e["name"] in names]
        mms, p2p = on_main("aten::mm", "aten::addmm"), on_main("c10d::send", "c10d::recv_")
        nodes = [(e["ts"], e["ts"] + e["dur"]) for e in ev
                 if e["name"].startswith("autograd::engine::evaluate_function")]
        for label in set(_labels(row)):
            bars = [(row.start_us + s.start_s * 1e6, row.start_us + s.end_s * 1e6) for s in row.segments
                    if s.label == label]
            assert not any(a < x < z for a, z in bars for x, _ in p2p), (row.rank, label)   # p2p ends an action
            if label[0] == "F":
                assert any(x < z and a < y for a, z in bars for x, y in mms), (row.rank, label)
            else:
                inside = [(x - TOL_US, y + TOL_US) for x, y in nodes]   # bars join nodes across gaps under 0.2%
                assert all(any(x <= a < y for x, y in inside) and any(x < z <= y for x, y in inside)
                           for a, z in bars), (row.rank, label)


@pytest.mark.parametrize("run", [os.path.join(SAMPLES, "dp2_overlap"),
                                 os.path.join(ROOT, "tests", "data", "dlrm_2_ranks_alltoall")], ids=os.path.basename)
def test_no_pipeline_no_labels_and_why(run):
    d = diagnose(load_job(run))
    assert d.pipeline is None and d.gantt.rows
    assert not any(s.label for r in d.gantt.rows + d.gantt.others for s in r.segments)
    assert d.gantt.labels == ("Bars not labelled with pipeline actions: no pipeline parallelism known "
                              "(PP = 1, or give --pp)")
    assert d.gantt.labels in render_html(d, d.gantt)


# -- every rank of a stage ------------------------------------------------------------------------
def wide_job(folder, per_stage: int = 20) -> None:
    """pp 2 × dp `per_stage` on gloo, told by diag_run.json (Megatron order: stage = rank // per_stage);
    each rank one step of a forward, a send and a backward."""
    world = 2 * per_stage
    for r in range(world):
        b = TraceBuilder(rank=r, world_size=world, backend="gloo").step(1, 0, 1000).step(2, 1000, 1000)
        b.cpu_op("aten::mm", 10 + r, 200).cpu_op("c10d::send", 300, 5).cpu_op("gloo:send", 302, 100, cat="user_annotation")
        b.cpu_op("autograd::engine::evaluate_function: MmBackward0", 500, 300).cpu_op("aten::mm", 1001, 50)
        b.write(os.path.join(folder, f"rank{r}_trace.json"))
    json.dump({"schema_version": 2, "world_size": world, "pp": 2, "dp": per_stage, "tp": 1},
              open(os.path.join(folder, "diag_run.json"), "w"))


def test_every_rank_of_a_stage_can_be_drawn(tmp_path, monkeypatch):
    """40 ranks, 20 a stage (past the 16 the Gantt once kept): the dashboard's selector of each
    stage lists all 20, picking the last draws it; the HTML report says how many it leaves out."""
    wide_job(tmp_path / "wide")
    d = diagnose(load_job(str(tmp_path / "wide")))
    assert sorted(r.rank for r in d.gantt.rows + d.gantt.others) == list(range(40))
    at = app(tmp_path, monkeypatch, "pipeline", run="wide")
    for stage in (0, 1):
        box = at.selectbox(key=f"gantt_stage_{stage}")
        assert box.options == [str(r) for r in range(20 * stage, 20 * stage + 20)] and box.value == 20 * stage
    at.selectbox(key="gantt_stage_1").set_value(39).run()
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert {y.split("<br>")[0] for t in spec["data"] if t["type"] == "bar" for y in t["y"]} == \
        {"stage 0 (rank 0)", "stage 1 (rank 39)"}
    assert any(md(d.gantt.labels) in c.value for c in at.caption)
    page = render_html(d, d.gantt)
    assert ("Rows drawn: stage 0: rank 0, 19 other ranks of the stage not drawn; "
            "stage 1: rank 20, 19 other ranks of the stage not drawn") in page


def test_the_dashboard_draws_the_labels(tmp_path, monkeypatch):
    """The Pipeline page's chart carries each action's label once per row (the sample's 1F1B)."""
    shutil.copytree(os.path.join(SAMPLES, "pp2_m2"), tmp_path / "pp2_m2")
    at = app(tmp_path, monkeypatch, "pipeline", run="pp2_m2")
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    drawn = [x for t in spec["data"] for x in t.get("text") or [] if x]
    assert sorted(drawn) == sorted(["F0", "F1", "B0", "B1"] * 2)
