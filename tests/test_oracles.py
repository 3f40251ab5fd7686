"""Oracle tests: the analyser recovers what the step-time model put into synthesised traces.

diag.advise.simulate says what every rank did; diag.advise.synth writes it as Kineto traces;
diag.analysis.diagnose must give back the model's overlap, bus bandwidth, stragglers and
pipeline bubble. Tolerances: the synthesiser writes times in microseconds with 3 decimals
and the loader rounds them to whole nanoseconds, so each event's start and duration may be
off by up to ~1 ns. Op durations here are >= 50 us, so a ratio of sums of durations (overlap,
bubble) is within 1e-6 absolute and a bandwidth from one duration within 1e-4 relative.
"""
import pytest

from diag.advise import Config, Links, Workload, simulate
from diag.advise.synth import write_job
from diag.analysis import diagnose
from diag.trace import load_job

MS = 1e-3
STEPS = 4                   # the analysis window drops the last: 3 steps analysed
WINDOW = range(STEPS - 1)
RATIO_TOL = 1e-6            # ns rounding of ms-scale ops, see the module docstring
BW_REL = 1e-4


def run(tmp_path, w, c, links, steps=STEPS, skew=None, **kw):
    tl = simulate(w, c, links, steps=steps, **kw)
    write_job(tl, str(tmp_path), c, w, clock_skew_s=skew)
    return tl, diagnose(load_job(str(tmp_path)))


def dp_only(dp, overlap):
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS, grad_bytes=16e9, optimizer_s=1 * MS)
    return w, Config(dp=dp, num_micro_batches=2, overlap_grad_reduce=overlap, bucket_bytes=4e9), Links(dp=2e12)


@pytest.mark.parametrize("dp", [2, 3, 4])
def test_overlap_ratio_is_the_models_hidden_fraction(tmp_path, dp):
    w, c, links = dp_only(dp, overlap=True)
    tl, d = run(tmp_path, w, c, links)
    assert not d.problems and len(d.ranks) == dp
    for r in d.ranks:
        truth = tl.ranks[r.rank].hidden_fraction(steps=WINDOW)
        assert 0.3 < truth < 1.0                     # a case worth testing: partly hidden
        assert r.overlap.ratio == pytest.approx(truth, abs=RATIO_TOL)


def test_no_overlap_without_overlap_grad_reduce(tmp_path):
    w, c, links = dp_only(2, overlap=False)
    tl, d = run(tmp_path, w, c, links)
    for r in d.ranks:
        assert tl.ranks[r.rank].hidden_fraction(steps=WINDOW) == pytest.approx(0.0, abs=1e-12)
        assert r.overlap.ratio == pytest.approx(0.0, abs=RATIO_TOL)


def mixed_job():
    w = Workload(num_layers=8, fwd_s_per_layer=2 * MS, tp_bytes_per_layer=8e6, p2p_bytes=4e6,
                 grad_bytes=1.6e9, optimizer_s=2 * MS)
    c = Config(tp=2, pp=2, dp=2, num_micro_batches=4, overlap_grad_reduce=True, bucket_bytes=1e8)
    return w, c, Links(tp=200e9, pp=50e9, dp=25e9)


@pytest.mark.parametrize("late", [None, 1, 6])
def test_busbw_is_the_links_even_with_a_late_rank(tmp_path, late):
    """The shortest matched instance is the transfer, so the busbw is the link's (GB/s = 1e9 B/s)."""
    w, c, links = mixed_job()
    _, d = run(tmp_path, w, c, links, rank_delay={late: 0.5 * MS} if late is not None else None)
    want = {("tp", "all_reduce"): links.tp, ("dp", "all_reduce"): links.dp, ("pp", "send"): links.pp}
    seen = set()
    for op in d.comm.ops:
        if (op.axis, op.op) in want:
            seen.add((op.axis, op.op))
            assert op.busbw_basis == "transfer"
            assert op.busbw_median_gbps == pytest.approx(want[(op.axis, op.op)] / 1e9, rel=BW_REL)
    assert seen == set(want)


