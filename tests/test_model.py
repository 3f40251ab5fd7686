"""The step-time model against values worked out by hand.

Notation: tf, tb = forward, backward seconds of one micro-batch on one stage; p stages,
m micro-batches. Times are floats summed in a different order than the formulas, so
comparisons use a relative tolerance of 1e-9 (float rounding, nothing else).
"""
import math
from dataclasses import replace

import pytest

from diag.advise import Config, Links, Workload, allreduce_s, bubble_fraction, simulate, stage_order, step_time
from diag.advise.model import stage_costs

REL = 1e-9
MS = 1e-3


def approx(x):
    return pytest.approx(x, rel=REL, abs=1e-12)


def test_stage_order_1f1b_and_gpipe():
    o = stage_order("1f1b", 4, 0, 8)
    assert o[:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)] and o[4] == ("B", 0)
    assert stage_order("1f1b", 4, 3, 8)[:3] == [("F", 0), ("B", 0), ("F", 1)]
    assert stage_order("gpipe", 2, 1, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    for s in range(4):
        o = stage_order("1f1b", 4, s, 2)      # fewer micro-batches than warm-up slots
        assert sorted(o) == sorted([("F", i) for i in range(2)] + [("B", i) for i in range(2)])
    with pytest.raises(ValueError):               # Megatron-LM's interleaving needs m a multiple of p
        stage_order("interleaved", 4, 0, 6, 2)


@pytest.mark.parametrize("p,s,m,v", [(2, 0, 4, 2), (4, 1, 8, 2), (4, 3, 4, 3), (2, 1, 2, 4)])
def test_interleaved_order_runs_every_chunk_of_every_micro_batch_once(p, s, m, v):
    o = stage_order("interleaved", p, s, m, v)
    assert sorted(o) == sorted((k, i, c) for k in "FB" for i in range(m) for c in range(v))
    seen = set()
    for k, i, c in o:                                   # a chunk's backward after its forward
        assert k == "F" or ("F", i, c) in seen
        seen.add((k, i, c))
    warm = min((p - s - 1) * 2 + (v - 1) * p, m * v)    # Megatron-LM's warm-up forwards
    assert all(k == "F" for k, _, _ in o[:warm]) and (warm == m * v or o[warm + 1][0] == "B")


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 4, 2), (2, 2, 4), (2, 4, 4)])
def test_interleaved_step_is_m_plus_p_minus_1_over_v(p, m, v):
    """Zero-cost communication: the interleaved step is (m + (p-1)/v)(tf+tb) (Narayanan et al. 2021:
    the bubble (p-1)/(v m) of ideal compute), against 1F1B's (m + p - 1)(tf+tb)."""
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS)
    tf, tb = 8 / p * MS, 2 * 8 / p * MS
    t = simulate(w, Config(pp=p, num_micro_batches=m, schedule="interleaved", virtual_stages=v), Links(), steps=3)
    assert t.step_time_s == approx((m + (p - 1) / v) * (tf + tb))


def test_interleaved_sends_v_times_the_pipeline_messages():
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS, p2p_bytes=1e6)
    counts = {}
    for v in (1, 2, 4):
        c = Config(pp=2, num_micro_batches=4, schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v)
        t = simulate(w, c, Links(pp=1e9), steps=3)
        counts[v] = sum(1 for r in t.ranks for op, s in zip(r.op, r.step) if op == "send" and s == r.step[0])
    # per step: each of m micro-batches crosses (p v - 1) virtual-stage boundaries, forward and backward
    assert counts == {v: 2 * 4 * (2 * v - 1) for v in (1, 2, 4)}


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", [(4, 8), (2, 2), (4, 2), (2, 8)])
def test_zero_comm_pipeline_step_and_bubble(schedule, p, m):
    """step = (m+p-1)(tf+tb); every stage idles (p-1)(tf+tb) in PP recv -> (p-1)/(m+p-1)."""
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS)
    tf, tb = 8 / p * MS, 2 * 8 / p * MS
    c = Config(pp=p, num_micro_batches=m, schedule=schedule)
    t = simulate(w, c, Links(), steps=3)
    assert t.step_time_s == approx((m + p - 1) * (tf + tb))
    for frac in t.stage_bubble().values():
        assert frac == approx((p - 1) / (m + p - 1))
    for r in t.ranks:                       # steady state: every step of every rank the same
        assert list(r.step_durations()) == [approx(t.step_time_s)] * 3


