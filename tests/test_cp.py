"""Context parallelism (CP) in the step-time model, its calibration and the cp_down lever.

The model (docs/model.md, "Context parallelism"): with CP c each rank computes 1/c of every
layer; each layer all-gathers K and V of the whole sequence over the CP group before its
attention in forward, again in backward (and in a recomputed forward), and passes its shard of
dK, dV (in fp32) c times round the ring after the attention's backward: torch's all-gather rotate
method and its backward, exposed on the main stream. Each all-gather of S bytes, or all-to-all of
a rank's S bytes, over c ranks takes S (c-1)/c / busbw (nccl-tests). Gradients are reduced over
dp x cp ranks. The numbers below are worked by hand from those formulas.
"""
import dataclasses
import math

import msgspec
import pytest

from diag.advise import Config, Links, Workload, simulate, step_time
from diag.advise.calibrate import CalibrationError, calibrate, two_replicas
from diag.advise.model import MAX_SIM_UNITS, ModelTooBig, sim_units, stage_costs
from diag.advise.recommend import advise
from diag.advise.synth import write_job
from diag.analysis import diagnose
from diag.trace import load_job

MS = 1e-3
GiB = float(1 << 30)


def test_cp_splits_compute_and_pays_its_exchanges():
    """One layer, f = 3 ms forward, backward 2f, one micro-batch. CP 1: 3 + 6 = 9 ms.
    CP 2: (3 + 6) / 2 = 4.5 ms of compute; K, V of S = 1e9 B at 100 GB/s over 2 ranks take
    1e9 x (1/2) / 100e9 = 5 ms an all-gather: one in forward, one in backward. dK, dV in fp32 are
    2e9 B, a rank's shard 1e9 B, permuted twice (c = 2 ring steps), 1e9 x (1/2) / 100e9 = 5 ms
    each: 4.5 + 2 x 5 + 2 x 5 = 24.5 ms."""
    w = Workload(num_layers=1, fwd_s_per_layer=3 * MS, cp_bytes_per_layer=1e9)
    links = Links(cp=100e9)
    assert step_time(w, Config(), links) == pytest.approx(9 * MS, rel=1e-12)
    assert step_time(w, Config(cp=2), links) == pytest.approx(24.5 * MS, rel=1e-12)
    ops = simulate(w, Config(cp=2), links).ranks[0]
    cp = [(n, o, b) for n, a, o, b in zip(ops.name, ops.axis, ops.op, ops.nbytes) if a == "cp"]
    assert cp == [("cp_kv_all_gather", "all_gather", int(1e9))] * 2 + [("cp_dkv_permute", "all_to_all", int(1e9))] * 2
    # dK and dV given in 16-bit (convert_to_f32 off): a rank's shard is 0.5e9 B, 2.5 ms a permute
    half = dataclasses.replace(w, cp_grad_bytes_per_layer=1e9)
    assert step_time(half, Config(cp=2), links) == pytest.approx(19.5 * MS, rel=1e-12)


def test_gradients_are_reduced_over_dp_times_cp():
    """The same layer with G = 4e9 B of gradients at 100 GB/s, no overlap. DP 2 alone: all-reduce over 2,
    4e9 x 2(1/2) / 100e9 = 40 ms, step 9 + 40 = 49 ms. CP 2 x DP 2: over 4 ranks, 4e9 x 2(3/4) / 100e9 =
    60 ms, step 24.5 + 60 = 84.5 ms. CP 2 alone still all-reduces over its 2 ranks: 24.5 + 40 = 64.5 ms."""
    w = Workload(num_layers=1, fwd_s_per_layer=3 * MS, cp_bytes_per_layer=1e9, grad_bytes=4e9)
    links = Links(cp=100e9, dp=100e9)
    assert step_time(w, Config(dp=2), links) == pytest.approx(49 * MS, rel=1e-12)
    assert step_time(w, Config(cp=2, dp=2), links) == pytest.approx(84.5 * MS, rel=1e-12)
    assert step_time(w, Config(cp=2), links) == pytest.approx(64.5 * MS, rel=1e-12)


