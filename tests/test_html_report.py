"""`diag analyze --format html`: one self-contained file with the dashboard's charts and tables.

That it opens in Chromium without console errors is tested in test_dashboard_browser.py.
"""
from __future__ import annotations

import dataclasses
import os
import re

from click.testing import CliRunner
from plotly.offline import get_plotlyjs_version

from diag.analysis import diagnose
from diag.advise.recommend import with_advice
from diag.analysis.diagnose import job_layout, summaries_of
from diag.analysis.gantt import rank_step
from diag.cli import main
from diag.report.html import render_html
from diag.trace import load_job

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
    # breakdown, axis exposure, busbw, step heatmap, wait heatmap, and the pipeline Gantt
    assert _charts(page) == 6


def test_report_holds_the_diagnosis_numbers():
    job = load_job(SAMPLE)
    d = with_advice(diagnose(job))
    grid = job_layout(job, summaries_of(job))
    by_rank = {rt.rank: rt for rt in job.ranks}
    # with_advice(diagnose()) carries the Gantt, made from the per-rank summaries; each row equals the one
    # made straight from that rank's trace
    assert d.gantt.rows and all(
        row == rank_step(by_rank[row.rank], step=row.step, grid=grid, min_idle_fraction=0.002)
        for row in d.gantt.rows)
    page = render_html(d, d.gantt)
    assert _charts(page) == 6        # and the pipeline Gantt
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


def test_straggler_and_escaping_on_a_gpu_trace():
    d = with_advice(diagnose(load_job(DLRM)))
    page = render_html(dataclasses.replace(d, source="/runs/<img src=x onerror=alert(1)>"))
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    assert f"straggler: rank {d.comm.stragglers[0].rank} " in page
    assert "No pipeline parallelism known" in page