def test_tp_all_reduces_serialise_with_compute():
    """pp=dp=1, tp=2: per micro-batch 4 all-reduces per layer of S * 2(1/2) / busbw each."""
    w = Workload(num_layers=2, fwd_s_per_layer=2 * MS, tp_bytes_per_layer=10e6)
    c = Config(tp=2, num_micro_batches=3)
    ar = 10e6 * 1.0 / 100e9
    expect = 3 * (2 * (1 * MS + 2 * MS) + 2 * 4 * ar)
    assert step_time(w, c, Links(tp=100e9)) == approx(expect)
    assert allreduce_s(10e6, 2, 100e9) == approx(ar)


def test_dp_all_reduce_not_overlapped():
    """Added time = grad_bytes/(tp·pp) · 2(dp-1)/dp / busbw, whatever the bucketing."""
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS, grad_bytes=8e9)
    links = Links(dp=50e9)
    for tp, pp, dp in [(1, 1, 2), (2, 2, 4), (1, 4, 3)]:
        base = Config(tp=tp, pp=pp, dp=1, num_micro_batches=4, bucket_bytes=1e8)
        c = Config(tp=tp, pp=pp, dp=dp, num_micro_batches=4, bucket_bytes=1e8)
        added = 8e9 / (tp * pp) * 2 * (dp - 1) / dp / 50e9
        assert step_time(w, c, links) - step_time(w, base, links) == approx(added)
        t = simulate(w, c, links, steps=1)
        for r in t.ranks:
            assert r.dur_s[r.select(axis="dp")].sum() == approx(added)


def test_overlap_hides_buckets_behind_backward():
    """8 one-layer buckets, each shorter than a layer's backward: only the last is exposed."""
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS, grad_bytes=8e9)
    links = Links(dp=1e12)                       # a 1e9-byte bucket over 2 ranks: 1 ms < 2 ms backward
    bucket_s = 1e9 * 1.0 / 1e12
    on = Config(dp=2, num_micro_batches=2, overlap_grad_reduce=True, bucket_bytes=1e9)
    off = Config(dp=2, num_micro_batches=2, overlap_grad_reduce=False, bucket_bytes=1e9)
    compute = 2 * 8 * 3 * MS
    assert step_time(w, off, links) == approx(compute + 8 * bucket_s)
    assert step_time(w, on, links) == approx(compute + bucket_s)
    t = simulate(w, on, links, steps=2)
    for r in t.ranks:
        assert r.hidden_fraction(axis="dp") == approx(7 / 8)
    assert simulate(w, off, links, steps=2).ranks[0].hidden_fraction() == approx(0.0)


@pytest.mark.parametrize("tp,pp,dp,late", [(1, 1, 4, 2), (2, 2, 2, 1), (2, 1, 1, 1)])
def test_straggler_delays_everyone(tp, pp, dp, late):
    """A rank d late each step makes every rank's step d longer: they wait at collectives.

    (The late rank is on the first stage: a later stage's delay at the start of a step is
    absorbed by the time it waits for its first forward anyway; see the next test.)
    """
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, tp_bytes_per_layer=1e6, p2p_bytes=1e6,
                 grad_bytes=1e8, optimizer_s=1 * MS)
    c = Config(tp=tp, pp=pp, dp=dp, num_micro_batches=4, bucket_bytes=2.5e7)
    links = Links(tp=100e9, pp=25e9, dp=25e9)
    base = simulate(w, c, links, steps=3)
    slow = simulate(w, c, links, steps=3, rank_delay={late: 0.7 * MS})
    for r0, r1 in zip(base.ranks, slow.ranks):
        assert list(r1.step_durations()) == [approx(d + 0.7 * MS) for d in r0.step_durations()]


def test_delay_on_last_stage_hides_in_the_bubble():
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS)
    c = Config(pp=2, num_micro_batches=4)
    # the last stage waits tf0 + tb0 = 6 ms for its first forward; a 1 ms delay fits in it
    assert simulate(w, c, Links(), steps=2, rank_delay={1: 1 * MS}).step_time_s == approx(step_time(w, c, Links()))


