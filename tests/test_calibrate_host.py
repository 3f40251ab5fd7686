"""Calibration of the host operators' fixed cost and DTensor's dispatch, worked by hand.

A job synthesised by the step-time model (test_recommend's way) gives a diagnosis with known
compute; each rank is then given the HostOps a CPU trace would carry, and calibrate() must take
the fixed part out of what scales with the micro-batch.
"""
from dataclasses import replace

import pytest

from diag.advise import Config, Links, Workload, simulate
from diag.advise.calibrate import calibrate, with_micro_batch
from diag.advise.synth import write_job
from diag.analysis import diagnose
from diag.analysis.results import HostOps
from diag.trace import load_job

MS = 1e-3


def diagnosis(tmp_path, w, c, host: HostOps, links: Links = Links()):
    write_job(simulate(w, c, links, steps=4), str(tmp_path), c, w)
    d = diagnose(load_job(str(tmp_path)))
    for r in d.ranks:
        r.host_ops = host
    return d


def test_fixed_cost_comes_out_of_the_scaled_compute(tmp_path):
    """4 layers, forward 1 ms, m=2 of micro-batch 2: compute 2 x 4 x 3 = 24 ms per step. The trace's
    fixed cost: 1,000 ATen calls x 2 us + 4 ms non-ATen self time = 6 ms per step, 0.75 ms per layer
    and micro-batch; what scales: (24 - 6) / (2 x 4 x 3) = 0.75 ms forward. The model gives back
    2 x 4 x (0.75 x 3 + 0.75) = 24 ms; micro-batch 4, m=1: 4 x (1.5 x 3 + 0.75) = 21 ms."""
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS)
    c = Config(num_micro_batches=2, micro_batch_size=2)
    host = HostOps(ops_per_step=1500, optimizer_ops_per_step=200, aten_ops_per_step=1000, aten_op_s=2e-6,
                   framework_per_step_s=4 * MS)
    cal = calibrate(diagnosis(tmp_path, w, c, host))
    assert cal.workload.host_fixed_s_per_layer == pytest.approx(0.75 * MS, rel=1e-3)
    assert cal.workload.fwd_s_per_layer == pytest.approx(0.75 * MS, rel=1e-3)
    assert cal.workload.dtensor_s_per_layer == 0.0
    assert cal.model_step_s == pytest.approx(24 * MS, rel=1e-3)
    big = replace(c, micro_batch_size=4, num_micro_batches=1)
    assert cal.model(big, with_micro_batch(cal.workload, 2, 4)) == pytest.approx(21 * MS, rel=1e-3)
    assert any("fixed cost 0.75 ms per layer per micro-batch" in a for a in cal.assumptions)


def test_dtensor_dispatch_vanishes_at_tp_one(tmp_path):
    """TP=2, 2 layers, forward 4 ms at TP=1 (2 ms per rank), m=2: compute 2 x 2 x 6 = 24 ms. Fixed
    cost 8 ms per step, of which DTensor's dispatch 6 ms: per layer and micro-batch 0.5 ms host,
    1.5 ms DTensor; scaled forward (24 - 8) x 2 / (2 x 2 x 3) = 2.667 ms at TP=1. At TP=1 (same m,
    free links): 2 x 2 x (2.667 x 3 + 0.5) = 34 ms; at TP=2: 24 ms again."""
    w = Workload(num_layers=2, fwd_s_per_layer=4 * MS)
    c = Config(tp=2, num_micro_batches=2)
    host = HostOps(ops_per_step=1000, optimizer_ops_per_step=0, aten_ops_per_step=500, aten_op_s=2e-6,
                   framework_per_step_s=7 * MS, dtensor_per_step_s=6 * MS)
    cal = calibrate(diagnosis(tmp_path, w, c, host))
    assert cal.workload.host_fixed_s_per_layer == pytest.approx(0.5 * MS, rel=1e-3)
    assert cal.workload.dtensor_s_per_layer == pytest.approx(1.5 * MS, rel=1e-3)
    assert cal.workload.fwd_s_per_layer == pytest.approx(8 / 3 * MS, rel=1e-3)
    assert cal.model_step_s == pytest.approx(24 * MS, rel=1e-3)
    assert cal.model(replace(c, tp=1)) == pytest.approx(34 * MS, rel=1e-3)


