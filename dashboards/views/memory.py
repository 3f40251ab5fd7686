"""Memory: the measured peak per rank, allocated memory over time per stage, and beside it what
the memory model says each stage's peak is made of."""
import streamlit as st

import ui
from diag.report import memcharts
from diag.report.memfmt import MEMORY_HEADER, memory_caption, memory_rows, model_lines, peak_line

run = ui.current()
d = run.diagnosis
m = d.memory
st.title("Memory")
st.caption(ui.md(peak_line(d)))
why = memcharts.memory_why_empty(d)
if why:
    st.info(ui.md(why))
if m is not None and m.model:
    left, right = st.columns([3, 2])
    left.plotly_chart(memcharts.memory_curves(d), width="stretch")
    right.plotly_chart(memcharts.memory_model_bars(d), width="stretch")
    for line in model_lines(m):
        right.caption(ui.md(line))
else:
    st.plotly_chart(memcharts.memory_curves(d), width="stretch")
    if m is not None and m.model_basis:
        st.caption(ui.md(m.model_basis))
if memory_rows(d):
    ui.table(MEMORY_HEADER, memory_rows(d))
    st.caption(ui.md(memory_caption(m)))