def test_full_recompute_gathers_k_and_v_once_more():
    """CP 2, full recompute: 4.5 ms + the recomputed forward 1.5 ms + three 5 ms all-gathers + two 5 ms
    permutes = 31 ms."""
    w = Workload(num_layers=1, fwd_s_per_layer=3 * MS, cp_bytes_per_layer=1e9, recompute="full")
    assert step_time(w, Config(cp=2), Links(cp=100e9)) == pytest.approx(31 * MS, rel=1e-12)


def test_cp_shares_the_sequence_with_tp_and_the_pipeline():
    """Per rank, TP 2 x CP 4: K and V are split by TP (S / 2), activations by CP (TP all-reduce and
    pipeline messages / 4); the gradient reduction spans dp x cp = 8 ranks."""
    w = Workload(num_layers=4, fwd_s_per_layer=8 * MS, tp_bytes_per_layer=8e6, p2p_bytes=4e6,
                 cp_bytes_per_layer=16e6, grad_bytes=8e8)
    c = Config(tp=2, cp=4, dp=2, pp=2)
    s = stage_costs(w, c, Links(tp=100e9, cp=50e9, dp=10e9, pp=20e9))
    assert (s.cp, s.cp_bytes, s.tp_bytes, s.p2p_bytes) == (4, 8_000_000, 2_000_000, 1_000_000)
    assert s.cp_s == pytest.approx(8e6 * 3 / 4 / 50e9)
    assert s.cp_dkv_bytes == 2 * 16_000_000 // (2 * 4)           # fp32 dK, dV / TP, a rank's shard / CP
    assert s.cp_dkv_s == pytest.approx(4e6 * 3 / 4 / 50e9)
    assert s.fwd_half_s == pytest.approx(8 * MS / 8 / 2)
    assert s.buckets[-1][2] == pytest.approx(s.buckets[-1][1] * 2 * 7 / 8 / 10e9)


def test_defaults_are_without_cp():
    """Config(), Links() and Workload() as before: no CP, and K/V bytes or a CP link change nothing at cp 1."""
    assert Config().cp == 1 and Config().grid == Config(cp=1).grid and Config().grid.axes == ("pp", "dp", "tp")
    assert Links().cp == math.inf and Workload(num_layers=1, fwd_s_per_layer=1.0).cp_bytes_per_layer == 0.0
    base = Workload(num_layers=4, fwd_s_per_layer=1 * MS, tp_bytes_per_layer=4e6, p2p_bytes=2e6, grad_bytes=4e8)
    c, links = Config(tp=2, pp=2, dp=2, num_micro_batches=4), Links(tp=100e9, pp=25e9, dp=12e9)
    with_kv = dataclasses.replace(base, cp_bytes_per_layer=1e9)
    assert step_time(with_kv, c, dataclasses.replace(links, cp=1e9)) == step_time(base, c, links)
    assert "cp" not in simulate(with_kv, c, links).ranks[0].axis
    with pytest.raises(ValueError):
        Config(cp=0)
    with pytest.raises(ValueError):
        Links(cp=0.0)


@pytest.mark.parametrize("kw", [dict(tp=2, pp=2, dp=2, cp=2, num_micro_batches=4),
                                dict(pp=2, cp=4, num_micro_batches=2, schedule="zb1p", overlap_grad_reduce=True),
                                dict(pp=2, dp=2, cp=2, num_micro_batches=4, schedule="interleaved", virtual_stages=2),
                                dict(cp=2, dp=2, num_micro_batches=2, zero=3),
                                dict(cp=2, dp=2, num_micro_batches=2, zero=1)])
def test_one_rank_stands_for_its_cp_group(kw):
    """The members of a CP group run the same program and arrive together: folding them (and TP)
    gives the full simulation's step and bubble, with the exchanges and reductions lasting the same."""
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, tp_bytes_per_layer=4e6, p2p_bytes=2e6, grad_bytes=4e8,
                 optimizer_s=2 * MS, cp_bytes_per_layer=8e6, recompute="full")
    links = Links(tp=100e9, pp=25e9, dp=12e9, cp=50e9, latency_s=3e-6)
    c = Config(**kw, bucket_bytes=5e7)
    full = simulate(w, c, links, steps=2)
    folded = simulate(w, c, links, steps=2, fold_tp=True)
    assert len(folded.ranks) * c.tp * c.cp == len(full.ranks)
    assert folded.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
    assert folded.stage_bubble() == pytest.approx(full.stage_bubble(), rel=1e-12)
    for axis in ("cp", "dp"):
        assert sum(d for d, a in zip(folded.ranks[0].dur_s, folded.ranks[0].axis) if a == axis) == pytest.approx(
            sum(d for d, a in zip(full.ranks[0].dur_s, full.ranks[0].axis) if a == axis), rel=1e-12)