def test_no_host_ops_no_fixed_cost(tmp_path):
    """GPU traces carry no HostOps: the calibration is as before (forward 1 ms, nothing fixed)."""
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS)
    c = Config(num_micro_batches=2, micro_batch_size=2)
    write_job(simulate(w, c, Links(), steps=4), str(tmp_path), c, w)
    cal = calibrate(diagnose(load_job(str(tmp_path))))
    assert cal.workload.host_fixed_s_per_layer == 0.0 and cal.workload.dtensor_s_per_layer == 0.0
    assert cal.workload.fwd_s_per_layer == pytest.approx(1 * MS, rel=1e-3)


def test_fixed_cost_trips_the_micro_batch_rule(tmp_path):
    """4 layers, forward 1 ms, m=4 of micro-batch 1: compute 4 x 4 x 3 = 48 ms, of which the trace
    shows 24 ms fixed (half the step): 1.5 ms per layer and micro-batch, forward 0.5 ms. Micro-batch
    2 (m=2): 2 x 4 x (1 x 3 + 1.5) = 36 ms; micro-batch 4 (m=1): 4 x (2 x 3 + 1.5) = 30 ms, the best."""
    from diag.advise.recommend import advise
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS)
    c = Config(num_micro_batches=4, micro_batch_size=1)
    host = HostOps(ops_per_step=100, optimizer_ops_per_step=0, aten_ops_per_step=0, aten_op_s=0.0,
                   framework_per_step_s=24 * MS)
    rec = next(r for r in advise(diagnosis(tmp_path, w, c, host)).recommendations if r.rule == "micro_batch")
    assert rec.flags == {"--micro-batch-size": "4"}
    assert rec.evidence[-1].metric.startswith("host operators' fixed cost")
    assert rec.evidence[-1].value == pytest.approx(0.5, rel=1e-3)
    assert rec.step_s_after == pytest.approx(30 * MS, rel=1e-3)


def test_recompute_pays_the_forward_share_again(tmp_path):
    """Full recompute, 4 layers, forward 1 ms, m=1: compute 4 x (1 + 2 + 1) = 16 ms. The trace's
    fixed cost 4 ms per step is paid by forward, backward and the recomputed forward: per layer
    4 / (4 x (1 + 1/3)) = 0.75 ms; scaled forward (16 - 4) / (4 x 4) = 0.75 ms. The model gives
    back 4 x (0.75 x 4 + 0.75 x 4/3) = 16 ms."""
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, recompute="full")
    c = Config()
    host = HostOps(ops_per_step=100, optimizer_ops_per_step=10, aten_ops_per_step=0, aten_op_s=0.0,
                   framework_per_step_s=4 * MS)
    d = diagnosis(tmp_path, w, c, host)
    d.facts.recompute_granularity = "full"
    cal = calibrate(d)
    assert cal.workload.recompute == "full"
    assert cal.workload.host_fixed_s_per_layer == pytest.approx(0.75 * MS, rel=1e-3)
    assert cal.workload.fwd_s_per_layer == pytest.approx(0.75 * MS, rel=1e-3)
    assert cal.model_step_s == pytest.approx(16 * MS, rel=1e-3)


