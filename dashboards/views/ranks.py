"""Ranks: step time and collective wait per rank as heatmaps, stragglers highlighted."""
import streamlit as st

import ui
from diag.report import charts

d = ui.current().diagnosis
st.title("Ranks")
stragglers = d.comm.stragglers if d.comm else []
if stragglers:
    for s in stragglers:
        st.warning(f"Straggler: rank {s.rank} {s.reason}: {s.evidence}")
else:
    st.success("No straggler: no rank's steps or arrivals at collectives stand out.")
st.plotly_chart(charts.step_heatmap(d), width="stretch")
if d.comm:
    st.plotly_chart(charts.wait_heatmap(d), width="stretch")