def test_two_replicas_stand_for_many_with_cp():
    """DP 4 x CP 2 simulated as DP 2 x CP 2: the DP link slowed by f(8) / f(4), so the gradient
    all-reduce over 4 lasts what it lasts over 8."""
    w = Workload(num_layers=2, fwd_s_per_layer=1 * MS, grad_bytes=4e8, cp_bytes_per_layer=4e6)
    c, links = Config(dp=4, cp=2, num_micro_batches=2), Links(dp=10e9, cp=50e9)
    assert step_time(w, *two_replicas(c, links)) == pytest.approx(step_time(w, c, links), rel=1e-12)


def test_simulation_size_counts_cp_ranks_and_ring_steps():
    """Units: ranks x (steps + 1 warm-up) x micro-batches x layers per stage x (1 + cp/4): each layer's
    backward holds cp permutes. CP 8 x DP 4 (32 ranks), 1 step, 4 micro-batches, 8 layers: 32 x 2 x 4 x 8
    x 3. A claimed CP 1024 is past the limit even folded to one rank per CP group (8 ranks): its
    ring steps alone would be 3 million events (2.5 GB), so it is not simulated."""
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS, cp_bytes_per_layer=1e6)
    c = Config(cp=8, dp=4, num_micro_batches=4)
    assert sim_units(w, c, 1) == 32 * 2 * 4 * 8 * 3
    big = Config(cp=1024, dp=8, num_micro_batches=16)
    assert sim_units(w, big, 2) > MAX_SIM_UNITS and sim_units(w, big, 2, ranks=8) > MAX_SIM_UNITS
    with pytest.raises(ModelTooBig, match="x 257 for CP 1024 ring steps"):
        simulate(w, big, Links(cp=1e9), steps=2)
    with pytest.raises(ModelTooBig):
        step_time(w, big, Links(cp=1e9))
    mid = Config(cp=64, dp=8, num_micro_batches=16)     # folded: 8 x 3 x 16 x 8 x 17 = 52,224 units
    assert sim_units(w, mid, 2, ranks=8) < MAX_SIM_UNITS < sim_units(w, mid, 2)
    step_time(w, mid, Links(cp=1e9))


# -- a synthesised CP job, analysed and recommended on ------------------------------------------

KV = 2 * 1 * 2048 * 4096 * 2     # K and V of synth's Shape (seq 2048, hidden 4096, bf16), one sequence
W = Workload(num_layers=4, fwd_s_per_layer=2 * MS, cp_bytes_per_layer=KV, grad_bytes=4e8,
             tp_bytes_per_layer=2048 * 4096 * 2, p2p_bytes=2048 * 4096 * 2)
C = Config(cp=2, dp=2, num_micro_batches=2, bucket_bytes=1e9)
LINKS = Links(cp=20e9, dp=50e9)


@pytest.fixture(scope="module")
def cp_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp2dp2")
    write_job(simulate(W, C, LINKS, steps=4), str(out), C, W)
    return diagnose(load_job(str(out)))