def fsdp_calibration(tmp_path, zero: int, marks: bool = True):
    """DP 2, 4 layers, forward 1 ms, m=2, 1 MB gathers at 100 GB/s (hidden behind compute): compute
    2 x 4 x 3 = 24 ms per step. With marks, the trace's FSDP2 time is 4 ms per step of its own spans
    and 2 ms of its optimizer's DTensor dispatch; without, unknown (None)."""
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, grad_bytes=8e6)
    c = Config(dp=2, num_micro_batches=2, zero=zero)
    fsdp = dict(fsdp_per_step_s=4 * MS, fsdp_optimizer_dispatch_per_step_s=2 * MS) if marks else {}
    host = HostOps(ops_per_step=100, optimizer_ops_per_step=0, aten_ops_per_step=0, aten_op_s=0.0,
                   framework_per_step_s=0.0, **fsdp)
    return calibrate(diagnosis(tmp_path, w, c, host, Links(dp=100e9)))


def test_fsdp_own_time_comes_out_of_compute_and_goes_with_zero3(tmp_path):
    """ZeRO-3: FSDP2's 4 ms per step are 0.5 ms per layer and micro-batch, its optimizer's 2 ms
    0.5 ms per layer. What scales: (24 - 4 - 2) / (2 x 4 x 3) = 0.75 ms forward. The model pays the
    6 ms under ZeRO-3 and nothing of it replicated, where the same workload without them gives the
    same step."""
    cal = fsdp_calibration(tmp_path, 3)
    assert cal.config.zero == 3
    assert cal.workload.fsdp_s_per_layer == pytest.approx(0.5 * MS, rel=1e-3)
    assert cal.workload.fsdp_optimizer_s_per_layer == pytest.approx(0.5 * MS, rel=1e-3)
    assert cal.workload.fwd_s_per_layer == pytest.approx(0.75 * MS, rel=1e-3)
    plain = replace(cal.workload, fsdp_s_per_layer=0.0, fsdp_optimizer_s_per_layer=0.0)
    assert cal.model(cal.config, cal.workload) - cal.model(cal.config, plain) == pytest.approx(6 * MS, rel=1e-3)
    replicated = replace(cal.config, zero=0)
    assert cal.model(replicated, cal.workload) == pytest.approx(cal.model(replicated, plain), rel=1e-12)
    assert any("FSDP2's own host time 4 ms per step" in a for a in cal.assumptions)


def test_zero3_without_fsdp_marks_says_its_host_time_is_unknown(tmp_path):
    """The same job, its traces without FSDP2's marks: nothing taken out for FSDP (forward 1 ms),
    and the calibration says what it cannot price."""
    cal = fsdp_calibration(tmp_path, 3, marks=False)
    assert cal.workload.fsdp_s_per_layer == 0.0 and cal.workload.fwd_s_per_layer == pytest.approx(1 * MS, rel=1e-3)
    assert any("ZeRO-3's own host time (hooks, copies) unknown" in a for a in cal.assumptions)


def test_fsdp_own_time_is_not_taken_at_zero1(tmp_path):
    """ZeRO-1 (the optimizer states sharded by ZeroRedundancyOptimizer or Megatron's distributed
    optimizer, not FSDP2): FSDP's figures, had a trace any, are not taken out; forward 1 ms."""
    cal = fsdp_calibration(tmp_path, 1)
    assert cal.config.zero == 1 and cal.workload.fsdp_s_per_layer == 0.0
    assert cal.workload.fwd_s_per_layer == pytest.approx(1 * MS, rel=1e-2)


