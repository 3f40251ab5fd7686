"""Pipeline: one step of every stage as a Gantt chart (any rank of a stage), the bubble against the ideal."""
import dataclasses

import streamlit as st

import ui
from diag.report import charts
from diag.report.fmt import GANTT_LEGEND, PIPE_HEADER, per, pipeline_caption, pipeline_rows

run = ui.current()
d, g = run.diagnosis, run.gantt
st.title("Pipeline")
if d.pipeline:
    cols = st.columns(len(d.pipeline.stages) + 1)
    cols[0].metric("Ideal bubble", ui.pct(d.pipeline.ideal_fraction))
    for c, s in zip(cols[1:], d.pipeline.stages):
        c.metric(f"Stage {s.stage} bubble", ui.pct(s.bubble_fraction))
    ui.table(per(d, PIPE_HEADER), pipeline_rows(d))
    st.caption(ui.md(pipeline_caption(d)))
else:
    st.info("No pipeline parallelism known for this run (PP = 1, or the trace does not say: "
            "`diag analyze --pp`). The chart shows one step of each rank.")
if g.rows and g.others:
    # any rank of a stage in place of its first one (tp 0, dp 0): the analysis drew every one
    by_stage = {r.stage: [r] for r in g.rows}
    for r in g.others:
        by_stage.setdefault(r.stage, []).append(r)
    picked = [c.selectbox(f"Stage {stage}: rank", [r.rank for r in rows], key=f"gantt_stage_{stage}")
              for c, (stage, rows) in zip(st.columns(len(by_stage)), by_stage.items())]
    g = dataclasses.replace(g, rows=[r for stage_rows, rank in zip(by_stage.values(), picked)
                                     for r in stage_rows if r.rank == rank])
if g.rows:
    st.plotly_chart(charts.gantt_chart(g, d.pipeline.ideal_fraction if d.pipeline else None),
                    width="stretch")
    st.caption(f"{ui.md(g.note)}. {ui.md(g.labels)}. {GANTT_LEGEND}.")
else:
    st.info("No ProfilerStep in the analysis window: no step to draw.")