def test_cp_job_is_analysed_and_calibrated_back(cp_job):
    """CP 2 x DP 2, 4 layers, 2 micro-batches, f = 2 ms: compute 2 x 4 x (1 + 2) = 24 ms per rank; each
    all-gather KV (1/2) / 20 GB/s = 0.8389 ms, and each permute of a rank's fp32 dK, dV shard (2 KV / 2 =
    KV bytes) as long: four per layer per micro-batch, 32 x 0.8389 = 26.84 ms, exposed; gradients
    4e8 x 2(3/4) / 50 GB/s = 12 ms over the 4 ranks of DP x CP: 62.84 ms."""
    d = cp_job
    assert (d.facts.cp, d.facts.dp, d.facts.tp) == (2, 2, 1)
    exchange = KV * 0.5 / 20e9
    assert d.throughput.step_time_s == pytest.approx(24 * MS + 32 * exchange + 12 * MS, rel=1e-4)
    cp = next(a for a in d.comm.axes if a.axis == "cp")
    assert cp.exposed_per_step_s == pytest.approx(32 * exchange, rel=1e-3)
    assert {o.op for o in d.comm.ops if o.axis == "cp"} == {"all_gather", "all_to_all"}
    assert next(a for a in d.comm.axes if a.axis == "dp_cp").exposed_per_step_s == pytest.approx(12 * MS, rel=1e-3)
    cal = calibrate(d)
    assert cal.config.cp == 2 and cal.config.dp == 2
    assert cal.links.cp == pytest.approx(20e9, rel=1e-3) and cal.links.dp == pytest.approx(50e9, rel=1e-3)
    assert cal.workload.cp_bytes_per_layer == pytest.approx(KV, rel=1e-6)
    assert cal.workload.cp_grad_bytes_per_layer == pytest.approx(2 * KV, rel=1e-6)   # the all-to-alls' x 2 x 1
    assert cal.workload.fwd_s_per_layer == pytest.approx(2 * MS, rel=1e-3)
    assert cal.fit_error < 1e-3


def test_cp_down_is_priced_on_the_model(cp_job):
    """CP 1 x DP 4 with one micro-batch (same global batch of 4 sequences): 4 layers x 6 ms = 24 ms of
    compute, no exchange, the all-reduce over 4 ranks still 12 ms: 36 ms, the model's own step. Each
    rank then holds the whole sequence: the memory model's peak grows."""
    a = advise(cp_job)
    (rec,) = [r for r in a.recommendations if r.rule == "cp_down"]
    assert rec.flags == {"--context-parallel-size": "1"}
    assert rec.evidence[0].value == pytest.approx(32 * KV * 0.5 / 20e9 / MS, rel=1e-3)
    assert rec.step_s_after == pytest.approx(36 * MS, rel=1e-3)
    assert rec.step_s_after == pytest.approx(step_time(W, Config(dp=4, num_micro_batches=1, bucket_bytes=1e9),
                                                       LINKS), rel=1e-3)
    assert rec.memory_after_bytes > rec.memory_before_bytes
    assert rec.title.startswith("CP 1 x DP 4 instead of CP 2 x DP 2")
    assert not rec.runnable and rec.command is None      # the instrumented trainer has no CP


def _with_capacity(d, capacity):
    return dataclasses.replace(d, facts=msgspec.structs.replace(d.facts, memory_per_gpu_bytes=int(capacity)))


def test_cp_down_that_does_not_fit_is_paired_or_dropped(cp_job):
    """Between the peak now and CP 1's, the pairing adds the cheapest lever that fits (ZeRO-1 over the
    4 DP ranks: the optimizer states / 4), priced on the model with its traffic; with room for
    nothing, the change is dropped and said."""
    a = advise(cp_job)
    rec = next(r for r in a.recommendations if r.rule == "cp_down")
    room = _with_capacity(cp_job, (rec.memory_before_bytes + rec.memory_after_bytes) / 2)
    (paired,) = [r for r in advise(room).recommendations if r.rule == "cp_down"]
    assert paired.title.endswith("with ZeRO-1 to fit") and paired.flags["--use-distributed-optimizer"] == ""
    assert paired.memory_after_bytes <= paired.memory_capacity_bytes
    cal = calibrate(cp_job)
    assert paired.step_s_after == pytest.approx(cal.predict(Config(dp=4, num_micro_batches=1, bucket_bytes=1e9,
                                                                   zero=1)), rel=1e-9)
    tiny = advise(_with_capacity(cp_job, 1 * GiB))
    assert not [r for r in tiny.recommendations if r.rule == "cp_down"]
    assert any("dropped, does not fit: CP 1 x DP 4" in n for n in tiny.calibration)