def test_tp_is_priced_as_the_step_pays_it(tmp_path):
    """TP 2, 2 layers, m = 2: the model's 4 x 2 x 2 = 16 TP all-reduces a step. On a synthesised
    job the trace's TP transfers are exactly those, so the TP link as paid is the simulated one and
    the model meets the measured step. Add to the trace a TP collective the model does not count
    (a loss's all-gather, 6 ms of transfer a step, no busbw of its own): the link as paid is slower
    by 6 ms over the 16 calls, the model's step for the measured layout grows by those 6 ms, and at
    TP 1 they are gone with the rest of TP (before: held in the residual, TP 1 kept them). Where the
    TP axis's exposed time is more than its calls' (a host timeline blocked in wait_tensor), that is
    what TP is priced at."""
    from diag.analysis.results import steps_in_window

    w = Workload(num_layers=2, fwd_s_per_layer=4 * MS, tp_bytes_per_layer=4e6)
    c = Config(tp=2, num_micro_batches=2)
    d = diagnosis(tmp_path, w, c, HostOps(ops_per_step=0, optimizer_ops_per_step=0, aten_ops_per_step=0,
                                               aten_op_s=0.0, framework_per_step_s=0.0), Links(tp=4e9))
    base = calibrate(d)
    tp_ops = [o for o in d.comm.ops if o.axis == "tp"]
    per_step = sum(o.time_s for o in tp_ops) / steps_in_window(d.ranks)
    assert per_step == pytest.approx(16 * 1 * MS, rel=1e-3)              # 16 x 4 MB x 1 / 4 GB/s
    assert base.model_step_s == pytest.approx(base.measured_step_s, rel=1e-3)
    steps = steps_in_window(d.ranks)
    d.comm.ops.append(replace(tp_ops[0], op="all_gather", time_s=6 * MS * steps, busbw_median_gbps=None,
                              busbw_p95_gbps=None, busbw_basis="transfer"))
    paid = calibrate(d)
    assert paid.links.tp == pytest.approx(base.links.tp * 16 / 22, rel=1e-3)
    assert paid.model_step_s - base.model_step_s == pytest.approx(6 * MS, rel=1e-3)
    assert any(a.startswith("TP as the step pays it: 22 ms per step") for a in paid.assumptions)
    tp1 = replace(c, tp=1, dp=2)
    assert base.predict(tp1) - paid.predict(tp1) == pytest.approx(6 * MS, rel=1e-3)
    # A host timeline's issuing thread blocked on the TP calls beyond their own time (wait_tensor on
    # an async functional collective): the TP axis's exposed time, 30 ms a step, is what TP costs
    (axis,) = [a for a in d.comm.axes if a.axis == "tp"]
    assert axis.exposed_per_step_s == pytest.approx(16 * MS, rel=1e-3)
    axis.exposed_per_step_s = 30 * MS
    exposed = calibrate(d)
    assert exposed.links.tp == pytest.approx(base.links.tp * 16 / 30, rel=1e-3)
    assert exposed.model_step_s - base.model_step_s == pytest.approx(14 * MS, rel=1e-3)
    assert any(a.startswith("TP as the step pays it: 30 ms per step of exposed TP communication (the TP calls' "
                            "own time 22 ms") for a in exposed.assumptions), exposed.assumptions
    assert base.predict(tp1) - exposed.predict(tp1) == pytest.approx(14 * MS, rel=1e-3)


def test_the_trainers_comm_tap_in_the_profiled_steps_only_is_left_out(tmp_path):
    """The diag trainer's comm tap (a Python dispatch mode) ran only in the profiled steps when its
    diag_run.json says `profile.comm_tap: profiled_steps`: the steps measured and predicted do not
    pay it. 4 layers, forward 1 ms, m=2 of micro-batch 2: compute 24 ms per step, of which the
    trace's fixed cost 6 ms (1,000 ATen calls x 2 us + 4 ms non-ATen), the tap 2 ms of the non-ATen.
    Left out: step and compute 2 ms less, fixed 4 ms (0.5 ms per layer and micro-batch), scaled
    forward (22 - 4) / 24 = 0.75 ms. Said nothing (or "every_step"): as the trace shows it."""
    from diag.runmeta import Profile

    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS)
    c = Config(num_micro_batches=2, micro_batch_size=2)
    host = HostOps(ops_per_step=1500, optimizer_ops_per_step=200, aten_ops_per_step=1000, aten_op_s=2e-6,
                   framework_per_step_s=4 * MS, dispatch_mode_per_step_s=2 * MS)
    d = diagnosis(tmp_path, w, c, host)
    traced = d.throughput.step_time_s
    as_shown = calibrate(d)
    assert as_shown.workload.host_fixed_s_per_layer == pytest.approx(0.75 * MS, rel=1e-3)
    assert as_shown.measured_step_s == pytest.approx(traced)
    d.facts.profile = Profile(enabled=True, wait=1, warmup=1, active=2, comm_tap="every_step")
    assert calibrate(d).workload.host_fixed_s_per_layer == pytest.approx(0.75 * MS, rel=1e-3)
    d.facts.profile = Profile(enabled=True, wait=1, warmup=1, active=2, comm_tap="profiled_steps")
    cal = calibrate(d)
    assert cal.measured_step_s == pytest.approx(traced - 2 * MS)
    assert cal.workload.host_fixed_s_per_layer == pytest.approx(0.5 * MS, rel=1e-3)
    assert cal.workload.fwd_s_per_layer == pytest.approx(0.75 * MS, rel=1e-3)
    assert cal.model_step_s == pytest.approx(22 * MS, rel=1e-3)
    assert any("comm tap 2 ms per step" in a for a in cal.assumptions)


