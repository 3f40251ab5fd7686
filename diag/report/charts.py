"""Plotly figures of a Diagnosis, shared by the Streamlit dashboard and the HTML report.

Each function takes results (a Diagnosis, a PipelineGantt) and returns a plotly Figure;
nothing here computes a metric, it only arranges what the analysis found. plotly is an
optional dependency (the `dashboard` extra), imported when a figure is built.
"""
from __future__ import annotations

from typing import Optional

from ..analysis.gantt import KINDS, PipelineGantt
from ..analysis.results import Diagnosis, steps_in_window

# One colour per kind of time, the same on every chart.
COLORS = {"compute": "#4c78a8", "forward": "#4c78a8", "backward": "#72b7b2", "optimizer": "#b279a2",
          "communication": "#f58518", "collective": "#f58518", "send/recv": "#e45756",
          "memory": "#54a24b", "idle": "#bab0ac", "hidden": "#9ecae9", "exposed": "#f58518"}
AXIS_COLORS = {"tp": "#4c78a8", "pp": "#e45756", "dp": "#54a24b", "unknown": "#8c8c8c"}


def _go():
    try:
        import plotly.graph_objects as go
    except ImportError as e:            # pragma: no cover - the dashboard extra is missing
        raise ImportError("charts need plotly: pip install 'diag[dashboard]'") from e
    return go


def _layout(fig, title: str, x: str = "", y: str = "", height: int = 380):
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, height=height, template="plotly_white",
                      margin=dict(l=60, r=20, t=50, b=50), legend=dict(orientation="h", y=-0.2))
    return fig




def breakdown_bars(d: Diagnosis):
    """Per rank, where the window's time goes, in ms per step, stacked."""
    go, n = _go(), steps_in_window(d.ranks)
    ranks = [f"rank {r.rank}" for r in d.ranks]
    parts = {"compute": lambda b: b.compute_s, "communication": lambda b: b.comm_s,
             "memory": lambda b: b.memory_s + b.other_s, "idle": lambda b: b.idle_s}
    fig = go.Figure([go.Bar(name=k, x=ranks, y=[1e3 * f(r.breakdown) / n for r in d.ranks],
                            marker_color=COLORS[k]) for k, f in parts.items()])
    fig.update_layout(barmode="stack")
    return _layout(fig, "Temporal breakdown per rank (communication = exposed)", "", "ms per step")


def axis_exposure_bars(d: Diagnosis):
    """Per parallel axis: communication hidden behind compute and exposed, ms per step."""
    go, n = _go(), steps_in_window(d.ranks)
    axes = d.comm.axes if d.comm else []
    names = [a.axis for a in axes]
    fig = go.Figure([go.Bar(name="hidden", x=names, y=[1e3 * (a.comm_s - a.exposed_s) / n for a in axes],
                            marker_color=COLORS["hidden"]),
                     go.Bar(name="exposed", x=names, y=[1e3 * a.exposed_s / n for a in axes],
                            marker_color=COLORS["exposed"])])
    fig.update_layout(barmode="stack")
    return _layout(fig, "Communication per axis: exposed vs hidden", "axis", "ms per step per rank")


def busbw_scatter(d: Diagnosis):
    """Bus bandwidth against message size per axis and op, with the link's peak drawn."""
    go = _go()
    fig = go.Figure()
    ops = [o for o in (d.comm.ops if d.comm else []) if o.median_bytes and o.busbw_median_gbps is not None]
    for key in sorted({(o.axis, o.op) for o in ops}):
        sel = [o for o in ops if (o.axis, o.op) == key]
        fig.add_trace(go.Scatter(
            x=[o.median_bytes for o in sel], y=[o.busbw_median_gbps for o in sel], mode="markers",
            name=f"{key[0]}:{key[1]}", marker=dict(size=11, color=AXIS_COLORS.get(key[0]),
                                                    symbol="circle" if key[1] != "send" else "diamond"),
            text=[f"{o.size_bucket}, {o.calls} calls, basis: {o.busbw_basis}" for o in sel]))
    for link, peak in sorted({(o.link, o.link_peak_gbps) for o in ops if o.link_peak_gbps}):
        fig.add_hline(y=peak, line_dash="dash", line_color="#333",
                      annotation_text=f"{link or 'link'} peak {peak:,.0f} GB/s")
    fig.update_xaxes(type="log")
    return _layout(fig, "Bus bandwidth vs message size (nccl-tests busbw)", "message size (bytes)", "busbw (GB/s)")


