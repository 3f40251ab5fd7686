"""Per-step figures are per step only where the window is made of ProfilerSteps.

With fewer than two steps the window is the whole trace (HTA's convention). Where the trace's work
runs far past its one step (a host trace whose gloo threads go on for a second after it), dividing
the window's totals by one step read "communication 1,102.98 ms/step, 525% of the step": the
figures are the window's, and the report says so."""
from __future__ import annotations

import gzip
import json
import os

import pytest

from conftest import DATA
from diag.analysis import diagnose
from diag.analysis.results import UNBOUNDED_SPAN, per_what, window_is_steps
from diag.report.markdown import render_markdown
from diag.report.text import render_text
from diag.trace import load_job
from kineto import TraceBuilder

ROOT = os.path.dirname(DATA.rstrip("/").rsplit("/", 1)[0])
GLOO = os.path.join(DATA, "gloo_cpu_only_rank34")


def _raw_span_and_step(folder: str) -> tuple[float, float]:
    """From the raw events: the host work's span and the one ProfilerStep's length (us)."""
    (name,) = os.listdir(folder)
    with gzip.open(os.path.join(folder, name)) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    work = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")
            and not e["name"].startswith("ProfilerStep")]
    (step,) = [e["dur"] for e in events if e["name"].startswith("ProfilerStep#")]
    return max(e["ts"] + e["dur"] for e in work) - min(e["ts"] for e in work), step


def test_a_whole_trace_past_its_one_step_is_reported_per_window():
    span, step = _raw_span_and_step(GLOO)
    assert span > UNBOUNDED_SPAN * step      # the trace is the case: 1.26 s of work, a 210 ms step
    d = diagnose(load_job(GLOO))
    assert not window_is_steps(d.ranks) and per_what(d.ranks) == "window"
    assert d.findings and all(f.share_of_step is None for f in d.findings)
    r = d.ranks[0]
    comm = next(f for f in d.findings if f.what.startswith("communication"))
    assert comm.seconds_per_step == pytest.approx(r.overlap.exposed_s)   # the window's total, said so
    assert "the window 1,264.6 ms" in comm.detail and "the step 210.1 ms" in comm.detail
    text = render_text(d)
    assert "ms/window" in text and "ms/step" not in text and "525" not in text
    assert "| where the time goes | ms/window | % step |" in render_markdown(d)


def test_one_step_that_bounds_the_work_is_per_step():
    """The instrumented trainer's traces have one ProfilerStep that holds all the work."""
    d = diagnose(load_job(os.path.join(ROOT, "sample_traces", "tp2_pp2_dp2")))
    assert len(d.ranks) == 8 and window_is_steps(d.ranks)
    assert all(f.share_of_step is not None for f in d.findings)
    assert "ms/window" not in render_text(d) and "ms/step" in render_text(d)


def test_no_step_marks_is_per_window():
    d = diagnose(load_job(os.path.join(DATA, "b200_rank0_of_8_eager")))
    assert per_what(d.ranks) == "window" and "ms/window" in render_text(d)


@pytest.mark.parametrize("work_end_ms, unit", [(14.0, "step"), (16.0, "window"), (100.0, "window")])
def test_the_bound_is_the_span_against_the_step(tmp_path, work_end_ms, unit):
    """One 10 ms step, host work from its start to `work_end_ms`: per step up to 1.5x its length."""
    b = TraceBuilder(backend="gloo").step(1, 0, 10_000)
    b.cpu_op("aten::mm", 100, 5_000).cpu_op("aten::add", 6_000, work_end_ms * 1e3 - 6_000, tid=7)
    b.write(str(tmp_path / "rank0.json"))
    d = diagnose(load_job(str(tmp_path)))
    assert d.ranks[0].breakdown.span_s == pytest.approx((work_end_ms * 1e3 - 100) / 1e6)   # first op to last end
    assert per_what(d.ranks) == unit


def test_a_recommender_failure_is_said_where_the_recommendations_go(monkeypatch):
    """A recommender that raises (here: made to) costs the diagnosis nothing and the reports say it
    failed in place of the recommendations, not "nothing worth changing"."""
    import diag.advise.recommend as recommend
    from diag.advise.results import Advice
    from diag.report.advice import render_advice

    def broken(d):
        raise ValueError("fwd_s_per_layer and bwd_ratio must be > 0")

    monkeypatch.setattr(recommend, "calibrate", broken)
    d = recommend.with_advice(diagnose(load_job(os.path.join(ROOT, "sample_traces", "pp2_m2"))))
    said = "Recommendations could not be computed (ValueError: fwd_s_per_layer and bwd_ratio must be > 0)"
    for text in (render_text(d, width=400), render_markdown(d), render_advice(Advice.of(d), "text")):
        tail = text[text.index("Recommendations"):]
        assert said in tail and "Nothing worth changing" not in tail, tail[:300]
    assert d.ranks and d.findings                     # the diagnosis itself is whole


def test_shares_are_of_the_steps_in_the_window(tmp_path):
    """A GPU trace of two profiled steps (the trainer's default): the window is the first (HTA's
    convention leaves out work launched in the last), so its idle is a share of that step, not of
    the median of both. A 100 ms step whose kernels span 98 ms with 88 ms idle between them, then a
    40 ms one: 88% of the step (the median of both, 70 ms, read it as 126%, and the micro-batch rule
    took a share over 1 for step marks that do not bound the work, and said nothing)."""
    b = TraceBuilder().step(1, 0, 100_000).step(2, 100_000, 40_000)
    b.kernel("ampere_sgemm", 2_000, 5_000).kernel("ampere_sgemm", 95_000, 5_000)   # 90 ms idle between
    b.kernel("ampere_sgemm", 101_000, 30_000)
    b.write(str(tmp_path / "rank0.json"))
    d = diagnose(load_job(str(tmp_path)))
    (idle,) = [f for f in d.findings if f.what == "GPU idle"]
    assert idle.seconds_per_step == pytest.approx(0.088)
    assert d.ranks[0].window_step_s == pytest.approx(0.100) and d.ranks[0].step_time_s == pytest.approx(0.070)
    assert idle.share_of_step == pytest.approx(0.88)


def test_shares_on_a_real_gpu_trace_against_its_raw_steps():
    """The H200 launch-bound sample (two profiled steps): the GPU idle's share is its ms per step
    over the first ProfilerStep's length, read from the raw events."""
    folder = os.path.join(ROOT, "sample_traces", "h200_launch_bound")
    with gzip.open(os.path.join(folder, "rank-0.pt.trace.json.gz")) as f:
        steps = sorted((e["ts"], e["dur"]) for e in json.load(f)["traceEvents"]
                       if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                       and e.get("name", "").startswith("ProfilerStep#"))
    assert len(steps) == 2
    d = diagnose(load_job(folder))
    (idle,) = [f for f in d.findings if f.what == "GPU idle"]
    assert idle.share_of_step == pytest.approx(idle.seconds_per_step / (steps[0][1] * 1e-6), rel=1e-9)
    assert idle.share_of_step < 1.0