@pytest.mark.parametrize("idle_ms, untraced_ms, k_us, fwd_ms, gaps_ms, model_ms", [
    (0, 20, 4 / 1.5, 14 / 24, 0, 20), (0, 16, 8 / 1.5, 10 / 24, 0, 16), (8, 22, 2 / 1.5, 18 / 24, 2, 30),
    (8, 14, 10 / 1.5, 16 / 24, 8, 22), (0, 24, 0.0, 18 / 24, 0, 24), (0, 30, 0.0, 18 / 24, 0, 24)])
def test_the_profilers_own_cost_is_fitted_to_the_untraced_steps(tmp_path, idle_ms, untraced_ms, k_us, fwd_ms,
                                                                 gaps_ms, model_ms):
    """diag_run.json's profile.untraced_step_s: the run's untraced steps' median. The profiler's cost
    per recorded operator k is what the traced step takes over it, out of the model: from the gaps
    between operators first (the launch overhead per kernel), then from the compute that scales; the
    operators' fixed cost is kept, and so is the model's residual against the traced step. 4 layers,
    forward 1 ms, m=2: compute 24 ms per step, the traced step 24 ms, fixed 6 ms (0.75 ms per layer
    per micro-batch), scaled 18 ms (forward 0.75 ms), 1,500 operators a step.
    Untraced 20 ms, no gaps: 4 ms from the compute, forward 14 / 24 ms (2 x 4 x (3 x 14/24 + 0.75) = 20).
    Untraced 16 ms: 8 ms, forward 10 / 24 ms. With 8 ms of gaps a step (launch 0.25 ms over 32 kernels:
    the model of the measured configuration 32 ms, 8 over the traced step, held) and untraced 22 ms:
    2 ms, from the gaps (the model 30 ms); untraced 14 ms: 10 ms, all 8 of the gaps and 2 of compute
    (the model 22 ms). Untraced 24 or 30 ms (no shorter than the traced step): nothing is taken out."""
    from diag.runmeta import Profile

    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS)
    c = Config(num_micro_batches=2, micro_batch_size=2)
    host = HostOps(ops_per_step=1500, optimizer_ops_per_step=200, aten_ops_per_step=1000, aten_op_s=2e-6,
                   framework_per_step_s=4 * MS)
    d = diagnosis(tmp_path, w, c, host)
    assert d.throughput.step_time_s == pytest.approx(24 * MS, rel=1e-3)
    for r in d.ranks:
        r.breakdown.idle_s = idle_ms * MS * r.window_steps
    d.facts.profile = Profile(enabled=True, wait=1, warmup=1, active=2, untraced_step_s=untraced_ms * MS)
    cal = calibrate(d)
    assert cal.workload.host_fixed_s_per_layer == pytest.approx(0.75 * MS, rel=1e-3)
    assert cal.workload.fwd_s_per_layer == pytest.approx(fwd_ms * MS, rel=1e-3)
    assert cal.model_step_s == pytest.approx(model_ms * MS, rel=1e-5)
    fitted = [a for a in cal.assumptions if a.startswith("torch.profiler's own cost")]
    if k_us:
        assert cal.workload.launch_overhead_s == pytest.approx((idle_ms - gaps_ms) * MS / 32, abs=1e-9)
        assert cal.measured_step_s == pytest.approx(untraced_ms * MS)
        (note,) = fitted
        assert f"{k_us:.3g} us per recorded host operator" in note, note
        assert f"{gaps_ms:.3g} ms from the gaps between operators" in note, note
    else:
        assert not fitted and cal.measured_step_s == pytest.approx(24 * MS, rel=1e-3)