def test_recompute_adds_one_forward_per_micro_batch():
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, recompute="full")
    assert step_time(w, Config(num_micro_batches=3), Links()) == approx(3 * (4 + 8 + 4) * MS)


def test_the_recomputed_forward_pays_its_two_kernels_launch_overhead():
    """A layer's forward is two modelled kernels, each paying the launch overhead l; recomputed, it pays
    both again. f = 1 ms, l = 0.5 ms, 4 layers, m = 2: a layer and micro-batch takes forward f + 2l = 2 ms,
    the recompute 2 ms, backward 2f + 2l = 3 ms: 2 x 4 x 7 = 56 ms; without recompute 2 x 4 x 5 = 40 ms."""
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, launch_overhead_s=0.5 * MS, recompute="full")
    assert step_time(w, Config(num_micro_batches=2), Links()) == approx(56 * MS)
    assert step_time(replace(w, recompute="none"), Config(num_micro_batches=2), Links()) == approx(40 * MS)


def test_stage_slowdown_sets_the_pace():
    """p=2, m large: a 2x slower stage 1 sets the step; stage 0 waits on it (bigger bubble)."""
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS)
    c = Config(pp=2, num_micro_batches=16)
    even = bubble_fraction(w, c, Links())
    slow = simulate(w, c, Links(), steps=2, stage_slowdown={1: 2.0})
    assert slow.step_time_s > step_time(w, c, Links())
    assert slow.stage_bubble()[0] > even[0] and slow.stage_bubble()[1] < slow.stage_bubble()[0]
    # the slow stage computes 16 * (4 + 8) ms and idles (p-1)(tf+tb) of the fast stage: 2 + 4 ms
    assert slow.step_time_s == approx(16 * 12 * MS + 2 * MS + 4 * MS)


def test_validation():
    with pytest.raises(ValueError):
        Workload(num_layers=0, fwd_s_per_layer=1.0)
    with pytest.raises(ValueError):
        Workload(num_layers=2, fwd_s_per_layer=1.0, recompute="selective")
    with pytest.raises(ValueError):
        Config(schedule="zb")
    with pytest.raises(ValueError):
        Config(virtual_stages=2)                 # only with the interleaved schedule
    with pytest.raises(ValueError):
        Links(tp=0)
    with pytest.raises(ValueError):
        simulate(Workload(num_layers=6, fwd_s_per_layer=1.0), Config(pp=4), Links())
    with pytest.raises(ValueError):       # interleaving needs the micro-batches a multiple of the stages
        simulate(Workload(num_layers=8, fwd_s_per_layer=1.0),
                 Config(pp=2, num_micro_batches=3, schedule="interleaved", virtual_stages=2), Links())
    assert math.isinf(Links().tp)


def test_two_replicas_stand_for_many():
    """The recommender simulates 2 DP replicas with the DP links slowed by the bus factor: the
    step time equals the full simulation's (replicas are symmetric)."""
    from dataclasses import replace as _replace
    from diag.advise.calibrate import two_replicas
    w = Workload(num_layers=4, fwd_s_per_layer=1e-3, tp_bytes_per_layer=4e6, p2p_bytes=2e6, grad_bytes=4e8)
    links = Links(tp=200e9, pp=50e9, dp=25e9, latency_s=5e-6)
    for overlap in (False, True):
        c = Config(tp=2, pp=2, dp=8, num_micro_batches=4, overlap_grad_reduce=overlap, bucket_bytes=5e7)
        small_c, small_links = two_replicas(c, links)
        assert small_c.dp == 2 and small_links.dp == pytest.approx(25e9 / (2 * 7 / 8))
        assert step_time(w, small_c, small_links) == pytest.approx(step_time(w, c, links), rel=1e-9)


