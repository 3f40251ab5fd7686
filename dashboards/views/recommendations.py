"""Recommendations, ranked, with their evidence and re-run command; a what-if on the step-time model."""
import dataclasses

import streamlit as st

import ui

run = ui.current()
d, advice, cal = run.diagnosis, run.advice, run.calibration
st.title("Recommendations")
recs = getattr(d, "recommendations", None) or (advice.recommendations if advice else [])
if advice is None and not recs:
    st.info(f"No recommendations: {ui.md(cal)}")
for i, r in enumerate(recs, 1):
    with st.container(border=True):
        st.subheader(f"{i}. {ui.md(r.title)}")
        c = st.columns(4)
        c[0].metric("Step now", ui.ms(r.step_s_before))
        delta = None if r.step_s_after is None or r.step_s_before is None else \
            f"{(r.step_s_after - r.step_s_before) * 1e3:+,.1f} ms"
        bound = "Upper bound" if r.upper_bound else "Predicted"
        c[1].metric(f"{bound} step", ui.ms(r.step_s_after), delta, delta_color="inverse")
        c[2].metric(f"{bound} gain", ui.pct(r.gain))
        c[3].metric("Confidence", r.confidence)
        ui.table(["metric", "value", "threshold", "unit", "source"],
                 [[e.metric, f"{e.value:.4g}", f"{e.threshold:.4g}", e.unit, e.source] for e in r.evidence])
        st.code(r.command or r.flag_words or "(no flag: see the checks)", language="bash")
        if not r.runnable:
            st.caption("The instrumented trainer has no such flag: the command is for Megatron-LM.")
        st.caption(ui.md(r.why))
        for a in [*r.assumptions, *r.checks]:
            st.caption(f"• {ui.md(a)}")
if advice and advice.nothing:
    st.success(ui.md(advice.nothing))

st.header("What if")
if isinstance(cal, str) or cal is None:
    st.info(f"The what-if needs the step-time model calibrated on this run: {ui.md(cal)}")
    st.stop()
st.caption("Predictions of diag's step-time model (diag/advise/model.py), calibrated crudely on this run "
           "(diag/advise/calibrate.py): predicted = measured + model(new) - model(measured). "
           f"The model alone says {ui.ms(cal.model_step_s)} for the measured layout, measured "
           f"{ui.ms(cal.measured_step_s)}: read differences, not absolute values.")
base = cal.config
c = st.columns(4)
tp = c[0].number_input("TP", 1, 64, base.tp, key="wi_tp")
pp = c[1].number_input("PP", 1, 64, base.pp, key="wi_pp")
dp = c[2].number_input("DP", 1, 1024, base.dp, key="wi_dp")
# The recommendations keep the global batch; so does the what-if unless told otherwise, so the
# same layout is priced the same here and on its recommendation's card.
keep = st.checkbox("keep the global batch (micro-batches = measured sequences / (micro-batch size × DP))",
                   value=True, key="wi_keep")
sequences = base.num_micro_batches * base.micro_batch_size * base.dp
kept = sequences // (base.micro_batch_size * dp) if sequences % (base.micro_batch_size * dp) == 0 else None
if keep and kept is None:
    st.error(f"{sequences} sequences do not split into micro-batches of {base.micro_batch_size} over DP {dp}.")
    st.stop()
m = kept if keep else c[3].number_input("micro-batches", 1, 1024, base.num_micro_batches, key="wi_m")
if keep:
    c[3].metric("micro-batches", m)
try:
    new = dataclasses.replace(base, tp=int(tp), pp=int(pp), dp=int(dp), num_micro_batches=int(m))
    predicted = cal.predict(new)
except (ValueError, NotImplementedError) as e:
    st.error(f"The model cannot run this layout: {e}")
    st.stop()
r = st.columns(3)
r[0].metric("Measured step", ui.ms(cal.measured_step_s))
change = predicted - cal.measured_step_s
r[1].metric("Predicted step", ui.ms(predicted), f"{change * 1e3:+,.1f} ms" if abs(change) > 5e-5 else None,
            delta_color="inverse")
gpus = tp * pp * dp - base.tp * base.pp * base.dp
r[2].metric("GPUs", f"{tp * pp * dp}", f"{gpus:+d}" if gpus else None)
st.caption(f"global batch = micro-batches × micro-batch size × DP = {m} × {base.micro_batch_size} × {dp} = "
           f"{m * base.micro_batch_size * dp} sequences (measured: "
           f"{base.num_micro_batches * base.micro_batch_size * base.dp})")
with st.expander("What the calibration assumed"):
    for a in cal.assumptions:
        st.caption(f"• {ui.md(a)}")