def test_the_model_is_fitted_to_the_window_steps_not_the_last_one(tmp_path):
    """The last ProfilerStep is out of the analysed window (HTA's convention), and on the trainer's CPU
    runs it is the long one (the profiler stops in it): the calibration's measured step is the mean
    of the window's steps, whose compute and idle the model holds, so a last step 12 ms longer moves
    the run's step time (the median of every step) but not the model's fit or its measured step."""
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS)
    c = Config(num_micro_batches=2, micro_batch_size=2)
    host = HostOps(ops_per_step=1500, optimizer_ops_per_step=200, aten_ops_per_step=1000, aten_op_s=2e-6,
                   framework_per_step_s=4 * MS)
    d = diagnosis(tmp_path, w, c, host)
    for r in d.ranks:
        assert r.steps[-1].in_window is False and r.window_steps == len(r.steps) - 1
        r.steps[-1] = replace(r.steps[-1], host_s=r.steps[-1].host_s + 12 * MS)
    d.throughput = replace(d.throughput, step_time_s=30 * MS)      # what a longer last step does to it
    cal = calibrate(d)
    assert cal.measured_step_s == pytest.approx(24 * MS, rel=1e-3)
    assert cal.model_step_s == pytest.approx(24 * MS, rel=1e-3) and cal.fit_error < 1e-3


def zero3_on_host(tmp_path, dp_exposed: float = 0.0, **host):
    """DP 2, ZeRO-3, 4 layers, forward 1 ms, m=2, 8 MB of fp32 parameters (2 MB a layer), DP link
    100 GB/s: the trace's compute 24 ms per step. Its ranks taken as a host timeline (ZeRO-3's
    collectives hold the thread: each one on the step's path) with FSDP2's marks (4 ms a step of its
    own time, `host` over it), and the DP axis exposed `dp_exposed` s per step where given."""
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, grad_bytes=8e6)
    c = Config(dp=2, num_micro_batches=2, zero=3)
    d = diagnosis(tmp_path, w, c, HostOps(**{**dict(ops_per_step=100, optimizer_ops_per_step=0, aten_ops_per_step=0,
                                                     aten_op_s=0.0, framework_per_step_s=0.0, fsdp_per_step_s=4 * MS,
                                                     fsdp_optimizer_dispatch_per_step_s=0.0), **host}), Links(dp=100e9))
    for r in d.ranks:
        r.timeline = "host"
    if dp_exposed:
        (axis,) = [a for a in d.comm.axes if a.axis == "dp"]
        axis.exposed_per_step_s = dp_exposed
    return d