def test_host_fixed_cost_is_held_per_micro_batch():
    """Per layer and micro-batch: forward 1 ms, backward 2 ms, host operators' fixed cost 3 ms
    (split 1 : 2 like compute). m=2, 4 layers: 2 x 4 x (1 + 2 + 3) = 48 ms. Micro-batch doubled,
    m=1: compute doubles (2 + 4 ms), the fixed cost does not: 1 x 4 x (2 + 4 + 3) = 36 ms."""
    from diag.advise.calibrate import with_micro_batch
    from diag.advise.model import host_fixed_s
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, host_fixed_s_per_layer=3 * MS)
    assert host_fixed_s(w, Config(), 0) == (approx(1 * MS), approx(2 * MS))
    assert step_time(w, Config(num_micro_batches=2, micro_batch_size=2), Links()) == approx(48 * MS)
    big = with_micro_batch(w, 2, 4)
    assert big.host_fixed_s_per_layer == 3 * MS
    assert step_time(big, Config(num_micro_batches=1, micro_batch_size=4), Links()) == approx(36 * MS)


def test_dtensor_dispatch_paid_at_tp_above_one_only():
    """2 layers, forward 2 ms at TP=1, DTensor dispatch 1.5 ms per layer and micro-batch, m=3,
    free links. TP=2: 3 x 2 x (1 + 2 + 1.5) = 27 ms; TP=1: 3 x 2 x (2 + 4) = 36 ms."""
    w = Workload(num_layers=2, fwd_s_per_layer=2 * MS, dtensor_s_per_layer=1.5 * MS)
    assert step_time(w, Config(tp=2, num_micro_batches=3), Links()) == approx(27 * MS)
    assert step_time(w, Config(tp=1, num_micro_batches=3), Links()) == approx(36 * MS)


def test_recompute_pays_the_forward_fixed_cost_again():
    """Full recompute: one more forward per layer with its share of the fixed cost (1 ms of 3):
    m=1, 4 layers: 4 x (1 + 2 + 1 + 3 + 1) = 32 ms."""
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, host_fixed_s_per_layer=3 * MS, recompute="full")
    assert step_time(w, Config(), Links()) == approx(32 * MS)


def _dp_ops(t, op):
    r = t.ranks[0]
    return [(s, d) for s, d, o, a in zip(r.start_s, r.dur_s, r.op, r.axis) if a == "dp" and o == op]


def test_zero12_reduce_scatter_and_all_gather_move_what_the_all_reduce_moved():
    """ZeRO-1/2 (Megatron's distributed optimizer): the buckets are reduce-scattered, S(n-1)/n /
    busbw each, and the stage's parameters all-gathered after the optimizer, P(n-1)/n / busbw.
    With fp32 parameters (P = gradient bytes) that is the all-reduce's 2S(n-1)/n: the step only
    loses the optimizer's (dp-1)/dp. With bf16 parameters P = S/2: 3/4 of the all-reduce."""
    links = Links(dp=50e9)
    for tp, pp, dp in [(1, 1, 2), (2, 2, 4), (1, 2, 3)]:
        w = Workload(num_layers=8, fwd_s_per_layer=1 * MS, grad_bytes=8e9, optimizer_s=12 * MS)
        c0 = Config(tp=tp, pp=pp, dp=dp, num_micro_batches=4, bucket_bytes=1e8)
        ar = 8e9 / (tp * pp) * 2 * (dp - 1) / dp / 50e9
        opt = 12 * MS / (tp * pp)
        for zero in (1, 2):
            c = Config(tp=tp, pp=pp, dp=dp, num_micro_batches=4, bucket_bytes=1e8, zero=zero)
            assert step_time(w, c, links) == approx(step_time(w, c0, links) - opt * (dp - 1) / dp)
            t = simulate(w, c, links, steps=1)
            assert sum(d for _, d in _dp_ops(t, "reduce_scatter")) == approx(ar / 2)
            assert sum(d for _, d in _dp_ops(t, "all_gather")) == approx(ar / 2)
            assert not _dp_ops(t, "all_reduce")
            half = Workload(num_layers=8, fwd_s_per_layer=1 * MS, grad_bytes=8e9, optimizer_s=12 * MS,
                            param_bytes=4e9)
            assert step_time(w, c, links) - step_time(half, c, links) == approx(ar / 4)


