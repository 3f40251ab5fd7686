"""The optimizer held apart from the pipeline's passes in the calibration, worked by hand.

The optimizer runs once a step, after the pipeline's flush. Folded into the layers' compute (as
the calibration did before), it lengthens every forward and backward, and so the bubble that
interleaving, the zero-bubble schedule or more micro-batches remove: their gain was overpriced.
A job synthesised by the step-time model, its optimizer kernels launched inside torch.optim's
`Optimizer.step` span as torch does, must give the optimizer back as Workload.optimizer_s and the
passes' compute as it was.
"""
import gzip
import json
import os
from dataclasses import replace

import pytest

from diag.advise import Config, Links, Workload, simulate
from diag.advise.calibrate import calibrate
from diag.advise.synth import KERNELS, write_job
from diag.analysis import diagnose
from diag.analysis.results import HostOps
from diag.trace import load_job

MS = 1e-3


def optimizer_spans(out_dir: str) -> None:
    """Wrap each optimizer kernel's launch in an `Optimizer.step#AdamW.step` span, as torch.optim's
    profiler hook does around its step."""
    for name in os.listdir(out_dir):
        if not name.endswith(".pt.trace.json.gz"):
            continue
        path = os.path.join(out_dir, name)
        with gzip.open(path) as f:
            doc = json.load(f)
        ev = doc["traceEvents"]
        corr = {e["args"]["correlation"] for e in ev if e["name"] == KERNELS["optimizer"]}
        for e in [e for e in ev if e["name"] == "cudaLaunchKernel" and e["args"]["correlation"] in corr]:
            ev.append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "pid": e["pid"],
                       "tid": e["tid"], "ts": e["ts"] - 0.5, "dur": e["dur"] + 1.0, "args": {}})
        with gzip.open(path, "wt") as f:
            json.dump(doc, f)


def diagnosis(tmp_path, w: Workload, c: Config, spans: bool = True):
    write_job(simulate(w, c, Links(), steps=4), str(tmp_path), c, w)
    if spans:
        optimizer_spans(str(tmp_path))
    return diagnose(load_job(str(tmp_path)))


# 4 layers on 2 stages, forward 1 ms a layer (backward 2 ms), m = 2, the optimizer 2 ms a stage (4 ms
# at PP 1), free links. 1F1B, by hand: stage 0 runs F0 F1 [0, 4], waits for B0 (stage 1: F0 [2, 4],
# B0 [4, 8]), B0 [8, 12], waits for B1 (stage 1: F1 [8, 10], B1 [10, 14]), B1 [14, 18], the
# optimizer [18, 20]: 20 ms a step. Interleaved, 2 chunks of 1 layer (f 1, b 2 ms): rank 0 runs
# F0.0 [0, 1], F1.0 [1, 2], F0.1 [2, 3] (rank 1's F0.0 [1, 2]), F1.1 [3, 4], B0.1 [6, 8] (rank 1: F0.1
# [3, 4], B0.1 [4, 6]), B1.1 [9, 11] (rank 1: F1.1 [6, 7], B1.1 [7, 9]), B0.0 [11, 13] (rank 1 [9, 11]),
# B1.0 [13, 15] (rank 1 [11, 13]), the optimizer [15, 17]: 17 ms.
# Folded, the compute per stage (2 x (2 + 4) + 2 = 14 ms) reads as a forward of 14 / 12 ms a layer: the
# model of the run 3 x 7 = 21 ms, of the interleaved schedule 15 x 7 / 6 = 17.5 ms, so the prediction
# 20 + 17.5 - 21 = 16.5 ms where it is 17.
PP2 = Config(pp=2, num_micro_batches=2)
W = Workload(num_layers=4, fwd_s_per_layer=1 * MS, optimizer_s=4 * MS)
INTERLEAVED = replace(PP2, schedule="interleaved", virtual_stages=2)


def test_the_hand_worked_steps():
    assert simulate(W, PP2, Links(), steps=2).step_time_s == pytest.approx(20 * MS)
    assert simulate(W, INTERLEAVED, Links(), steps=2).step_time_s == pytest.approx(17 * MS)


