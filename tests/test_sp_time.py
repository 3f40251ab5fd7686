"""Sequence parallelism's time, priced on a run that has none, worked by hand.

A TP 2 job synthesised by the step-time model (test_calibrate_host's way): 2 layers, m = 2, each TP
all-reduce 4 MB at 4 GB/s = 1 ms (bus factor 2(n-1)/n = 1 at n = 2), 4 a layer and micro-batch, so
16 a step, all on the critical path. Switched to SP:

- its all-gather and reduce-scatter take the all-reduce's place: the same time on NCCL's ring, 1.5x on
  gloo, whose reduce-scatter runs a whole all-reduce (16 x 0.5 ms = +8 ms);
- the norms' gradients, left partial over TP, are reduced before the optimizer uses them: under torch's
  DTensor each time AdamW reads one (3 times), for each of a layer's 4 LayerNorm parameters, and the
  final norm's 2 on the last stage: (2 x 12 + 6) = 30 calls of the small-call time; Megatron-LM's one
  coalesced call a stage.
"""
from dataclasses import replace

import msgspec
import pytest

from diag.advise import Config, Links, Workload, simulate
from diag.advise.calibrate import calibrate, small_tp_call
from diag.advise.model import sp_costs, stage_costs
from diag.advise.synth import write_job
from diag.analysis import diagnose
from diag.analysis.results import HostOps
from diag.trace import load_job

MS = 1e-3
W = Workload(num_layers=2, fwd_s_per_layer=4 * MS, tp_bytes_per_layer=4e6)
C = Config(tp=2, num_micro_batches=2)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("sp")
    write_job(simulate(W, C, Links(tp=4e9), steps=4), str(out), C, W)
    return str(out)


def diagnosis(job, **facts):
    d = diagnose(load_job(job))
    for r in d.ranks:
        r.host_ops = HostOps(ops_per_step=0, optimizer_ops_per_step=0, aten_ops_per_step=0, aten_op_s=0.0,
                             framework_per_step_s=0.0)
    d.facts = msgspec.structs.replace(d.facts, **facts)
    return d


def sp_change(d) -> float:
    cal = calibrate(d)
    return cal.predict(replace(cal.config, sequence_parallel=True)) - cal.measured_step_s


def note(d) -> str:
    return next(a for a in calibrate(d).assumptions if a.startswith("sequence parallelism, where switched on"))


def test_on_gloo_the_reduce_scatter_is_an_all_reduce_and_each_norm_read_a_call(job):
    d = diagnosis(job, backend="gloo", tp_latency_s=1 * MS)
    assert sp_change(d) == pytest.approx(8 * MS + 30 * MS, rel=1e-3)
    assert "1.5x the all-reduces they replace (gloo's reduce-scatter runs a whole all-reduce)" in note(d)
    assert "12 reductions of the norms' gradients a layer" in note(d)
    assert "1 ms each, from a small TP reduction timed at the run's start" in note(d)


def test_on_nccl_the_same_bytes_move_and_only_the_norms_are_paid(job):
    assert sp_change(diagnosis(job, backend="nccl", tp_latency_s=1 * MS)) == pytest.approx(30 * MS, rel=1e-3)


def test_megatron_reduces_the_norms_in_one_call_a_stage(job):
    d = diagnosis(job, backend="nccl", tp_latency_s=1 * MS, sequence_parallel_kind="megatron")
    assert sp_change(d) == pytest.approx(1 * MS, rel=1e-3)
    assert "Megatron-LM's one coalesced reduction" in note(d)


def test_rmsnorm_models_have_half_the_norm_parameters(job):
    d = diagnosis(job, backend="nccl", tp_latency_s=1 * MS, swiglu=True)
    assert sp_change(d) == pytest.approx(15 * MS, rel=1e-3)      # (2 x 6 + 3) calls


