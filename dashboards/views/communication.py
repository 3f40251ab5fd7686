"""Communication: per axis and op, busbw against message size, exposed versus hidden."""
import streamlit as st

import ui
from diag.report import charts
from diag.report.fmt import AXIS_HEADER, OPS_HEADER, axis_rows, op_rows, ops_legend, per

d = ui.current().diagnosis
st.title("Communication")
if not d.comm:
    st.info("No communication in these traces.")
    st.stop()
empty = charts.why_empty(d)
left, right = st.columns(2)
with left:
    st.subheader("Per parallel axis")
    ui.table(per(d, AXIS_HEADER), axis_rows(d))
    if "axes" in empty:
        st.info(ui.md(empty["axes"]))
    st.plotly_chart(charts.axis_exposure_bars(d), width="stretch")
with right:
    st.subheader("Bus bandwidth")
    if "busbw" in empty:
        st.info(ui.md(empty["busbw"]))
    st.plotly_chart(charts.busbw_scatter(d), width="stretch")
st.subheader("Collectives by axis, op and message size")
ui.table(OPS_HEADER, op_rows(d))
st.caption(ops_legend(d))
for n in d.comm.notes:
    st.caption(f"note: {ui.md(n)}")