def test_cp_unmeasured_is_unknown_not_free(cp_job):
    """CP in the layout but no collective on the cp axis: the exchange's cost is unknown, so the model
    is not calibrated (never priced as free) and no CP lever is priced."""
    d = dataclasses.replace(cp_job, comm=dataclasses.replace(cp_job.comm, ops=[o for o in cp_job.comm.ops
                                                                              if o.axis != "cp"]))
    with pytest.raises(CalibrationError, match="CP 2 but no collective on the cp axis"):
        calibrate(d)
    assert not [r for r in advise(d).recommendations if r.rule == "cp_down"]


def test_cp_bytes_from_the_shape_without_all_gathers(cp_job):
    """Only the all-to-alls measured: the bandwidth from them, K and V from the shape:
    2 x 1 x 2048 x 4096 x 2 B (no query groups: K and V as wide as the hidden size); dK and dV
    still from the all-to-alls."""
    d = dataclasses.replace(cp_job, comm=dataclasses.replace(cp_job.comm, ops=[
        o for o in cp_job.comm.ops if not (o.axis == "cp" and o.op == "all_gather")]))
    cal = calibrate(d)
    assert cal.workload.cp_bytes_per_layer == KV and cal.links.cp == pytest.approx(20e9, rel=1e-3)
    assert cal.workload.cp_grad_bytes_per_layer == pytest.approx(2 * KV, rel=1e-6)
    assert any("from the shape" in n for n in cal.assumptions)
    # and with no all-to-all either: dK, dV in fp32 from K and V's bytes, 2x for the 16-bit run
    d = dataclasses.replace(d, comm=dataclasses.replace(d.comm, ops=[o for o in d.comm.ops if o.axis != "cp"]
                                                        + [o for o in cp_job.comm.ops if o.axis == "cp"
                                                           and o.op == "all_gather"]))
    cal = calibrate(d)
    assert cal.workload.cp_grad_bytes_per_layer == pytest.approx(2 * KV, rel=1e-6)
    assert any("no cp all-to-all measured" in n for n in cal.assumptions)


def test_small_cp_exchange_proposes_nothing(tmp_path):
    """The same job on a 100x faster CP link: 0.2 ms of exposed exchange, under 10% of the step."""
    links = dataclasses.replace(LINKS, cp=2e12)
    write_job(simulate(W, C, links, steps=4), str(tmp_path), C, W)
    assert not [r for r in advise(diagnose(load_job(str(tmp_path)))).recommendations if r.rule == "cp_down"]


@pytest.mark.parametrize("zero", [1, 3])
def test_zero_over_dp_times_cp_is_calibrated_back(tmp_path, zero):
    """ZeRO with CP shards over the DP x CP group (dp_cp): the calibration reads the DP link and the
    gradient bytes from that group's reduce-scatters and fits the synthesised step."""
    w = dataclasses.replace(W, grad_bytes=4e9)
    c = dataclasses.replace(C, zero=zero, bucket_bytes=5e8)
    write_job(simulate(w, c, LINKS, steps=4), str(tmp_path), c, w)
    cal = calibrate(diagnose(load_job(str(tmp_path))))
    assert (cal.config.zero, cal.config.cp, cal.config.dp) == (zero, 2, 2)
    assert cal.links.dp == pytest.approx(50e9, rel=1e-3) and cal.links.cp == pytest.approx(20e9, rel=1e-3)
    assert cal.workload.grad_bytes == pytest.approx(4e9, rel=1e-6)
    assert cal.measured_step_s == pytest.approx(step_time(w, c, LINKS), rel=1e-6) and cal.fit_error < 1e-6