def test_the_runs_own_small_tp_collective_sets_the_call_time(job):
    """A TP all-reduce of 1 KiB in the trace (a vocabulary-parallel loss's), matched at 4.096 MB/s:
    1 KiB x 1 / 4.096e6 = 0.25 ms a call, which the trace measured in training: it wins over the
    start-up timing."""
    d = diagnosis(job, backend="nccl", tp_latency_s=1 * MS)
    tp = next(o for o in d.comm.ops if o.axis == "tp")
    d.comm.ops.append(replace(tp, median_bytes=1024.0, busbw_median_gbps=1024 / 0.25e-3 / 1e9, time_s=0.0,
                              exposed_s=0.0, busbw_basis="transfer", group_size=2))
    secs, source = small_tp_call(d)
    assert secs == pytest.approx(0.25 * MS, rel=1e-6)
    assert source.startswith("the run's TP all_reduce of 1 KiB")
    assert sp_change(d) == pytest.approx(30 * 0.25 * MS, rel=2e-3)


def test_the_optimizers_own_timing_wins_for_torchs_dtensor(job):
    """The trainer times what a partial gradient costs its optimizer (sp_grad_sync_s, every reduction its reads make
    and DTensor's time around each): 3 ms a parameter, 10 norm parameters (4 a layer and the final norm's 2), 30 ms
    a step on NCCL, over both the trace's own small TP call (0.25 ms, the collective alone: said to be a lower
    bound where it is used) and the older start-up timing of one reduction. Megatron-LM's one coalesced call a
    stage is not the optimizer's path: the trace's call prices it."""
    d = diagnosis(job, backend="nccl", tp_latency_s=2 * MS, sp_grad_sync_s=3 * MS)
    tp = next(o for o in d.comm.ops if o.axis == "tp")
    d.comm.ops.append(replace(tp, median_bytes=1024.0, busbw_median_gbps=1024 / 0.25e-3 / 1e9, time_s=0.0,
                              exposed_s=0.0, busbw_basis="transfer", group_size=2))
    assert sp_change(d) == pytest.approx(30 * MS, rel=2e-3)
    assert "4 norm parameters a layer (LayerNorm) whose gradients it leaves partial over TP, each reduced by the " \
        "optimizer as torch's DTensor does, at a cost a parameter, 3 ms each, from the run's optimizer, timed" \
        in note(d)
    d.facts = msgspec.structs.replace(d.facts, sp_grad_sync_s=None)
    assert sp_change(d) == pytest.approx(30 * 0.25 * MS, rel=2e-3)
    assert "the collective alone: DTensor's host time around each read is not in it, so this is a lower bound" \
        in note(d)
    d.facts = msgspec.structs.replace(d.facts, sp_grad_sync_s=3 * MS, sequence_parallel_kind="megatron")
    assert sp_change(d) == pytest.approx(0.25 * MS, rel=2e-3)


def test_an_unknown_call_time_is_said_not_priced(job):
    d = diagnosis(job, backend="gloo")
    assert sp_change(d) == pytest.approx(8 * MS, rel=1e-3)
    assert "not priced: their time is unknown: the run has no TP collective of 64 KiB or less" in note(d)


def test_a_run_that_had_it_or_tp_1_pays_nothing_more():
    had = replace(W, sequence_parallel=True, sp_tp_factor=1.5, sp_sync_call_s=MS, sp_sync_calls_per_layer=12)
    sp = replace(C, sequence_parallel=True)
    assert sp_costs(had, sp, 2, 0) == (1.0, 0.0)
    fresh = replace(had, sequence_parallel=False)
    assert sp_costs(fresh, replace(sp, tp=1), 2, 0) == (1.0, 0.0)
    assert sp_costs(fresh, C, 2, 0) == (1.0, 0.0)                 # not switched on
    assert sp_costs(fresh, sp, 2, 0) == (1.5, pytest.approx(24 * MS))
    links = Links(tp=4e9)
    assert stage_costs(fresh, sp, links).tp_ar_s == pytest.approx(1.5 * stage_costs(fresh, C, links).tp_ar_s)


def test_the_last_stage_alone_pays_the_final_norm():
    w = replace(W, num_layers=4, sp_tp_factor=1.0, sp_sync_call_s=MS, sp_sync_calls_per_layer=12,
                sp_sync_calls_last_stage=6)
    c = Config(tp=2, pp=2, num_micro_batches=2, sequence_parallel=True)
    assert [sp_costs(w, c, 2, s)[1] for s in (0, 1)] == [pytest.approx(24 * MS), pytest.approx(30 * MS)]
    assert stage_costs(w, c, Links(tp=4e9), stage=1).optimizer_s == pytest.approx(30 * MS)
