"""Plotly figures of a Diagnosis, shared by the Streamlit dashboard and the HTML report.

Each function takes results (a Diagnosis, a PipelineGantt) and returns a plotly Figure;
nothing here computes a metric, it only arranges what the analysis found. plotly is an
optional dependency (the `dashboard` extra), imported when a figure is built.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..analysis.gantt import KINDS, PipelineGantt
from ..analysis.results import Diagnosis, per_what, steps_in_window

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


def why_empty(d: Diagnosis) -> dict[str, str]:
    """For each chart that would be empty or partly blank on this run: which fact is missing and
    what would make it known ("busbw", "steps", "wait", "axes")."""
    out = {}
    comm = d.comm
    if not any(s for r in d.ranks for s in r.steps):
        out["steps"] = ("no step times: the traces have no ProfilerStep marks (profile with a torch.profiler "
                        "schedule and call prof.step() each iteration)")
    if comm and not any(o.median_bytes and o.busbw_median_gbps is not None for o in comm.ops):
        why = [n for n in comm.notes if n.startswith("busbw unknown")]
        out["busbw"] = "no bus bandwidth to draw: " + ("; ".join(why) or "no collective has a message size and a time")
    if comm and any(c.wait_s is None for c in comm.ranks):
        out["wait"] = ("wait unknown (blank cells): " + (comm.stragglers_unknown or "some ranks' collectives were not "
                       "matched across their group") + "; the traces of every rank of the group would make it known")
    if comm and not comm.axes:
        out["axes"] = "no parallel axis known for the communication: give --tp/--pp/--dp-shard or --config"
    return out


_PARTS = {"compute": lambda b: b.compute_s, "communication": lambda b: b.comm_s,
          "memory": lambda b: b.memory_s + b.other_s, "idle": lambda b: b.idle_s}


def breakdown_peak_ms(d: Diagnosis) -> float:
    """The tallest rank's stacked bar in breakdown_bars, ms per step (to share a y-axis)."""
    n = steps_in_window(d.ranks)
    return max((1e3 * sum(f(r.breakdown) for f in _PARTS.values()) / n for r in d.ranks), default=0.0)


def breakdown_bars(d: Diagnosis, y_max_ms: Optional[float] = None):
    """Per rank, where the window's time goes, in ms per step, stacked; y_max_ms fixes the
    y-axis (two runs side by side on one scale)."""
    go, n = _go(), steps_in_window(d.ranks)
    ranks = [f"rank {r.rank}" for r in d.ranks]
    fig = go.Figure([go.Bar(name=k, x=ranks, y=[1e3 * f(r.breakdown) / n for r in d.ranks],
                            marker_color=COLORS[k]) for k, f in _PARTS.items()])
    fig.update_layout(barmode="stack")
    if y_max_ms:
        fig.update_yaxes(range=[0, 1.05 * y_max_ms])
    return _layout(fig, "Temporal breakdown per rank (communication = exposed)", "",
                   f"ms per {per_what(d.ranks)}")


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
    return _layout(fig, "Communication per axis: exposed vs hidden", "axis",
                   f"ms per {per_what(d.ranks)} per rank")


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


MAX_STEP_COLUMNS = 200      # a heatmap of a million steps would be a million cells per rank


def _block_means(z, per: int):
    """Mean of each run of `per` columns, ignoring missing steps (nan; a run with none stays nan)."""
    pad = np.full((z.shape[0], -z.shape[1] % per), np.nan)
    blocks = np.concatenate([z, pad], axis=1).reshape(z.shape[0], -1, per)
    counts = (~np.isnan(blocks)).sum(axis=2)
    sums = np.nansum(blocks, axis=2)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def step_heatmap(d: Diagnosis):
    """Host step time per rank and ProfilerStep, in ms; past MAX_STEP_COLUMNS steps each column is
    the mean of a run of consecutive steps (the title says how many), so the figure stays small."""
    go = _go()
    numbers = sorted({s.number for r in d.ranks for s in r.steps})
    col = {n: i for i, n in enumerate(numbers)}
    z = np.full((len(d.ranks), len(numbers)), np.nan)
    for i, r in enumerate(d.ranks):
        for s in r.steps:
            z[i, col[s.number]] = 1e3 * s.host_s
    per = max(1, -(-len(numbers) // MAX_STEP_COLUMNS))
    title = "Step time per rank (ms)"
    if per > 1:
        z = _block_means(z, per)
        x = [f"steps {numbers[k]}-{numbers[min(k + per, len(numbers)) - 1]}" for k in range(0, len(numbers), per)]
        title = f"Step time per rank (ms; each column the mean of {per:,} consecutive steps of {len(numbers):,})"
    else:
        x = [f"step {n}" for n in numbers]
    cells = [[None if np.isnan(v) else float(v) for v in row] for row in z]
    fig = go.Figure(go.Heatmap(z=cells, x=x, y=[f"rank {r.rank}" for r in d.ranks], colorscale="Blues",
                               colorbar=dict(title="ms"), texttemplate="%{z:.1f}" if len(x) <= 30 else ""))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, title, "", "", height=max(260, 40 * len(d.ranks) + 120))


def wait_heatmap(d: Diagnosis):
    """Per rank, ms per step: the time in collectives (their instances' durations added), the
    exposed communication (the breakdown's, the Overview's "exp ms") and the part of the
    collectives spent waiting for the last rank; stragglers marked on the axis."""
    go, n = _go(), steps_in_window(d.ranks)
    comm = {c.rank: c for c in (d.comm.ranks if d.comm else [])}
    slow = {r for s in (d.comm.stragglers if d.comm else []) for r in s.ranks}
    unit = per_what(d.ranks)
    cols = [f"collectives ms/{unit}", f"exposed ms/{unit}", f"wait ms/{unit}"]

    def row(r):
        c = comm.get(r.rank)
        exposed = 1e3 * (r.overlap.exposed_per_step_s if r.overlap.exposed_per_step_s is not None
                         else r.overlap.exposed_s / n)
        if c is None:
            return [None, exposed, None]
        return [1e3 * c.comm_s / n, exposed, None if c.wait_s is None else 1e3 * c.wait_s / n]  # None: unmeasured

    labels = [f"rank {r.rank} ⚠ straggler" if r.rank in slow else f"rank {r.rank}" for r in d.ranks]
    fig = go.Figure(go.Heatmap(z=[row(r) for r in d.ranks], x=cols, y=labels, colorscale="Oranges",
                               colorbar=dict(title="ms"), texttemplate="%{z:.1f}"))
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, f"Collective time, exposed communication and wait per rank (ms per {unit})", "", "",
                   height=max(260, 40 * len(d.ranks) + 120))