def test_cp_down_at_dp_one_keeps_the_interleaved_schedule_runnable(tmp_path):
    """CP 2 x DP 1 x PP 2, interleaved (2 chunks), 2 micro-batches of 2: the DP x CP group has the CP
    group's members (synth names both, the labels tell them apart). Half the micro-batches (1) would
    not be a multiple of the 2 stages interleaved 1F1B needs, so cp_down halves the micro-batch size
    instead: DP 2 x 2 micro-batches of 1, the same 4 sequences a step, priced as the model's step
    for it (the workload's per-micro-batch compute and messages halved)."""
    from diag.advise.calibrate import with_micro_batch
    kv = 2 * KV
    w = dataclasses.replace(W, cp_bytes_per_layer=kv, tp_bytes_per_layer=kv / 2, p2p_bytes=kv / 2)
    c = Config(pp=2, cp=2, num_micro_batches=2, micro_batch_size=2, schedule="interleaved", virtual_stages=2)
    links = dataclasses.replace(LINKS, pp=50e9)
    write_job(simulate(w, c, links, steps=4), str(tmp_path), c, w)
    d = diagnose(load_job(str(tmp_path)))
    cal = calibrate(d)
    assert cal.links.dp == pytest.approx(50e9, rel=1e-3) and cal.links.cp == pytest.approx(20e9, rel=1e-3)
    (rec,) = [r for r in advise(d).recommendations if r.rule == "cp_down"]
    assert rec.flags == {"--context-parallel-size": "1", "--micro-batch-size": "1"}
    after = Config(pp=2, dp=2, num_micro_batches=2, micro_batch_size=1, schedule="interleaved", virtual_stages=2)
    assert rec.step_s_after == pytest.approx(step_time(with_micro_batch(w, 2, 1), after, links), rel=1e-3)


def _strip_labels(directory) -> None:
    """The traces as a framework writes them: no `diag:comm` labels, each op's process group named
    only by its "Process Group Name" and the rank's pg_config."""
    import gzip
    import json
    import pathlib
    for p in pathlib.Path(directory).glob("rank-*.pt.trace.json.gz"):
        doc = json.loads(gzip.decompress(p.read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("diag:comm")]
        p.write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_same_member_groups_are_told_apart_by_the_ops_group_name(tmp_path):
    """CP 2 x DP 1: the CP group and the DP x CP group the gradients are all-reduced over have the same
    members (ranks 0 and 1). Without labels, each op takes the axis its own group's description names:
    the K/V all-gathers and dK/dV all-to-alls on cp, the gradient all-reduce on dp_cp; the layout is
    still found (CP 2 from the names), and the model is calibrated back on both links."""
    c = Config(cp=2, num_micro_batches=2, bucket_bytes=1e9)
    write_job(simulate(W, c, LINKS, steps=4), str(tmp_path), c, W)
    _strip_labels(tmp_path)
    d = diagnose(load_job(str(tmp_path)))
    assert d.facts.cp == 2
    ops = {(o.axis, o.op) for o in d.comm.ops}
    assert ops == {("cp", "all_gather"), ("cp", "all_to_all"), ("dp_cp", "all_reduce")}
    cal = calibrate(d)
    assert cal.links.cp == pytest.approx(20e9, rel=1e-3) and cal.links.dp == pytest.approx(50e9, rel=1e-3)
    assert cal.measured_step_s == pytest.approx(step_time(W, c, LINKS), rel=1e-6) and cal.fit_error < 1e-6


def test_a_candidate_the_schedule_cannot_take_is_not_proposed(tmp_path):
    """Interleaved 1F1B, TP 2 x PP 2, 2 chunks of 1 layer a stage, 2 micro-batches, a slow TP link:
    tp_layout's candidates are TP 1 x PP 4 (4 layers over 4 stages x 2 chunks: not divisible) and TP 1 x
    DP 2 with 1 micro-batch (not a multiple of the 2 stages). Neither can be laid out: neither is
    proposed, and the other rules' recommendations are still made (one rule's invalid candidate used to
    end the whole recommender with a note)."""
    w = dataclasses.replace(W, tp_bytes_per_layer=2e8)
    c = Config(tp=2, pp=2, num_micro_batches=2, schedule="interleaved", virtual_stages=2)
    links = Links(tp=5e9, pp=50e9)
    write_job(simulate(w, c, links, steps=4), str(tmp_path), c, w)
    d = diagnose(load_job(str(tmp_path)))
    assert next(a for a in d.comm.axes if a.axis == "tp").exposed_per_step_s > 0.1 * d.throughput.step_time_s
    a = advise(d)
    assert not [r for r in a.recommendations if r.rule == "tp_layout"]
    assert not any("could not be computed" in n for n in a.calibration)
