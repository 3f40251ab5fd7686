"""Compare: two runs side by side, with the differences."""
import streamlit as st

import ui
from diag.analysis.results import steps_in_window
from diag.report import charts

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


def row(label: str, f, fmt):
    va, vb = f(a.diagnosis), f(b.diagnosis)
    diff = "-" if va is None or vb is None else fmt(vb - va)
    return [label, fmt(va) if va is not None else "unknown", fmt(vb) if vb is not None else "unknown", diff]


def mean_part(d, part):
    n = steps_in_window(d.ranks)
    return sum(getattr(r.breakdown, part) for r in d.ranks) / max(1, len(d.ranks)) / n


def ms(x):
    return f"{x * 1e3:,.2f} ms"


tp = lambda d, k: getattr(d.throughput, k) if d.throughput else None  # noqa: E731
rows = [row("step time", lambda d: tp(d, "step_time_s"), ms),
        row("tokens/s per GPU", lambda d: tp(d, "tokens_per_s_per_gpu"), lambda x: f"{x:,.0f}"),
        row("MFU", lambda d: tp(d, "mfu"), lambda x: f"{100 * x:.1f}%"),
        row("ranks", lambda d: len(d.ranks), str)]
rows += [row(f"{p} per step (mean rank)", lambda d, p=p: mean_part(d, p + "_s"), ms)
         for p in ("compute", "comm", "memory", "idle")]
c1, c2 = st.columns(2)
c1.metric("A: " + a.label, ui.ms(tp(a.diagnosis, "step_time_s")))
c2.metric("B: " + b.label, ui.ms(tp(b.diagnosis, "step_time_s")))
ui.table(["", "A", "B", "B - A"], rows)
st.plotly_chart(charts.compare_bars(a.diagnosis, b.diagnosis, ("A", "B")), width="stretch")
left, right = st.columns(2)
for col, run in ((left, a), (right, b)):
    with col:
        st.subheader(run.label)
        st.plotly_chart(charts.breakdown_bars(run.diagnosis), width="stretch", key=f"bd-{run.label}")
