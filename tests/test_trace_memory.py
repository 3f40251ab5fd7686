"""Measured memory (issue #19): the peak per rank and its curve from the profiler's `[memory]`
events, against the truth computed here from the raw JSON events of real traces.

Traces: a pipeline run of the instrumented trainer with `--profile-memory` (CPU, gloo, 2 ranks,
made once for the module), and a real A100 trace from tests/data into which GPU memory events
are written here (no stored trace carries GPU ones; this machine has no GPU to record one): the
analyser must read them as it reads the profiler's, and pick the GPU's allocator over the CPU's.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from dashapp import app
from diag.advise.recommend import with_advice
from diag.analysis import diagnose, summary_file
from diag.analysis.collect import summarize_file
from diag.analysis.memuse import CURVE_POINTS, curve
from diag.report.html import render_html
from diag.report.text import render_text
from diag.analysis.rankpass import summarize
from diag.trace import load_job, load_rank
from diag.trace.errors import TraceError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
A100 = os.path.join(DATA, "a100_single_ns_resolution", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")


def _events(path: str) -> list[dict]:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return json.load(f)["traceEvents"]


def true_peak(path: str, gpu: bool, device_id: int = -1) -> int:
    """The largest Total Allocated of the device's `[memory]` events before the start of the last
    ProfilerStep (the analysed window), from the raw JSON. A step is counted once, where it starts
    first: a GPU trace also carries each ProfilerStep as a GPU annotation."""
    evs = _events(path)
    first: dict = {}
    for e in evs:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#"):
            first[e["name"]] = min(e["ts"], first.get(e["name"], e["ts"]))
    starts = sorted(first.values())
    end = starts[-1] if len(starts) >= 2 else float("inf")
    return max(e["args"]["Total Allocated"] for e in evs
               if e.get("ph") == "i" and e.get("name") == "[memory]" and e["ts"] < end
               and (e["args"]["Device Type"] != 0 if gpu else e["args"]["Device Type"] == 0)
               and (not gpu or e["args"]["Device Id"] == device_id))


@pytest.fixture(scope="module")
def pp_run(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("mem") / "pp2")
    cmd = [sys.executable, "-m", "instrumented_trainer", "--num-layers", "4", "--hidden-size", "128",
           "--num-attention-heads", "4", "--seq-length", "64", "--vocab-size", "256", "--seed", "1234",
           "--train-iters", "4", "--profile-wait", "1", "--profile-warmup", "1", "--profile-active", "2",
           "--nproc", "2", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "2",
           "--global-batch-size", "4", "--no-metrics", "--no-trace-summary", "--profile-memory", "--out", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def pp_diag(pp_run):
    return with_advice(diagnose(load_job(pp_run)))


def _trace(run: str, rank: int) -> str:
    return os.path.join(run, f"rank-{rank}.pt.trace.json.gz")


def test_peak_per_rank_is_the_largest_total_allocated_in_the_window(pp_run, pp_diag):
    m = pp_diag.memory
    assert [p.rank for p in m.ranks] == [0, 1]
    for p in m.ranks:
        assert p.peak_bytes == true_peak(_trace(pp_run, p.rank), gpu=False) > 0
        assert p.device == "CPU" and p.stage == p.rank and p.lower_bound and p.events > 0


def test_a_cpu_peak_is_a_lower_bound_and_does_not_calibrate(pp_run, tmp_path):
    """The CPU allocator's total in a trace starts with the profiler: without a measured peak in
    diag_run.json (a trace from elsewhere) the job's peak stays unknown, says why, and the model
    is not calibrated on it."""
    run = shutil.copytree(pp_run, tmp_path / "run")
    meta = json.loads((run / "diag_run.json").read_text())
    meta["peak_memory_bytes"] = None
    (run / "diag_run.json").write_text(json.dumps(meta))
    d = with_advice(diagnose(load_job(str(run))))
    m = d.memory
    assert d.facts.peak_memory_bytes is None and m.peak_source is None
    assert "lower bound" in m.unknown and "profile_memory=True" in m.unknown
    assert m.model_basis.startswith("not calibrated") and [p.stage for p in m.model] == [0, 1]
    assert all(abs(p.weights + p.grads + p.optimizer + p.activations - p.total) < 1 for p in m.model)


def test_the_trainers_cpu_peak_calibrates(pp_run, pp_diag):
    """Our trainer adds what the profiler cannot see (parameters and optimizer states alive before
    it started) and writes the peak into diag_run.json: that is the job's peak, above the traces'
    lower bound, and the model is calibrated on it."""
    steps = [json.loads(x) for x in open(os.path.join(pp_run, "steps.jsonl")) if x.strip()]
    measured = max(r["peak_memory_bytes"] for r in steps if r["peak_memory_bytes"])
    assert pp_diag.facts.peak_memory_bytes == measured and pp_diag.memory.peak_source == "diag_run.json"
    assert measured > max(p.peak_bytes for p in pp_diag.memory.ranks)
    assert not pp_diag.memory.model_basis.startswith("not calibrated")


def test_the_curve_of_each_stage_keeps_its_peak(pp_run, pp_diag):
    curves = pp_diag.memory.curves
    assert [c.stage for c in curves] == [0, 1]
    for c in curves:
        assert max(c.allocated_bytes) == true_peak(_trace(pp_run, c.rank), gpu=False)
        assert 0 < len(c.t_s) <= CURVE_POINTS and c.t_s == sorted(c.t_s) and min(c.t_s) >= 0


def test_downsampling_keeps_each_buckets_largest_value():
    rng = np.random.default_rng(0)
    t = np.sort(rng.integers(0, 10**9, 20_000))
    v = rng.integers(0, 10**6, 20_000)
    v[12_345] = 10**7
    ct, cv = curve(t, v)
    assert len(ct) <= CURVE_POINTS and cv.max() == 10**7 and ct[np.argmax(cv)] == t[12_345]
    bucket = (t - t.min()) * CURVE_POINTS // (t.max() - t.min() + 1)
    for x, y in zip(ct[:20], cv[:20]):
        assert y == v[bucket == bucket[np.searchsorted(t, x)]].max()


def _with_gpu_memory(dst) -> tuple[str, int]:
    """The A100 trace with `[memory]` instants written in: GPU 0 (the compute device), GPU 1, and
    a CPU whose totals are larger (none of which may be taken for the GPU's); their GPU 0 peak."""
    with gzip.open(A100, "rt") as f:
        doc = json.load(f)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    lo, hi = min(e["ts"] for e in xs), max(e["ts"] for e in xs)
    rng = np.random.default_rng(1)
    for i, ts in enumerate(np.linspace(lo, hi, 3000)):
        dev_type, dev_id = [(1, 0), (1, 1), (0, -1)][i % 3]
        total = int(rng.integers(1 << 30, 2 << 30)) * (4 if dev_type == 0 or dev_id == 1 else 1)
        doc["traceEvents"].append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                                   "pid": 1, "tid": 1, "ts": float(ts),
                                   "args": {"Total Reserved": total, "Total Allocated": total, "Bytes": 512,
                                            "Device Type": dev_type, "Device Id": dev_id, "Addr": i}})
    os.makedirs(dst)
    path = os.path.join(dst, "rank-0.pt.trace.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path, true_peak(path, gpu=True, device_id=0)


def test_a_gpu_trace_gives_the_gpus_peak_and_calibrates_the_model(tmp_path):
    path, truth = _with_gpu_memory(tmp_path / "gpu")
    shape = dict(num_layers=2, hidden_size=256, num_attention_heads=4, seq_length=128, vocab_size=1024,
                 micro_batch_size=1, num_micro_batches=1)
    d = with_advice(diagnose(load_job(str(tmp_path / "gpu")), shape=shape))
    (p,) = d.memory.ranks
    assert (p.peak_bytes, p.device, p.lower_bound) == (truth, "GPU 0", False)
    assert d.facts.peak_memory_bytes == truth and d.memory.peak_source == "trace memory events"
    assert d.memory.model_basis.startswith("other ")                 # calibrated on it
    assert max(d.memory.curves[0].allocated_bytes) == truth
    assert f"{truth / (1 << 20):,.1f} MiB, from trace memory events" in render_text(d, width=200)


def test_diag_run_json_is_the_source_when_it_has_the_peak(tmp_path):
    path, truth = _with_gpu_memory(tmp_path / "gpu")
    with open(tmp_path / "gpu" / "diag_run.json", "w") as f:
        json.dump({"schema_version": 1, "peak_memory_bytes": 3 << 30}, f)
    d = diagnose(load_job(str(tmp_path / "gpu")))
    assert d.facts.peak_memory_bytes == 3 << 30 and d.memory.peak_source == "diag_run.json"
    assert d.memory.ranks[0].peak_bytes == truth               # the trace's own is still shown


def test_without_memory_events_the_peak_is_unknown_and_says_why(tmp_path):
    d = diagnose(load_job(os.path.join(DATA, "gloo_cpu_only_rank34")))
    (p,) = d.memory.ranks
    assert p.peak_bytes is None and "no memory events" in p.why and "profile_memory=True" in p.why
    assert d.facts.peak_memory_bytes is None and d.memory.curves == []
    text = render_text(d, width=400)
    assert "Peak memory per rank: unknown (the trace has no memory events" in text
    assert "no memory curve: the trace has no memory events" in render_html(d)


def test_the_summary_carries_the_memory_and_refuses_an_impossible_one(pp_run, tmp_path):
    trace = shutil.copy(_trace(pp_run, 1), tmp_path / "rank-1.pt.trace.json.gz")
    out, problem = summarize_file(str(trace))
    assert problem is None
    m = summary_file.read(out).summary.memory
    assert m.peak_bytes == true_peak(str(trace), gpu=False) == int(m.allocated.max())
    sf = summary_file.read(out)
    sf.summary.memory.peak_bytes += 1                          # not the curve's largest point
    summary_file.write(out, sf)
    with pytest.raises(TraceError, match="memory peak is not the largest point"):
        summary_file.read(out)


def test_the_html_report_has_the_memory_chart_per_stage(pp_diag):
    page = render_html(pp_diag)
    assert "<h2 id='memory'>Memory</h2>" in page
    assert "Allocated memory over time, per stage" in page and "stage 0 (rank 0)" in page and "stage 1 (rank 1)" in page
    assert "What the memory model says the peak is made of" in page


def test_the_dashboard_memory_page(pp_run, pp_diag, monkeypatch):
    at = app(os.path.dirname(pp_run), monkeypatch, "memory", run=os.path.basename(pp_run))
    assert at.title[0].value == "Memory" and not at.error
    assert len(at.get("plotly_chart")) == 2                    # the curves, the model's parts beside them
    rows = at.dataframe[0].value
    assert list(rows["rank(s)"]) == ["0", "1"]
    assert list(rows["peak MiB"]) == [f"≥ {p.peak_bytes / (1 << 20):,.1f}" for p in pp_diag.memory.ranks]
    assert [i.value for i in at.info] == []


def test_the_dashboard_memory_page_says_why_it_is_empty(tmp_path, monkeypatch):
    shutil.copytree(os.path.join(DATA, "gloo_cpu_only_rank34"), tmp_path / "gloo")
    at = app(tmp_path, monkeypatch, "memory", run="gloo")
    assert len(at.info) == 1 and "no memory curve" in at.info[0].value and "profile" in at.info[0].value


def test_a_big_job_shows_one_row_per_stage_its_largest_rank():
    from types import SimpleNamespace

    from diag.analysis.results import MemoryUsage, RankPeak
    from diag.report.memfmt import memory_rows

    peaks = [RankPeak(rank=r, stage=r // 10, peak_bytes=(r + 1) << 20, device="GPU 0", events=3) for r in range(20)]
    peaks[15] = RankPeak(rank=15, stage=1, peak_bytes=None, device="GPU 0", events=0, why="none on the GPU")
    rows = memory_rows(SimpleNamespace(memory=MemoryUsage(peak_source="trace memory events", ranks=peaks)))
    assert rows == [["10 ranks", "0", "GPU 0", "10.0", "30"], ["10 ranks", "1", "GPU 0", "20.0", "27"]]


def test_events_out_of_time_order_in_the_file_give_the_same_memory(pp_run, tmp_path):
    """Threads' events interleave in a trace file: the curve is in time order all the same (a
    summary with a backwards curve is refused as corrupt), with the same peak."""
    path = _trace(pp_run, 1)
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    doc["traceEvents"].reverse()
    flipped = str(tmp_path / "rank-1.pt.trace.json")
    with open(flipped, "w") as f:
        json.dump(doc, f)
    a, b = (summarize(load_rank(p)).memory for p in (path, flipped))
    assert b.t_ns.size > 1 and bool((np.diff(b.t_ns) >= 0).all())
    assert (b.peak_bytes, b.events) == (a.peak_bytes, a.events) == (true_peak(path, gpu=False), a.events)