def test_the_optimizer_is_held_apart_from_the_passes(tmp_path):
    cal = calibrate(diagnosis(tmp_path, W, PP2))
    assert cal.workload.optimizer_s == pytest.approx(4 * MS, rel=1e-3)
    assert cal.workload.fwd_s_per_layer == pytest.approx(1 * MS, rel=1e-3)
    assert cal.measured_step_s == pytest.approx(20 * MS, rel=1e-3)
    assert cal.model_step_s == pytest.approx(20 * MS, rel=1e-3)
    assert cal.predict(INTERLEAVED) == pytest.approx(17 * MS, rel=1e-3)
    assert any("less the optimizer's 2 ms (once a step" in a for a in cal.assumptions), cal.assumptions


def test_without_optimizer_spans_it_stays_folded(tmp_path):
    """No `Optimizer.step` span (another framework's optimizer): as before, and said."""
    cal = calibrate(diagnosis(tmp_path, W, PP2, spans=False))
    assert cal.workload.optimizer_s == 0.0
    assert cal.workload.fwd_s_per_layer == pytest.approx(14 / 12 * MS, rel=1e-3)
    assert cal.model_step_s == pytest.approx(21 * MS, rel=1e-3)
    assert cal.predict(INTERLEAVED) == pytest.approx(16.5 * MS, rel=1e-3)
    assert any("no torch.optim `Optimizer.step` compute" in a for a in cal.assumptions)


def test_the_profilers_cost_on_the_optimizers_operators_comes_out_of_it(tmp_path):
    """The 1F1B job above, its traced step 20 ms, 1,500 recorded operators a step per stage of which 500
    in the optimizer, no gaps, no fixed cost; the untraced steps 16 ms. The profiler's cost k x 1,500 a
    stage comes out of the optimizer by its operators' share (500 k) and out of the passes' compute (1,000 k,
    of 12 ms): forward (12 - 1,000 k) / 12 a layer, the step 18 x (12 - 1,000 k) / 12 + 2 - 500 k =
    20 - 2,000 k = 16 ms, so k = 2 us: 1 ms from the optimizer (optimizer_s 2 ms), forward 10 / 12 ms."""
    from diag.runmeta import Profile

    d = diagnosis(tmp_path, W, PP2)
    for r in d.ranks:
        r.host_ops = HostOps(ops_per_step=1500, optimizer_ops_per_step=500, aten_ops_per_step=0, aten_op_s=0.0,
                             framework_per_step_s=0.0)
    d.facts.profile = Profile(enabled=True, wait=1, warmup=1, active=2, untraced_step_s=16 * MS)
    cal = calibrate(d)
    assert cal.workload.optimizer_s == pytest.approx(2 * MS, rel=1e-3)
    assert cal.workload.fwd_s_per_layer == pytest.approx(10 / 12 * MS, rel=1e-3)
    assert cal.model_step_s == pytest.approx(16 * MS, rel=1e-5) and cal.measured_step_s == pytest.approx(16 * MS)
    (note,) = [a for a in cal.assumptions if a.startswith("torch.profiler's own cost")]
    assert "2 us per recorded host operator" in note and "1 ms from the optimizer" in note, note


def test_an_optimizer_over_dtensors_stays_folded(tmp_path):
    """TP 2 with DTensor's dispatch in the trace: the optimizer steps DTensors, whose dispatch per
    parameter sets its time, not the shard's size (tp_layout's job: 20 ms at TP 2, 10 ms at TP 1 for
    twice the elements), so optimizer_s / tp would misprice TP 1: it stays in the layers' compute."""
    d = diagnosis(tmp_path, W, replace(PP2, tp=2))
    for r in d.ranks:
        r.host_ops = HostOps(ops_per_step=1000, optimizer_ops_per_step=0, aten_ops_per_step=500, aten_op_s=2e-6,
                             framework_per_step_s=2 * MS, dtensor_per_step_s=1 * MS)
    cal = calibrate(d)
    assert cal.workload.optimizer_s == 0.0
    assert any("the optimizer stays in the layers' compute: it steps DTensors" in a for a in cal.assumptions)


def test_at_pp_one_it_stays_folded(tmp_path):
    """No pipeline, no bubble to distort: the optimizer stays in the layers' compute, as before (forward
    (2 x 4 x 3 + 4) / 24 ms a layer for m = 2)."""
    cal = calibrate(diagnosis(tmp_path, W, Config(num_micro_batches=2)))
    assert cal.workload.optimizer_s == 0.0
    assert cal.workload.fwd_s_per_layer == pytest.approx(28 / 24 * MS, rel=1e-3)
