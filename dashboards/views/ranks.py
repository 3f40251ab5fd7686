"""Ranks: step time and collective wait per rank as heatmaps, stragglers highlighted."""
import streamlit as st

import ui
from diag.report import charts
from diag.report.fmt import straggler_line

d = ui.current().diagnosis
st.title("Ranks")
stragglers = d.comm.stragglers if d.comm else []
for s in stragglers:
    st.warning(f"Straggler: {ui.md(straggler_line(s))}")
if d.comm and d.comm.stragglers_unknown:
    st.info(f"Stragglers: cannot tell ({ui.md(d.comm.stragglers_unknown)}).")
elif not stragglers:
    st.success("No straggler: no rank's steps or arrivals at collectives stand out.")
empty = charts.why_empty(d)
if "steps" in empty:
    st.info(ui.md(empty["steps"]))
st.plotly_chart(charts.step_heatmap(d), width="stretch")
if d.comm:
    if "wait" in empty:
        st.info(ui.md(empty["wait"]))
    st.plotly_chart(charts.wait_heatmap(d), width="stretch")
