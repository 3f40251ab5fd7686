"""A self-contained HTML report: the dashboard's charts and tables in one file to share.

Problem: a ticket or a chat message cannot run the dashboard. This file can be opened
anywhere offline: plotly.js is inlined once, every figure is a plotly div, every table
plain HTML, and nothing is fetched from the network. The tables reuse the text and
Markdown renderers' rows (fmt.py); the figures are charts.py's.
"""
from __future__ import annotations

import html
from typing import Optional

from ..analysis.gantt import PipelineGantt
from ..analysis.results import Diagnosis
from . import charts, memcharts
from .frfmt import FR_TIMING_HEADER, fr_lines, fr_timing_legend, fr_timing_rows
from .memfmt import MEMORY_HEADER, memory_caption, memory_lines, memory_rows
from .fmt import (AXIS_HEADER, FINDING_HEADER, FINDING_LEGEND, GANTT_LEGEND, KERNEL_HEADER, OPS_HEADER,
                  PIPE_HEADER, RANK_HEADER, RANK_LEGEND, axis_rows, finding_rows, grouped_rank_notes,
                  headline, kernel_rows, ms, op_rows, ops_legend, per, pipeline_caption, pipeline_rows,
                  rank_row, straggler_lines, throughput_lines)

_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;
color:#222;padding:0 1em}table{border-collapse:collapse;margin:.5em 0 1em}td,th{padding:.25em .7em;
border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}
th{background:#f4f4f4}caption{caption-side:bottom;font-size:.85em;color:#666;text-align:left;padding-top:.3em}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f6f6;padding:.5em}
.note{color:#555;font-size:.9em}.straggler{color:#b00020}nav a{margin-right:1em}h2{margin-top:1.6em}"""
_SECTIONS = (("overview", "Overview"), ("communication", "Communication"), ("pipeline", "Pipeline"),
             ("memory", "Memory"), ("ranks", "Ranks"), ("recommendations", "Recommendations"))


def _e(s: object) -> str:
    return html.escape(str(s))


def table(header: list[str], rows: list[list[str]], caption: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(fig) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True})


def _overview(d: Diagnosis) -> list[str]:
    out = [f"<p>{_e(line)}</p>" for line in throughput_lines(d)]
    if d.findings:
        out += ["<h3>Where the time goes, biggest loss first</h3>",
                table(per(d, FINDING_HEADER), finding_rows(d), per(d, FINDING_LEGEND))]
    out += [_figure(charts.breakdown_bars(d)), table(RANK_HEADER, [rank_row(r) for r in d.ranks], per(d, RANK_LEGEND))]
    for r in d.ranks[:1]:
        out += [f"<h3>Top kernels, rank {r.rank}</h3>",
                table(KERNEL_HEADER, kernel_rows(r), "others: diag analyze --format json" if len(d.ranks) > 1 else "")]
    return out


def _communication(d: Diagnosis) -> list[str]:
    if not d.comm:
        return ["<p>No communication in these traces.</p>"]
    empty = charts.why_empty(d)
    out = [table(per(d, AXIS_HEADER), axis_rows(d)), *_why(empty, "axes"), _figure(charts.axis_exposure_bars(d)),
           *_why(empty, "busbw"), _figure(charts.busbw_scatter(d)), table(OPS_HEADER, op_rows(d), ops_legend(d))]
    out += [f"<p class='note'>note: {_e(n)}</p>" for n in d.comm.notes]
    return out


def _flight_recorder(d: Diagnosis) -> list[str]:
    """The dumps' hang lines first (the line a person acts on), then the timings over the buffer."""
    fr = d.flight_recorder
    marked = ("hang:", "missing dumps:", "late:", "in flight:", "snapshot (")
    out = [("<p class='straggler'>" if line.startswith(marked) else "<p>") + f"{_e(line)}</p>" for line in fr_lines(fr)]
    if fr.timings:
        out.append(table(FR_TIMING_HEADER, fr_timing_rows(fr), fr_timing_legend(fr)))
    return out


def _pipeline(d: Diagnosis, gantt: Optional[PipelineGantt]) -> list[str]:
    out = []
    if d.pipeline:
        out.append(table(per(d, PIPE_HEADER), pipeline_rows(d), pipeline_caption(d)))
    else:
        out.append("<p>No pipeline parallelism known for this run (PP = 1, or give --pp).</p>")
    if gantt and gantt.rows:
        ideal = d.pipeline.ideal_fraction if d.pipeline else None
        out += [_figure(charts.gantt_chart(gantt, ideal)),
                f"<p class='note'>{_e(gantt.note)}. {_e(_drawn_ranks(gantt))}{_e(gantt.labels)}. {_e(GANTT_LEGEND)}.</p>"]
    return out


def _memory(d: Diagnosis) -> list[str]:
    out = [f"<p>{_e(line)}</p>" for line in memory_lines(d)]
    if d.memory is not None and memory_rows(d):
        out.append(table(MEMORY_HEADER, memory_rows(d), memory_caption(d.memory)))
    why = memcharts.memory_why_empty(d)
    out += ([f"<p class='note'>{_e(why)}</p>"] if why else []) + [_figure(memcharts.memory_curves(d))]
    if d.memory is not None and d.memory.model:
        out.append(_figure(memcharts.memory_model_bars(d)))
    return out


def _drawn_ranks(g: PipelineGantt) -> str:
    """Which rank each stage's row is, and how many of the stage's ranks are not drawn here."""
    said = []
    for r in g.rows:
        if r.stage is not None:
            n = g.stage_ranks(r.stage) - 1
            said.append(f"stage {r.stage}: rank {r.rank}, " + (f"{n} other rank{'s' * (n != 1)} of the stage not drawn"
                                                              if n else "the stage's only rank loaded"))
    return f"Rows drawn: {'; '.join(said)} (the dashboard's Pipeline page draws any rank of a stage). " if said else ""


def _why(empty: dict, chart: str) -> list[str]:
    """Why the next chart is empty or partly blank (charts.why_empty), when it is."""
    return [f"<p class='note'>{_e(empty[chart])}</p>"] if chart in empty else []


def _ranks(d: Diagnosis) -> list[str]:
    empty = charts.why_empty(d)
    out = [*_why(empty, "steps"), _figure(charts.step_heatmap(d))]
    if d.comm:
        out += [*_why(empty, "wait"), _figure(charts.wait_heatmap(d))]
        out += [f"<p class='straggler'>{_e(line)}</p>" for line in straggler_lines(d)]
    return out


def _recommendation(i: int, r) -> str:
    after = f"upper bound {ms(r.step_s_after)} ms" if r.upper_bound else f"predicted {ms(r.step_s_after)} ms"
    gain = "" if r.gain is None else f", {100 * r.gain:.1f}% faster" + (" at best" if r.upper_bound else "")
    rows = [[e.metric, f"{e.value:.4g}", f"{e.threshold:.4g}", e.unit] for e in r.evidence]
    flags = r.flag_words
    notes = [f"<li>check: {_e(c)}</li>" for c in r.checks] + [f"<li>assumes: {_e(a)}</li>" for a in r.assumptions]
    return (f"<h3>{i}. {_e(r.title)}</h3><p>step {ms(r.step_s_before)} ms → {after}{gain}; "
            f"confidence {_e(r.confidence)}</p>" + table(["evidence", "value", "threshold", "unit"], rows)
            + (f"<pre>{_e(r.command or flags)}</pre>" if r.command or flags else "")
            + f"<p class='note'>{_e(r.why)}</p>" + (f"<ul class='note'>{''.join(notes)}</ul>" if notes else ""))


def _recommendations(d: Diagnosis) -> list[str]:
    recs = getattr(d, "recommendations", None)
    if not recs:
        return ["<p>No recommendation: no measured loss crossed a rule's threshold (<code>diag recommend</code>).</p>"]
    return [_recommendation(i, r) for i, r in enumerate(recs, 1)]


def render_html(d: Diagnosis, gantt: Optional[PipelineGantt] = None, title: str = "diag report") -> str:
    """The whole report as one HTML document; gantt (analysis.gantt) adds the pipeline chart."""
    gantt = gantt or d.gantt
    from plotly.offline import get_plotlyjs

    sections = ((("flightrec", "Flight Recorder"),) if d.flight_recorder else ()) + _SECTIONS
    body = [f"<h1>{_e(title)}</h1>", "<nav>" + "".join(f"<a href='#{k}'>{v}</a>" for k, v in sections) + "</nav>"]
    body += [f"<p>{_e(line)}</p>" for line in headline(d)]
    body += [f"<p class='note'>problem: {_e(p.file)}: {_e(p.problem)}</p>" for p in d.problems]
    body += [f"<p class='note'>note: {_e(n)}</p>" for n in d.notes]
    if d.flight_recorder:                  # a hang is what to read first
        body += ["<h2 id='flightrec'>Flight Recorder</h2>", *_flight_recorder(d)]
    builders = {"overview": lambda: _overview(d), "communication": lambda: _communication(d),
                "pipeline": lambda: _pipeline(d, gantt), "memory": lambda: _memory(d), "ranks": lambda: _ranks(d),
                "recommendations": lambda: _recommendations(d)}
    for key, name in _SECTIONS:
        body += [f"<h2 id='{key}'>{name}</h2>", *builders[key]()]
    body += [f"<p class='note'>{_e(who)}: {_e(n)}</p>" for who, n in grouped_rank_notes(d)]
    body.append(f"<p class='note'>{_e(d.tool)} schema {_e(d.schema_version)}; source {_e(d.source)}</p>")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