def test_zero3_one_layer_gathers_twice_and_scatters_once_per_micro_batch():
    """One layer, one micro-batch, dp 2: the forward waits for its all-gather (a), the backward
    for the second one (a), the step for the reduce-scatter (r): 2a + tf + tb + r."""
    f, G, B = 2 * MS, 4e9, 1e12
    w = Workload(num_layers=1, fwd_s_per_layer=f, grad_bytes=G)
    a = r = G * 0.5 / B
    c = Config(dp=2, num_micro_batches=1, zero=3)
    assert step_time(w, c, Links(dp=B)) == approx(2 * a + 3 * f + r)
    t = simulate(w, c, Links(dp=B), steps=1)
    assert len(_dp_ops(t, "all_gather")) == 2 and len(_dp_ops(t, "reduce_scatter")) == 1


def test_zero3_prefetch_hides_all_but_the_first_gather_of_each_pass():
    """L layers, m micro-batches, each layer's gather (a) shorter than its forward (f): only each
    pass's first gather is exposed, and the last reduce-scatter (r < backward of a layer):
    step = m(L·3f + 2a) + r, with 2·L·m gathers and L·m scatters; at dp 1 nothing is added."""
    L, m, f, B = 4, 3, 2 * MS, 1e12
    w = Workload(num_layers=L, fwd_s_per_layer=f, grad_bytes=8e9, param_bytes=4e9)
    a, r = 1e9 * 0.5 / B, 2e9 * 0.5 / B
    assert a < f and r < 2 * f
    c = Config(dp=2, num_micro_batches=m, zero=3)
    assert step_time(w, c, Links(dp=B)) == approx(m * (L * 3 * f + 2 * a) + r)
    t = simulate(w, c, Links(dp=B), steps=1)
    assert len(_dp_ops(t, "all_gather")) == 2 * L * m and len(_dp_ops(t, "reduce_scatter")) == L * m
    assert step_time(w, Config(dp=1, num_micro_batches=m, zero=3), Links(dp=B)) == approx(m * L * 3 * f)
    with pytest.raises(ValueError):
        Config(zero=4)


def test_zero3_two_replicas_stand_for_many():
    """As for the all-reduce: ZeRO's gathers over two replicas on the slowed link take what they
    take over n ranks (the bus factors (n-1)/n and 2(n-1)/n keep their ratio)."""
    from diag.advise.calibrate import two_replicas
    w = Workload(num_layers=4, fwd_s_per_layer=1e-3, tp_bytes_per_layer=4e6, p2p_bytes=2e6, grad_bytes=4e8)
    links = Links(tp=200e9, pp=50e9, dp=25e9)
    for zero in (1, 3):
        c = Config(tp=2, pp=2, dp=8, num_micro_batches=4, zero=zero, bucket_bytes=5e7)
        assert step_time(w, *two_replicas(c, links)) == pytest.approx(step_time(w, c, links), rel=1e-9)