def test_zero3s_collectives_are_priced_as_the_step_pays_them(tmp_path):
    """The model's ZeRO-3 collectives a step: per micro-batch and layer an all-gather before the
    forward, one before the backward and a reduce-scatter after it, 2 x 4 x 3 = 24 calls of 2 MB x
    (2-1)/2 / 100 GB/s = 10 us: 0.24 ms. The DP axis's exposed time (the thread held in the calls and
    in its waits for them), 24.24 ms a step: the 24 ms more are 1 ms a call, the DP link's latency per
    message. The model's step for the measured layout grows by those 24 ms; replicated, its one
    gradient bucket (8 MB under ddp_bucket_size x 4 B) pays 1 ms of it: dropping ZeRO-3 is predicted
    24 - 1 = 23 ms faster than on the transfer alone (the model's change: the synthesised trace's
    step does not hold those 24 ms, so its prediction would be clamped). Where the DP axis was exposed
    no longer than the model's transfer, nothing changes; nor on a GPU timeline, where the gathers do
    not hold the thread."""
    plain = calibrate(zero3_on_host(tmp_path / "plain", 0.2 * MS))
    paid = calibrate(zero3_on_host(tmp_path / "paid", 24.24 * MS))
    assert plain.links.dp_latency_s == 0.0 and plain.links.dp == pytest.approx(100e9, rel=1e-6)
    assert paid.links.dp_latency_s == pytest.approx(1 * MS, rel=1e-6)
    assert paid.model_step_s - plain.model_step_s == pytest.approx(24 * MS, rel=1e-6)
    replicated = replace(plain.config, zero=0)
    change = {k: cal.model(replicated) - cal.model_step_s for k, cal in (("plain", plain), ("paid", paid))}
    assert change["plain"] - change["paid"] == pytest.approx(23 * MS, rel=1e-6)
    assert any(a.startswith("ZeRO's collectives as the step pays them: 24.2 ms per step of exposed DP communication")
               and "the model's 24 DP collectives 0.24 ms" in a and "1 ms a call" in a for a in paid.assumptions)
    gpu = zero3_on_host(tmp_path / "gpu", 24.24 * MS)
    for r in gpu.ranks:
        r.timeline = "gpu"
    assert calibrate(gpu).links.dp_latency_s == 0.0


def test_the_comm_tap_inside_fsdps_spans_is_left_out_of_its_time_and_its_collectives(tmp_path):
    """The trainer's comm tap ran only in the profiled steps (diag_run.json): of FSDP2's 4 ms own
    time 1 ms was the tap's, and of the DP axis's 24.24 ms exposed a step 2.4 ms (the tap's call
    around each collective, inside the dispatcher's call of it). Left out: FSDP's own time 3 ms a step
    (0.375 ms per layer and micro-batch), the compute 1 ms (the 2.4 ms were not in it: communication),
    the measured step 3.4 ms, and the collectives as paid 21.84 ms: (21.84 - 0.24) / 24 = 0.9 ms a
    call. Scaled forward (24 - 1 - 3) / 24 = 0.833 ms, as without the tap."""
    from diag.runmeta import Profile

    d = zero3_on_host(tmp_path, 24.24 * MS, fsdp_dispatch_mode_per_step_s=1 * MS,
                      fsdp_comm_dispatch_mode_per_step_s=2.4 * MS)
    shown = calibrate(d)
    d.facts.profile = Profile(enabled=True, wait=1, warmup=1, active=2, comm_tap="profiled_steps")
    cal = calibrate(d)
    assert shown.workload.fsdp_s_per_layer == pytest.approx(0.5 * MS, rel=1e-6)
    assert shown.links.dp_latency_s == pytest.approx(1 * MS, rel=1e-6)
    assert cal.workload.fsdp_s_per_layer == pytest.approx(0.375 * MS, rel=1e-6)
    assert cal.measured_step_s == pytest.approx(shown.measured_step_s - 3.4 * MS, rel=1e-6)
    assert cal.links.dp_latency_s == pytest.approx(0.9 * MS, rel=1e-6)
    assert cal.workload.fwd_s_per_layer == pytest.approx(20 / 24 * MS, rel=1e-3)
    assert shown.workload.fwd_s_per_layer == pytest.approx(20 / 24 * MS, rel=1e-3)
    assert any("comm tap 3.4 ms per step" in a and "3.4 ms of it inside FSDP2 spans" in a for a in cal.assumptions)
