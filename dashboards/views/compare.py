"""Compare: two runs side by side, with the signed differences, on shared scales."""
import streamlit as st

import ui
from diag.advise.compare import compare
from diag.report import charts
from diag.report.advice import comparison_rows

a = ui.current()
st.title("Compare")
runs = ui.list_runs(ui.settings().root)
others = [r for r in runs if r != st.session_state.get("run_name")]
wanted = st.query_params.get("compare")
if "compare_pick" not in st.session_state:
    st.session_state["compare_pick"] = wanted if wanted in others else None
pick = st.selectbox("Compare with", others, key="compare_pick", placeholder="pick a second run")
name = pick or wanted
if not name:
    st.info("Pick a second run to compare with.")
    st.stop()
st.query_params["compare"] = name
b = ui.open_run(name)
if b is None:
    st.stop()


# The same comparison as `diag compare A B` (diag.advise.compare), rendered as it renders it.
cmp = compare(a.diagnosis, b.diagnosis)
for n in cmp.notes:
    st.warning(ui.md(n))
c1, c2 = st.columns(2)
step = lambda d: d.throughput.step_time_s if d.throughput else None  # noqa: E731
c1.metric("A: " + ui.md(a.label), ui.ms(step(a.diagnosis)))
c2.metric("B: " + ui.md(b.label), ui.ms(step(b.diagnosis)))
ui.table(["metric", "unit", "A", "B", "B vs A"], comparison_rows(cmp))
st.caption("B vs A: signed change from A to B, marked better or worse past 2%.")
if cmp.config:
    ui.table(["setting", "A", "B"], [[str(k), str(x), str(y)] for k, x, y in cmp.config])
st.plotly_chart(charts.compare_bars(a.diagnosis, b.diagnosis, ("A", "B")), width="stretch")
left, right = st.columns(2)
y_max = max(charts.breakdown_peak_ms(a.diagnosis), charts.breakdown_peak_ms(b.diagnosis))   # one scale
for col, run in ((left, a), (right, b)):
    with col:
        st.subheader(ui.md(run.label))
        st.plotly_chart(charts.breakdown_bars(run.diagnosis, y_max), width="stretch", key=f"bd-{run.label}")
