"""Overview: step time, throughput, MFU, the biggest losses and the per-rank breakdown."""
import streamlit as st

import ui
from diag.report import charts
from diag.report.fmt import FINDING_HEADER, FINDING_LEGEND, RANK_HEADER, RANK_LEGEND, finding_rows, headline, per, rank_row

run = ui.current()
d, t = run.diagnosis, run.diagnosis.throughput
st.title("Overview")
st.caption(ui.md(" · ".join(headline(d))))
cols = st.columns(4)
cols[0].metric("Step time", ui.ms(t.step_time_s if t else None))
cols[1].metric("Tokens/s per GPU", ui.rate(t.tokens_per_s_per_gpu if t else None))
cols[2].metric("MFU", ui.pct(t.mfu if t else None))
cols[3].metric("Ranks", f"{len(d.ranks)} of {d.world_size or '?'}")
if t and t.unknown:
    st.caption("Unknown: " + ui.md("; ".join(t.unknown)))
for p in d.problems:
    st.warning(ui.md(f"{p.file}: {p.problem}"))
if d.findings:
    st.subheader("Where the time goes, biggest loss first")
    ui.table(per(d, FINDING_HEADER), finding_rows(d))
    st.caption(per(d, FINDING_LEGEND))
st.plotly_chart(charts.breakdown_bars(d), width="stretch")
ui.table(RANK_HEADER, [rank_row(r) for r in d.ranks])
st.caption(per(d, RANK_LEGEND))