@pytest.mark.parametrize("p,m", [(2, 2), (2, 5), (4, 4), (4, 8), (4, 2), (3, 7), (8, 16)])
def test_zero_bubble_order_is_torchs(p, m):
    """The model's ZB1P order against torch.distributed.pipelining's own action lists for
    ScheduleInterleavedZeroBubble with one stage a rank (its _get_1f1b_rank_ops, bubbles left out)."""
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    from diag.advise.schedule import zero_bubble_order
    kind = {sched._ComputationType.FORWARD: "F", sched._ComputationType.BACKWARD_INPUT: "I",
            sched._ComputationType.BACKWARD_WEIGHT: "W"}
    for s in range(p):
        warm = sched._get_warmup_ops(s, 1, m // max(1, m // p), p, m, multiply_factor=1)
        ops = sched._get_1f1b_rank_ops(1, p, warm, m - warm, warm, s, lambda op: s, lambda op: s,
                                       num_1f1b_microbatches=s, enable_zero_bubble=True)
        torch_order = [(kind[a.computation_type], a.microbatch_index) for a in ops if a is not None]
        assert zero_bubble_order(p, s, m) == torch_order


def test_zero_bubble_fills_the_1f1b_waits_with_weight_gradients():
    """p = 2, m = 2, forward f, input and weight backward f each (backward 2f, split in halves), no
    communication. 1F1B: (m + p - 1)(3f) = 9f. ZB1P: stage 0 runs F0 F1 I0 W0 I1 W1, stage 1
    F0 I0 F1 I1 W0 W1; stage 1's I1 ends at 5f (F0 1-2, I0 2-3, F1 3-4, I1 4-5), so stage 0's I1
    runs 5-6 after W0 (4-5) filled the wait, and W1 ends the step at 7f: 3mf + (p-1)(f + f - f)."""
    f = 1 * MS
    w = Workload(num_layers=2, fwd_s_per_layer=f)
    assert step_time(w, Config(pp=2, num_micro_batches=2), Links()) == approx(9 * f)
    assert step_time(w, Config(pp=2, num_micro_batches=2, schedule="zb1p"), Links()) == approx(7 * f)
    for p, m in [(4, 8), (3, 6)]:           # the same formula: 3mf·L/p + (p-1)·f·L/p, L/p layers a stage
        w = Workload(num_layers=p, fwd_s_per_layer=f)
        assert step_time(w, Config(pp=p, num_micro_batches=m, schedule="zb1p"), Links()) == approx(
            (3 * m + p - 1) * f)
        assert step_time(w, Config(pp=p, num_micro_batches=m), Links()) == approx((m + p - 1) * 3 * f)


def test_split_backward_extra_paid_past_the_first_stage_under_zero_bubble_only():
    """As above (p = 2, m = 2, F = I = W = f: one layer a stage, backward 2f, weight share 1/2), stage 1's
    split backward e dearer, paid in its weight passes (torch's input pass costs the fused backward's input
    share, measured on CPU: benchmarks/README.md): W = f + 2fe on stage 1, I = f.
    e = 50%, W = 2f. Stage 1: F0 [f, 2f], I0 [2f, 3f], F1 [3f, 4f], I1 [4f, 5f], W0 [5f, 7f], W1 [7f, 9f];
    stage 0: I0 after its gradient [3f, 4f], W0 [4f, 5f], I1 [5f, 6f], W1 ends at 7f, where its next step
    starts: its F0 reaches stage 1 at 8f, before stage 1 ends its step at 9f. Steady state, the step is stage
    1's work, never waiting: 2f + 2f + 4f = 8f (7f unpriced).
    e = 10%, W = 1.2f: stage 1's weight passes end at 7.4f, before the next F0 reaches it at 8f: the extra
    fills stage 1's wait and the step stays stage 0's 7f. Had it been paid in the input passes too (each
    1.1f), stage 0 would have waited 0.1f more for each gradient: 7.2f.
    1F1B keeps its fused backward: 9f as before."""
    f = 1 * MS
    zb = Config(pp=2, num_micro_batches=2, schedule="zb1p")
    for extra, step in ((0.5, 8 * f), (0.1, 7 * f)):
        w = Workload(num_layers=2, fwd_s_per_layer=f, split_backward_extra=extra)
        assert step_time(w, zb, Links()) == approx(step)
        assert step_time(w, Config(pp=2, num_micro_batches=2), Links()) == approx(9 * f)
        s0, s1 = (stage_costs(w, zb, Links(), stage=s) for s in (0, 1))
        assert (s0.bwd_half_s, s1.bwd_half_s) == approx((f, f))          # the input pass: the fused backward's share
        assert (s0.weight_extra_s, s1.weight_extra_s) == approx((0.0, 2 * f * extra))


def test_split_backward_host_time_paid_past_the_first_stage_under_zero_bubble_only():
    """On a GPU that waits on the host the split backward's extra is host time a layer and micro-batch
    (Workload.split_backward_host_s), shared by I and W as the backward is (weight share 1/2 here). As
    above with h = f on the stage's one layer: stage 1's I and W take f + h/2 = 1.5f each, the case worked
    above: 8f under ZB1P; 1F1B's fused backward pays none: 9f."""
    f = 1 * MS
    w = Workload(num_layers=2, fwd_s_per_layer=f, split_backward_host_s=f)
    assert step_time(w, Config(pp=2, num_micro_batches=2, schedule="zb1p"), Links()) == approx(8 * f)
    assert step_time(w, Config(pp=2, num_micro_batches=2), Links()) == approx(9 * f)
    # a backward half (B/2 = f): the first stage's input needs no gradient, so it runs the fused backward
    zb = Config(pp=2, num_micro_batches=2, schedule="zb1p")
    assert [stage_costs(w, zb, Links(), stage=s).bwd_half_s for s in (0, 1)] == approx([f, 1.5 * f])
    assert stage_costs(w, Config(pp=2, num_micro_batches=2), Links(), stage=1).bwd_half_s == approx(f)


def test_zero3_blocking_gathers_pay_every_layer():
    """On a host timeline (gloo runs the collective in the call) ZeRO-3's gathers and scatters hold
    the thread: every layer pays its two all-gathers and its reduce-scatter, m·L·(2a + 3f + r)."""
    L, m, f, B = 4, 3, 2 * MS, 1e12
    w = Workload(num_layers=L, fwd_s_per_layer=f, grad_bytes=8e9, param_bytes=4e9, blocking_gathers=True)
    a, r = 1e9 * 0.5 / B, 2e9 * 0.5 / B
    c = Config(dp=2, num_micro_batches=m, zero=3)
    assert step_time(w, c, Links(dp=B)) == approx(m * L * (2 * a + 3 * f + r))


@pytest.mark.parametrize("kw", [dict(tp=4, pp=2, dp=2, num_micro_batches=4),
                                dict(tp=2, pp=2, dp=2, num_micro_batches=4, schedule="interleaved", virtual_stages=2),
                                dict(tp=2, pp=2, dp=2, num_micro_batches=2, schedule="zb1p", overlap_grad_reduce=True),
                                dict(tp=2, pp=1, dp=2, num_micro_batches=2, zero=3),
                                dict(tp=8, pp=1, dp=1, num_micro_batches=1)])
def test_one_rank_stands_for_its_tp_group(kw):
    """fold_tp simulates one member of each TP group: they run the same program and arrive together,
    so every step time and bubble equals the full simulation's (step_time folds by default)."""
    w = Workload(num_layers=4, fwd_s_per_layer=1e-3, tp_bytes_per_layer=4e6, p2p_bytes=2e6, grad_bytes=4e8,
                 optimizer_s=2e-3)
    links = Links(tp=100e9, pp=25e9, dp=12e9, latency_s=3e-6)
    c = Config(**kw, bucket_bytes=5e7)
    full = simulate(w, c, links, steps=2)
    folded = simulate(w, c, links, steps=2, fold_tp=True)
    assert len(folded.ranks) * c.tp == len(full.ranks)
    assert folded.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
    assert step_time(w, c, links) == pytest.approx(full.step_time_s, rel=1e-12)
    assert folded.stage_bubble() == pytest.approx(full.stage_bubble(), rel=1e-12)
    r = folded.ranks[0]
    assert sum(d for d, a in zip(r.dur_s, r.axis) if a == "tp") == pytest.approx(
        sum(d for d, a in zip(full.ranks[0].dur_s, full.ranks[0].axis) if a == "tp"), rel=1e-12)


def test_fsdp_own_host_time_is_paid_under_zero2_and_3_only():
    """Per layer and micro-batch: forward 1 ms, backward 2 ms, FSDP2's own host time 3 ms (split
    1 : 2 like compute); its optimizer's DTensor dispatch 1 ms per layer per step. Free links, 4
    layers, m=2, DP 2. ZeRO-3: 2 x 4 x (1 + 2 + 3) + 4 x 1 = 52 ms; ZeRO-2, FSDP2 without
    resharding, the same. Replicated (ZeRO-0) and ZeRO-1 (no FSDP2): 2 x 4 x 3 = 24 ms. ZeRO-3 at DP 1
    shards nothing, so nothing is paid: 24 ms."""
    from dataclasses import replace
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, fsdp_s_per_layer=3 * MS, fsdp_optimizer_s_per_layer=1 * MS)
    c = Config(dp=2, num_micro_batches=2, zero=3)
    assert step_time(w, c, Links()) == approx(52 * MS)
    assert step_time(w, replace(c, zero=0), Links()) == approx(24 * MS)
    assert step_time(w, replace(c, zero=2), Links()) == approx(52 * MS)
    assert step_time(w, replace(c, zero=1), Links()) == approx(24 * MS)
    assert step_time(w, replace(c, dp=1), Links()) == approx(24 * MS)