def gantt_chart(g: PipelineGantt, ideal_fraction: Optional[float] = None):
    """One step of each stage: horizontal bars of forward/backward/optimizer, send/recv, idle; each
    pipeline action's label (F3, B3, F3.1) written once per row, over the middle of its compute."""
    go = _go()
    fig = go.Figure()
    def label(r) -> str:
        who = f"stage {r.stage} (rank {r.rank})" if r.stage is not None else f"rank {r.rank}"
        n = g.stage_ranks(r.stage)
        of = "" if r.stage is None else "the stage's only rank; " if n == 1 else f"1 of the stage's {n} ranks; "
        return (f"{who}<br>{of}send/recv {100 * r.total('send/recv') / r.step_s:.1f}%, "
                f"gaps {100 * r.total('idle') / r.step_s:.1f}% of this step")

    names = {id(r): label(r) for r in g.rows}
    for kind in KINDS:
        segs = [(names[id(r)], s) for r in g.rows for s in r.segments if s.kind == kind]
        if segs:
            fig.add_trace(go.Bar(
                name="gap" if kind == "idle" else kind, orientation="h", y=[y for y, _ in segs], x=[1e3 * (s.end_s - s.start_s) for _, s in segs],
                base=[1e3 * s.start_s for _, s in segs], marker_color=COLORS[kind], marker_line_width=0,
                customdata=[s.label or "" for _, s in segs],
                hovertemplate=f"{kind} %{{customdata}}: %{{base:.2f}} ms + %{{x:.2f}} ms<extra></extra>"))
    _write_actions(fig, g, names)
    fig.update_layout(barmode="overlay", bargap=0.45)    # bars end 0.275 below their row: the ideal mark fits
    fig.update_yaxes(autorange="reversed")
    if ideal_fraction is not None:
        _mark_ideal_bubble(fig, g, ideal_fraction)
    step = g.rows[0].step if g.rows else "-"
    ideal = "" if ideal_fraction is None else f"; ideal bubble {100 * ideal_fraction:.1f}% of the step"
    fig = _layout(fig, f"One step per stage (ProfilerStep#{step}), {g.timeline} timeline{ideal}", "ms from step start",
                  "", height=max(300, 90 * len(g.rows) + 180))
    fig.update_layout(legend=dict(y=-0.3))               # below the axis title
    return fig


def _write_actions(fig, g: PipelineGantt, names: dict) -> None:
    """Each action's label once per row, at the middle of its labelled bars (an action's compute
    is often many bars with gaps between)."""
    at: dict = {}
    for r in g.rows:
        for s in r.segments:
            if s.label:
                lo, hi = at.get((id(r), s.label), (s.start_s, s.end_s))
                at[(id(r), s.label)] = (min(lo, s.start_s), max(hi, s.end_s))
    if not at:
        return
    fig.add_trace(_go().Scatter(
        x=[500 * (lo + hi) for lo, hi in at.values()], y=[names[k[0]] for k in at], text=[k[1] for k in at],
        mode="text", textfont=dict(size=10, color="#111"), name="pipeline action", showlegend=False,
        hoverinfo="skip"))


def _mark_ideal_bubble(fig, g: PipelineGantt, ideal_fraction: float) -> None:
    """Under each row, a thin bar as long as the schedule's ideal bubble of that row's step (its
    total, wherever the schedule puts it), to hold the row's gaps against."""
    go = _go()
    for i, r in enumerate(g.rows):           # category i sits at y = i; the axis runs downwards
        fig.add_shape(type="rect", xref="x", yref="y", x0=0, x1=1e3 * ideal_fraction * r.step_s,
                      y0=i + 0.3, y1=i + 0.4, fillcolor="#333", opacity=0.6, line_width=0)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(color="#333", width=4),
                             name=f"ideal bubble ({100 * ideal_fraction:.1f}% of the step, its total length)"))


def compare_bars(a: Diagnosis, b: Diagnosis, names: tuple[str, str] = ("A", "B")):
    """Mean per-rank breakdown of two runs side by side, ms per step."""
    go = _go()
    def mean_ms(d, f):
        return 1e3 * sum(f(r.breakdown) for r in d.ranks) / max(1, len(d.ranks)) / steps_in_window(d.ranks)

    fig = go.Figure([go.Bar(name=k, x=list(names), y=[mean_ms(a, f), mean_ms(b, f)], marker_color=COLORS[k])
                     for k, f in _PARTS.items()])
    fig.update_layout(barmode="stack")
    return _layout(fig, "Mean rank breakdown, two runs", "", "ms per step")