def step_heatmap(d: Diagnosis):
    """Host step time per rank and ProfilerStep, in ms."""
    go = _go()
    numbers = sorted({s.number for r in d.ranks for s in r.steps})
    z = [[next((1e3 * s.host_s for s in r.steps if s.number == n), None) for n in numbers] for r in d.ranks]
    fig = go.Figure(go.Heatmap(z=z, x=[f"step {n}" for n in numbers], y=[f"rank {r.rank}" for r in d.ranks],
                               colorscale="Blues", colorbar=dict(title="ms"), texttemplate="%{z:.1f}"))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, "Step time per rank (ms)", "", "", height=max(260, 40 * len(d.ranks) + 120))


def wait_heatmap(d: Diagnosis):
    """Per rank: collective time and the part of it spent waiting for the last rank, in ms;
    stragglers marked on the axis."""
    go = _go()
    comm = {c.rank: c for c in (d.comm.ranks if d.comm else [])}
    slow = {r for s in (d.comm.stragglers if d.comm else []) for r in s.ranks}
    ranks = [r.rank for r in d.ranks]
    cols = ["collective ms", "exposed ms", "wait ms"]
    z = [[1e3 * c.comm_s, 1e3 * c.exposed_s, None if c.wait_s is None else 1e3 * c.wait_s]   # None: unmeasured
         if (c := comm.get(r)) else [None] * 3 for r in ranks]
    labels = [f"rank {r} ⚠ straggler" if r in slow else f"rank {r}" for r in ranks]
    fig = go.Figure(go.Heatmap(z=z, x=cols, y=labels, colorscale="Oranges", colorbar=dict(title="ms"),
                               texttemplate="%{z:.1f}"))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, "Collective time and wait per rank (whole window)", "", "",
                   height=max(260, 40 * len(ranks) + 120))


def gantt_chart(g: PipelineGantt, ideal_fraction: Optional[float] = None):
    """One step of each stage: horizontal bars of forward/backward/optimizer, send/recv, idle."""
    go = _go()
    fig = go.Figure()
    def label(r) -> str:
        who = f"stage {r.stage} (rank {r.rank})" if r.stage is not None else f"rank {r.rank}"
        return (f"{who}<br>send/recv {100 * r.total('send/recv') / r.step_s:.1f}%, "
                f"idle {100 * r.total('idle') / r.step_s:.1f}%")

    names = {id(r): label(r) for r in g.rows}
    for kind in KINDS:
        segs = [(names[id(r)], s) for r in g.rows for s in r.segments if s.kind == kind]
        if segs:
            fig.add_trace(go.Bar(
                name=kind, orientation="h", y=[y for y, _ in segs], x=[1e3 * (s.end_s - s.start_s) for _, s in segs],
                base=[1e3 * s.start_s for _, s in segs], marker_color=COLORS[kind], marker_line_width=0,
                hovertemplate=f"{kind}: %{{base:.2f}} ms + %{{x:.2f}} ms<extra></extra>"))
    fig.update_layout(barmode="overlay", bargap=0.35)
    fig.update_yaxes(autorange="reversed")
    step = g.rows[0].step if g.rows else "-"
    ideal = "" if ideal_fraction is None else f"; ideal bubble {100 * ideal_fraction:.1f}% of the step"
    return _layout(fig, f"One step per stage (ProfilerStep#{step}), {g.timeline} timeline{ideal}", "ms from step start",
                   "", height=max(260, 90 * len(g.rows) + 140))


def compare_bars(a: Diagnosis, b: Diagnosis, names: tuple[str, str] = ("A", "B")):
    """Mean per-rank breakdown of two runs side by side, ms per step."""
    go = _go()
    parts = {"compute": lambda x: x.compute_s, "communication": lambda x: x.comm_s,
             "memory": lambda x: x.memory_s + x.other_s, "idle": lambda x: x.idle_s}

    def mean_ms(d, f):
        return 1e3 * sum(f(r.breakdown) for r in d.ranks) / max(1, len(d.ranks)) / steps_in_window(d.ranks)

    fig = go.Figure([go.Bar(name=k, x=list(names), y=[mean_ms(a, f), mean_ms(b, f)], marker_color=COLORS[k])
                     for k, f in parts.items()])
    fig.update_layout(barmode="stack")
    return _layout(fig, "Mean rank breakdown, two runs", "", "ms per step")