@pytest.mark.parametrize("tp,dp,late", [(1, 4, 2), (1, 2, 1), (2, 1, 0)])
def test_late_rank_is_the_straggler_and_others_wait_its_delay(tmp_path, tp, dp, late):
    # the analyser ignores waits under 20 us (stragglers.MIN_DELAY_NS): 0.4 ms is well above it
    delay = 0.4 * MS
    w = Workload(num_layers=4, fwd_s_per_layer=1 * MS, tp_bytes_per_layer=4e6, grad_bytes=4e8)
    c = Config(tp=tp, dp=dp, num_micro_batches=2, bucket_bytes=1e8)
    links = Links(tp=200e9, dp=50e9)
    _, d = run(tmp_path, w, c, links, steps=5, rank_delay={late: delay})
    assert [s.rank for s in d.comm.stragglers if s.reason == "arrives last at collectives"] == [late]
    for rc in d.comm.ranks:                          # 4 analysed steps, one wait of `delay` each
        assert rc.wait_s == pytest.approx(0.0 if rc.rank == late else 4 * delay, abs=4 * 1e-8)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", [(2, 2), (2, 8), (4, 2), (4, 8)])
def test_bubble_is_the_ideal_without_dp_or_p2p_time(tmp_path, schedule, p, m):
    w = Workload(num_layers=8, fwd_s_per_layer=0.4 * MS)
    c = Config(pp=p, num_micro_batches=m, schedule=schedule)
    tl, d = run(tmp_path, w, c, Links(pp=float("inf")))
    ideal = (p - 1) / (m + p - 1)
    assert d.pipeline.ideal_fraction == pytest.approx(ideal)
    model = tl.stage_bubble()
    assert len(d.pipeline.stages) == p
    for st in d.pipeline.stages:
        assert model[st.stage] == pytest.approx(ideal, abs=1e-12)
        assert st.bubble_fraction == pytest.approx(ideal, abs=RATIO_TOL)


def test_bubble_is_the_models_with_tp_dp_and_p2p_time(tmp_path):
    w, c, links = mixed_job()
    tl, d = run(tmp_path, w, c, links)
    model = tl.stage_bubble()
    for st in d.pipeline.stages:
        assert st.bubble_fraction == pytest.approx(model[st.stage], abs=RATIO_TOL)


def _summary(d):
    return ([(r.rank, r.overlap.ratio, r.step_time_s) for r in d.ranks],
            [(o.axis, o.op, o.busbw_median_gbps, o.wait_s) for o in d.comm.ops],
            [(s.stage, s.bubble_fraction) for s in d.pipeline.stages],
            [s.rank for s in d.comm.stragglers])


def test_clock_skew_changes_nothing(tmp_path):
    w, c, links = mixed_job()
    _, plain = run(tmp_path / "plain", w, c, links, rank_delay={2: 0.5 * MS})
    _, skewed = run(tmp_path / "skewed", w, c, links, rank_delay={2: 0.5 * MS}, skew={2: 3.7, 5: -41.0})
    a, b = _summary(plain), _summary(skewed)
    for ra, rb in zip(a[0] + a[2], b[0] + b[2]):          # per-rank and per-stage rows
        assert ra == pytest.approx(rb, rel=1e-6, abs=1e-9)
    for oa, ob in zip(a[1], b[1]):                        # per collective row
        assert oa[:2] == ob[:2] and oa[2:] == pytest.approx(ob[2:], rel=1e-6, abs=1e-9)
    assert len(a[1]) == len(b[1]) and a[3] == b[3]


# --- p2p and stragglers. The recv test guards the send<->recv pairing (matching.py). The
# straggler test guards stragglers.py against two mistakes it once made in pipelines: counting
# pipeline receives as collectives that "waited for a rank" (every bubble wait would name the
# upstream stage), and blaming ranks that were late only because they waited on the real
# straggler earlier in the step.

def test_pp_recv_busbw_is_not_a_pipeline_wait(tmp_path):
    """A recv moves the same bytes over the same link as its send: its busbw from a matched
    transfer must be the link's, or it must not claim the "transfer" basis."""
    w, c, links = mixed_job()
    _, d = run(tmp_path, w, c, links)
    recv = [o for o in d.comm.ops if (o.axis, o.op) == ("pp", "recv")]
    assert recv
    for o in recv:
        assert o.busbw_basis != "transfer" or o.busbw_median_gbps == pytest.approx(links.pp / 1e9, rel=BW_REL)


def test_late_rank_is_the_straggler_in_a_pipeline_job(tmp_path):
    """Rank 2 (first stage) is 0.5 ms late every step and delays every rank by that much."""
    w, c, links = mixed_job()
    _, d = run(tmp_path, w, c, links, rank_delay={2: 0.5 * MS})
    assert [s.rank for s in d.comm.stragglers if s.reason == "arrives last at collectives"] == [2]
