"""Plotly figures of measured memory (Diagnosis.memory), for the dashboard and the HTML report:
allocated bytes over time, one line per pipeline stage, and beside it what the memory model
says each stage's peak is made of. Like charts.py, nothing here computes a metric."""
from __future__ import annotations

from typing import Optional

from ..analysis.results import Diagnosis
from .charts import _go, _layout
from .memfmt import MiB

STAGE_COLORS = ("#4c78a8", "#e45756", "#54a24b", "#f58518", "#b279a2", "#72b7b2", "#eeca3b", "#9d755d")
PART_COLORS = {"weights": "#4c78a8", "gradients": "#72b7b2", "optimizer states": "#b279a2",
               "ZeRO-3 buffers (gathered weights, deferred gradients)": "#9d755d",
               "DP gradient buckets": "#54a24b", "activations": "#f58518",
               "other (measured - modelled)": "#bab0ac"}


def memory_why_empty(d: Diagnosis) -> Optional[str]:
    """Why the memory-over-time chart has no line, and what would give it one; None when it has."""
    m = d.memory
    if m is not None and m.curves:
        return None
    why = m.unknown if m is not None and m.unknown else "no rank analysed"
    return f"no memory curve: {why}"


def memory_curves(d: Diagnosis):
    """Allocated MiB over time: per stage its rank with the highest peak (per job when the stages
    are unknown), each curve the largest total in each time bucket; the peak marked."""
    go = _go()
    fig = go.Figure()
    curves = d.memory.curves if d.memory is not None else []
    for i, c in enumerate(curves):
        who = f"stage {c.stage} (rank {c.rank})" if c.stage is not None else f"rank {c.rank}"
        color = STAGE_COLORS[i % len(STAGE_COLORS)]
        y = [b / MiB for b in c.allocated_bytes]
        fig.add_trace(go.Scatter(x=[1e3 * t for t in c.t_s], y=y, mode="lines", name=who, line=dict(color=color),
                                 line_shape="hv"))
        top = max(range(len(y)), key=y.__getitem__)
        fig.add_trace(go.Scatter(x=[1e3 * c.t_s[top]], y=[y[top]], mode="markers+text", showlegend=False,
                                 marker=dict(color=color, size=9), text=[f"peak {y[top]:,.1f} MiB"],
                                 textposition="top center"))
    if not curves:
        fig.add_annotation(text=memory_why_empty(d) or "", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return _layout(fig, "Allocated memory over time, per stage", "ms from the start of the rank's window", "MiB allocated")


def memory_model_bars(d: Diagnosis):
    """Per stage, the memory model's peak for the measured layout, stacked by part; its title
    says whether it is calibrated on the measured peak."""
    go = _go()
    parts = d.memory.model if d.memory is not None else []
    stages = [f"stage {p.stage}" for p in parts]
    values = {"weights": [p.weights for p in parts], "gradients": [p.grads for p in parts],
              "optimizer states": [p.optimizer for p in parts],
              "ZeRO-3 buffers (gathered weights, deferred gradients)": [p.sharding_buffers for p in parts],
              "DP gradient buckets": [p.dp_buckets for p in parts],
              "activations": [p.activations for p in parts],
              "other (measured - modelled)": [p.other for p in parts]}
    fig = go.Figure([go.Bar(name=k, x=stages, y=[x / MiB for x in v], marker_color=PART_COLORS[k])
                     for k, v in values.items()])
    fig.update_layout(barmode="stack")
    basis = (d.memory.model_basis or "") if d.memory is not None else ""
    title = "What the memory model says the peak is made of" + (" (not calibrated)" if basis.startswith("not") else "")
    return _layout(fig, title, "", "MiB")
