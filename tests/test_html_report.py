"""`diag analyze --format html`: one self-contained file with the dashboard's charts and tables.

That it opens in Chromium without console errors is tested in test_dashboard_browser.py.
"""
from __future__ import annotations

import dataclasses
import html
import json
import os
import re

from click.testing import CliRunner
from plotly.offline import get_plotlyjs_version

from diag.analysis import diagnose
from diag.advise.recommend import with_advice
from diag.analysis.diagnose import job_layout, summaries_of
from diag.analysis.gantt import rank_step
from diag.cli import main
from diag.report import charts
from diag.report.fmt import short_kernel
from diag.report.html import render_html
from diag.trace import load_job
from kineto import TraceBuilder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "sample_traces", "tp2_pp2_dp2")
DLRM = os.path.join(ROOT, "tests", "data", "dlrm_4_ranks_alltoall")


def _charts(page: str) -> int:
    return len(re.findall(r'class="plotly-graph-div"', page))


def test_cli_writes_a_self_contained_report(tmp_path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["analyze", SAMPLE, "--format", "html", "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # plotly.js inlined, nothing loaded from elsewhere
    assert f"* plotly.js v{get_plotlyjs_version()}" in page
    assert not re.search(r"<script[^>]+src=", page) and not re.search(r"<link[^>]+href=", page)
    # breakdown, axis exposure, busbw, step heatmap, wait heatmap, the pipeline Gantt, memory over time
    # (empty: no memory events; it says why) and the memory model's parts
    assert _charts(page) == 8


def test_report_holds_the_diagnosis_numbers():
    job = load_job(SAMPLE)
    d = with_advice(diagnose(job))
    grid = job_layout(job, summaries_of(job))
    by_rank = {rt.rank: rt for rt in job.ranks}
    # with_advice(diagnose()) carries the Gantt, made from the per-rank summaries; each row equals the one
    # made straight from that rank's trace
    assert d.gantt.rows and all(
        row == rank_step(by_rank[row.rank], step=row.step, grid=grid, min_idle_fraction=0.002,
                         schedule=d.pipeline.schedule)
        for row in d.gantt.rows)
    page = render_html(d, d.gantt)
    assert _charts(page) == 8        # and the pipeline Gantt, the memory curve and the memory model's parts
    assert f"step {d.throughput.step_time_s * 1e3:,.1f} ms" in page
    for r in d.ranks:
        assert f"<td>{r.rank}</td><td>{r.step_time_s * 1e3:,.1f}</td>" in page
    for s in d.pipeline.stages:
        assert f"<td>{100 * s.bubble_fraction:.1f}</td>" in page
    for f in d.findings:
        assert f"<td>{f.what}</td><td>{f.seconds_per_step * 1e3:,.2f}</td>" in page
    for r in d.recommendations:
        assert r.title in page
    assert '"One step per stage (ProfilerStep#' in page
    # the bars carry their pipeline actions (1F1B, p = 2, m = 2), and the report says which rank each
    # row is and how many of its stage's ranks it leaves out
    for row in d.gantt.rows:
        assert {s.label for s in row.segments if s.label} == {"F0", "F1", "B0", "B1"}
    (gantt,) = [part for part in page.split("<div") if '"One step per stage (ProfilerStep#' in part]
    drawn = [x for arr in re.findall(r'"text":\[([^\]]*)\]', gantt) for x in json.loads(f"[{arr}]") if x]
    assert sorted(drawn) == sorted(["F0", "F1", "B0", "B1"] * len(d.gantt.rows))    # once per action and row
    assert "Rows drawn: stage 0: rank 0, 3 other ranks of the stage not drawn; stage 1: rank 4, 3 other ranks" in page
    assert "Bars labelled with the pipeline action they run" in page


def test_straggler_and_escaping_on_a_gpu_trace():
    d = with_advice(diagnose(load_job(DLRM)))
    page = render_html(dataclasses.replace(d, source="/runs/<img src=x onerror=alert(1)>"))
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert f"straggler: rank {d.comm.stragglers[0].rank} " in page
    assert "No pipeline parallelism known" in page


def _many_steps(path, n: int) -> list[float]:
    """A one-rank trace of n ProfilerSteps, step k lasting 1000 + 10 * (k % 7) us with one kernel in
    it; returns the step durations in ms as written."""
    b, at, durs = TraceBuilder(), 0.0, []
    for k in range(n):
        dur = 1000.0 + 10 * (k % 7)
        b.step(k, at, dur).kernel("gemm_kernel", at + 100, 500)
        durs.append(dur / 1e3)
        at += dur + 5
    b.write(str(path / "rank-0.pt.trace.json.gz"))
    return durs


def test_many_steps_make_a_bounded_report(tmp_path):
    """The step heatmap of 3,000 steps has MAX_STEP_COLUMNS columns at most, each the mean of a run
    of consecutive steps, worked here from the durations written to the trace; the page grows with
    the heatmap's bounded size, not with the number of steps."""
    durs = _many_steps(tmp_path, 3000)
    d = diagnose(load_job(str(tmp_path)))
    fig = charts.step_heatmap(d)
    per = -(-3000 // charts.MAX_STEP_COLUMNS)
    z = fig.data[0].z[0]
    assert len(z) == -(-3000 // per) <= charts.MAX_STEP_COLUMNS
    expected = [sum(durs[i:i + per]) / len(durs[i:i + per]) for i in range(0, 3000, per)]
    assert max(abs(a - b) for a, b in zip(z, expected)) < 1e-3
    assert f"mean of {per:,} consecutive steps of 3,000" in fig.layout.title.text
    small = tmp_path / "small"
    small.mkdir()
    _many_steps(small, 200)
    sizes = [len(render_html(x)) for x in (d, diagnose(load_job(str(small))))]
    assert abs(sizes[0] - sizes[1]) < 20_000, sizes      # 15 times the steps, about the same page


def test_recommendations_keep_checks_assumptions_and_say_upper_bound(tmp_path):
    """DLRM's straggler recommendation is an upper bound (the others' wait for it removed): the
    report says so, and keeps each check and assumption; long commands wrap (pre-wrap)."""
    from diag.runinputs import open_run

    d = open_run(DLRM)
    r = next(x for x in d.recommendations if x.rule == "straggler")
    assert r.upper_bound
    page = render_html(d)
    assert f"upper bound {r.step_s_after * 1e3:,.1f} ms" in page and "faster at best" in page
    for line in [*(f"check: {c}" for c in r.checks), *(f"assumes: {a}" for a in r.assumptions)]:
        assert f"<li>{html.escape(line)}</li>" in page
    assert "white-space:pre-wrap" in page
    top = d.ranks[0].top_kernels[0]
    assert f"<td>{html.escape(short_kernel(top.name))}</td><td>{top.kind}</td><td>{top.count}</td>" in page


def test_gantt_marks_the_ideal_bubble():
    """Under each stage's row, a bar as long as the ideal bubble of that row's step: (p-1)/(m+p-1)
    worked by hand for the sample (p=2, m=2: a third of the step)."""
    d = diagnose(load_job(SAMPLE))
    assert (d.pipeline.p, d.pipeline.m) == (2, 2)
    fig = charts.gantt_chart(d.gantt, d.pipeline.ideal_fraction)
    marks = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(marks) == len(d.gantt.rows) == 2
    for m, row in zip(marks, d.gantt.rows):
        assert abs(m.x1 - 1e3 * row.step_s / 3) < 1e-9 and m.x0 == 0


def test_per_step_work_is_one_pass_over_the_trace(tmp_path, monkeypatch):
    """Each step's span of work (exposed communication by step, the Gantt's step bounds) comes
    from one sort of the rows, not from a pass over the whole trace per step: 30,000 steps took
    23 s that way, a million past the hour. Counted, not timed: the rows' end times (a whole
    column each time) are computed a few times for a trace of 3,000 steps, not once per step;
    and the spans agree with the per-step masks they replace."""
    import numpy as np

    from diag.analysis.steps import work_spans, window_of
    from diag.trace.table import EventTable

    _many_steps(tmp_path, 3000)
    calls = {"end_ns": 0}
    plain = EventTable.end_ns.func          # a cached_property: counted here on every read

    def counted(self):
        calls["end_ns"] += 1
        return plain(self)

    monkeypatch.setattr(EventTable, "end_ns", property(counted))
    job = load_job(str(tmp_path))
    d = diagnose(job)
    render_html(d)
    assert len(d.ranks[0].steps) >= 2999 and calls["end_ns"] < 100, calls
    rt = job.ranks[0]
    _, w = window_of(rt)
    idx, lo, hi = work_spans(rt.events, w)
    t = rt.events
    want = np.unique(w.step_index[w.step_index >= 0])
    assert idx.tolist() == want.tolist()
    for i in want[:: 97]:
        rows = w.rows[w.step_index == i]
        k = int(np.searchsorted(idx, i))
        assert (lo[k], hi[k]) == (t.ts_ns[rows].min(), (t.ts_ns[rows] + t.dur_ns[rows]).max())
