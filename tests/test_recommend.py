"""Recommendations against known truth: traces synthesised by the step-time model.

diag.advise.simulate + synth write a job whose every number is known; diagnose + recommend
must calibrate the model back to its inputs, fire the rule the job was built to trip, and
predict the step time the model itself gives for the recommended configuration (the truth
here, since the job *is* the model). Hand-worked numbers are in each test's docstring.
"""
import json
import os
from dataclasses import replace

import msgspec
import pytest
from click.testing import CliRunner

from diag.advise import Config, Links, Workload, simulate, step_time
from diag.advise.calibrate import calibrate
from diag.advise.propose import rerun_command
from diag.advise.recommend import advise
from diag.advise.synth import Shape, write_job
from diag.analysis import diagnose
from diag.advise.recommend import with_advice
from diag import runmeta
from diag.cli import main
from diag.trace import load_job

MS = 1e-3
ACT = 2048 * 4096 * 2               # synth Shape: seq 2048 x hidden 4096 x bf16, per sequence


def job(tmp_path, w, c, links, **kw):
    write_job(simulate(w, c, links, steps=4, **kw), str(tmp_path), c, w)
    return with_advice(diagnose(load_job(str(tmp_path))))


def test_pp_one_micro_batch_recommends_more_micro_batches(tmp_path):
    """p=2, m=1, micro-batch 4: step = (m+p-1)(tf+tb) = 2 x 4 layers x 3 ms = 24 ms; bubble 1/2.

    Splitting into m=4 micro-batches of 1: (4+1) x 4 x 3 ms / 4 = 15 ms (-37.5%), the best of
    m=2 (18 ms) and m=4; the model is calibrated back to 1 ms per layer forward.
    """
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS, p2p_bytes=4 * ACT)
    c = Config(pp=2, num_micro_batches=1, micro_batch_size=4)
    d = job(tmp_path, w, c, Links(pp=1e15))
    cal = calibrate(d)
    assert cal.workload.fwd_s_per_layer == pytest.approx(1 * MS, rel=1e-3)
    assert cal.measured_step_s == pytest.approx(24 * MS, rel=1e-3)
    top = d.recommendations[0]
    assert top.rule == "bubble" and top.flags == {"--micro-batch-size": "1"}
    assert top.evidence[0].value == pytest.approx(0.5, abs=1e-3)
    assert top.step_s_after == pytest.approx(15 * MS, rel=1e-3)
    assert top.gain == pytest.approx(0.375, abs=1e-3) and top.confidence == "high"
    assert top.tokens_per_s_after == pytest.approx(4 * 2048 / (15 * MS), rel=1e-3)


def test_exposed_dp_recommends_overlap_priced_by_the_model(tmp_path):
    """DP=2 without overlap: the all-reduce of 1.6 GB at 25 GB/s busbw (1.6e9 x 2(1/2) / 25e9 = 64 ms)
    follows backward, one bucket per layer (2e8 B >= the bucket size, in fp32 or bf16 elements). The prediction must equal the model's own step for --overlap-grad-reduce."""
    w = Workload(num_layers=8, fwd_s_per_layer=2 * MS, grad_bytes=1.6e9)
    c = Config(dp=2, num_micro_batches=4, bucket_bytes=1e8)
    links = Links(dp=25e9)
    d = job(tmp_path, w, c, links)
    rec = next(r for r in d.recommendations if r.rule == "dp_overlap")
    assert rec.flags == {"--overlap-grad-reduce": ""}
    assert rec.evidence[0].value == pytest.approx(64.0, rel=1e-3)          # ms/step exposed
    truth = step_time(w, Config(dp=2, num_micro_batches=4, bucket_bytes=1e8, overlap_grad_reduce=True), links)
    assert rec.step_s_after == pytest.approx(truth, rel=1e-3)
    assert rec.step_s_before == pytest.approx(step_time(w, c, links), rel=1e-3)
    assert not any("gloo's threads" in a for a in rec.assumptions)        # a GPU timeline: no caveat


def test_dp_overlap_on_a_cpu_timeline_is_low_confidence_and_says_why():
    """On a host timeline gloo's threads run the overlapped all-reduce beside the backward on the same
    cores, which the model does not price (measured: +1..+5% against -5..-8% predicted): said, and low."""
    d = with_advice(diagnose(load_job("sample_traces/dp2_no_overlap")))
    rec = next(r for r in d.recommendations if r.rule == "dp_overlap")
    assert rec.confidence == "low" and rec.flags == {"--overlap-grad-reduce": ""}
    assert any("gloo's threads run the overlapped all-reduce" in a for a in rec.assumptions), rec.assumptions


HOST = {"host_cpus": 2, "ranks_per_host": 2, "threads_per_rank": 1}


def test_dp_overlap_on_a_host_whose_cores_the_ranks_take_is_priced_at_nothing_and_said():
    """The same trace with the run's host facts: 2 ranks x 1 thread on 2 cores, so gloo's threads would
    reduce on the compute's cores (calibrate.shared_cores). The model hides none of the overlapped
    all-reduce: its price of --overlap-grad-reduce is the measured step exactly (predict = measured +
    model(new) - model(now), and model(new) = model(now)), so the rule proposes nothing and says why."""
    d = with_advice(diagnose(load_job("sample_traces/dp2_no_overlap"), shape=HOST))
    assert (d.facts.host_cpus, d.facts.ranks_per_host, d.facts.threads_per_rank) == (2, 2, 1)
    cal = calibrate(d)
    assert cal.workload.shared_cores
    assert cal.predict(replace(cal.config, overlap_grad_reduce=True)) == cal.measured_step_s
    assert not any(r.rule == "dp_overlap" for r in d.recommendations)
    notes = d.advice_basis.calibration
    assert any(n.startswith("2 ranks x 1 thread take the host's 2 cores") for n in notes), notes
    assert "not proposed: overlap the DP gradient all-reduce with backward (+0.0% predicted): 2 ranks x 1 thread " \
           "take the host's 2 cores" in "\n".join(notes), notes


def test_dp_overlap_on_a_host_with_idle_cores_is_proposed_without_the_caveat():
    """8 cores for 2 single-thread ranks: gloo's threads have cores of their own, so the model's hiding
    stands: the same price as where the host is unknown, proposed, and without the unknown-host caveat."""
    spare = with_advice(diagnose(load_job("sample_traces/dp2_no_overlap"), shape={**HOST, "host_cpus": 8}))
    unknown = with_advice(diagnose(load_job("sample_traces/dp2_no_overlap")))
    rec = next(r for r in spare.recommendations if r.rule == "dp_overlap")
    was = next(r for r in unknown.recommendations if r.rule == "dp_overlap")
    assert rec.step_s_after == was.step_s_after and rec.step_s_after < rec.step_s_before
    assert not any("gloo's threads" in a for a in rec.assumptions), rec.assumptions
    assert not calibrate(spare).workload.shared_cores


def test_shared_cores_price_an_overlapped_dp_reduction_as_a_serial_one():
    """The job of test_exposed_dp_recommends_overlap_priced_by_the_model by hand: 8 layers x 4
    micro-batches x (2 + 4) ms = 192 ms of compute, then 8 buckets of 2e8 B at 25 GB/s busbw
    (2e8 x 2(1/2) / 25e9 = 8 ms each): 256 ms. Overlapped on shared cores: the same 256 ms; overlapped
    with a core to spare, less (the buckets behind the last micro-batch's backward)."""
    w = Workload(num_layers=8, fwd_s_per_layer=2 * MS, grad_bytes=1.6e9)
    serial, overlap = Config(dp=2, num_micro_batches=4, bucket_bytes=1e8), \
        Config(dp=2, num_micro_batches=4, bucket_bytes=1e8, overlap_grad_reduce=True)
    links = Links(dp=25e9)
    assert step_time(w, serial, links) == pytest.approx(256 * MS, rel=1e-9)
    assert step_time(replace(w, shared_cores=True), overlap, links) == pytest.approx(256 * MS, rel=1e-9)
    assert step_time(w, overlap, links) < 250 * MS


def test_the_analyze_command_takes_the_host_facts(tmp_path):
    """--host-cpus, --ranks-per-host and --threads-per-rank reach the run's facts and the advice."""
    out = tmp_path / "d.json"
    r = CliRunner().invoke(main, ["analyze", "sample_traces/dp2_no_overlap", "--format", "json", "-o", str(out),
                                  "--host-cpus", "2", "--ranks-per-host", "2", "--threads-per-rank", "1"])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert {k: d["facts"][k] for k in HOST} == HOST
    assert any(n.startswith("not proposed: overlap the DP gradient all-reduce") for n in d["advice_basis"]["calibration"])


def test_the_analyze_command_takes_the_uneven_split(tmp_path):
    """--decoder-first/last-pipeline-num-layers reach the facts and the memory model: the CPU sample's
    4 layers split 3/1 put a layer more on stage 0 than the even split (its parts against the even's)."""
    def parts(*flags):
        out = tmp_path / f"d{len(flags)}.json"
        r = CliRunner().invoke(main, ["analyze", "sample_traces/pp2_m2", "--format", "json", "-o", str(out), *flags])
        assert r.exit_code == 0, r.output
        d = json.loads(out.read_text())
        return d, {p["stage"]: p for p in d["memory"]["model"]}
    even, even_parts = parts()
    split, split_parts = parts("--decoder-first-pipeline-num-layers", "3", "--decoder-last-pipeline-num-layers", "1")
    assert (split["facts"]["decoder_first_pipeline_num_layers"], split["facts"]["decoder_last_pipeline_num_layers"]) == (3, 1)
    assert "decoder_first_pipeline_num_layers" not in even["facts"] or even["facts"]["decoder_first_pipeline_num_layers"] is None
    layer = split_parts[0]["weights"] - even_parts[0]["weights"]          # one layer's weights moved to stage 0
    assert layer > 0 and even_parts[1]["weights"] - split_parts[1]["weights"] == pytest.approx(layer)
    assert any("layers per pipeline stage 3/1" in n for n in split["advice_basis"]["calibration"])


def test_imbalanced_stages_recommend_moving_layers(tmp_path):
    """p=2, 8 layers, stage 1 computes 1.5x: in units of stage 0's layer, 4 vs 6 = 4 layers + 2 extra.
    Minimising max(n0, n1 + 2) with n0 + n1 = 8 gives 5 / 3 (5 vs 5)."""
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS)
    d = job(tmp_path, w, Config(pp=2, num_micro_batches=8), Links(), stage_slowdown={1: 1.5})
    rec = next(r for r in d.recommendations if r.rule == "rebalance")
    assert rec.flags == {"--decoder-first-pipeline-num-layers": "5", "--decoder-last-pipeline-num-layers": "3"}
    assert rec.evidence[0].value == pytest.approx(1.5, rel=1e-3)
    assert rec.runnable      # the trainer runs uneven first/last stages (issue #18)
    # its peak memory, by hand (the synthetic job's shape: h 4096, f 16384, a 32, s 2048, V 50304, bf16
    # + Adam 18 B a parameter, 1F1B): stage 0 with 5 layers, (5 x 12 h^2 + V h) = 1,212,678,144
    # parameters, and 2 micro-batches in flight of s b h (34 + 5 a s / h) = 956,301,312 B a layer
    assert rec.memory_after_bytes == 1_212_678_144 * 18 + 5 * 2 * 956_301_312 == 31_391_219_712
    assert rec.memory_before_bytes == (4 * 201_326_592 + 206_045_184) * 18 + 4 * 2 * 956_301_312


def test_rebalance_starts_from_the_runs_own_uneven_split(tmp_path):
    """The run already splits 6/2 (diag_run.json's decoder_first/last_pipeline_num_layers) and its
    stage 0 computes 1.5x stage 1: per layer 1 unit on stage 0 (6 / 6), stage 1's 4 units are its 2
    layers and 2 units more (the loss). min max(n0, n1 + 2) gives 5/3, not the 3/5 an even 4/4
    reading of the same compute would give (4 units a layer... stage 0's 2 "extra")."""
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS)
    c = Config(pp=2, num_micro_batches=8)
    write_job(simulate(w, c, Links(), steps=4, stage_slowdown={0: 1.5}), str(tmp_path), c, w)
    path = os.path.join(str(tmp_path), "diag_run.json")
    with open(path, "rb") as f:
        facts = runmeta.decode(f.read())
    runmeta.write(path, msgspec.structs.replace(facts, decoder_first_pipeline_num_layers=6,
                                                decoder_last_pipeline_num_layers=2))
    d = with_advice(diagnose(load_job(str(tmp_path))))
    rec = next(r for r in d.recommendations if r.rule == "rebalance")
    assert rec.flags == {"--decoder-first-pipeline-num-layers": "5", "--decoder-last-pipeline-num-layers": "3"}
    assert rec.title == "layers per stage 5/3 instead of 6/2"
    # the memory model holds the run's split: stage 0 had 6 layers, now 5 (one layer's 12 h^2 x 18 B and
    # 2 x 956,301,312 B of activations less)
    assert rec.memory_before_bytes - rec.memory_after_bytes == 201_326_592 * 18 + 2 * 956_301_312
    assert "layers per pipeline stage 6/2 (the run's uneven split)" in d.advice_basis.calibration
    # a change of the stages (interleaving) prices, and re-runs, an even split
    il = next(r for r in d.recommendations if r.rule == "interleave")
    assert il.flags["--decoder-first-pipeline-num-layers"] is None and any("split evenly" in a for a in il.assumptions)


def test_straggler_named_with_what_to_check(tmp_path):
    """Rank 1 of DP=2 starts each step 20 ms late: the other waits ~20 ms per step in the all-reduce."""
    w = Workload(num_layers=4, fwd_s_per_layer=5 * MS, grad_bytes=1e8)
    d = job(tmp_path, w, Config(dp=2, num_micro_batches=2), Links(dp=100e9), rank_delay={1: 20 * MS})
    rec = next(r for r in d.recommendations if r.rule == "straggler")
    assert "rank 1" in rec.title and rec.checks
    assert rec.evidence[0].value == pytest.approx(20.0, rel=0.05)           # ms/step


def test_the_straggler_wait_is_taken_off_as_its_share_of_the_steps_it_was_measured_in(tmp_path):
    """The wait is measured in the traced steps; the predictions start from the step the calibration
    gives (on the trainer's CPU runs the untraced steps', shorter). The upper bound takes the wait's
    share of the traced step off that step, so both are on one basis: with the synthetic job's window
    step W and wait w (~20 ms) and a step of 0.6 W to start from, after = 0.6 W (1 - w / W), said in
    an assumption; where the two steps agree, after = step - w and nothing more is said."""
    from diag.advise.calibrate import window_step
    from diag.advise.propose import Context
    from diag.advise.rules import straggler
    w = Workload(num_layers=4, fwd_s_per_layer=5 * MS, grad_bytes=1e8)
    d = job(tmp_path, w, Config(dp=2, num_micro_batches=2), Links(dp=100e9), rank_delay={1: 20 * MS})
    traced = window_step(d)
    same = next(r for r in straggler(Context(d=d, cal=None, step_s=traced)))
    wait = same.evidence[0].value * 1e-3
    assert same.step_s_after == pytest.approx(traced - wait, rel=1e-9)
    assert not any("traced steps" in a for a in same.assumptions)
    rec = next(r for r in straggler(Context(d=d, cal=None, step_s=0.6 * traced)))
    assert rec.evidence[0].value == same.evidence[0].value          # the measured wait, as measured
    assert rec.step_s_after == pytest.approx(0.6 * traced * (1 - wait / traced), rel=1e-9)
    assert rec.gain == pytest.approx(wait / traced, rel=1e-9)
    assert any(a.startswith(f"the wait is {wait / traced:.1%} of the traced steps") for a in rec.assumptions)


def test_balanced_job_gets_no_recommendation(tmp_path):
    """One rank, no communication, no idle: nothing to win, and the advice says so."""
    d = job(tmp_path, Workload(num_layers=4, fwd_s_per_layer=2 * MS), Config(num_micro_batches=2), Links())
    a = advise(d)
    assert a.recommendations == [] and "nothing worth changing" in a.nothing


def test_real_straggler_trace():
    """dlrm 4 ranks: the others wait 1,008.8 ms per step for rank 2 (the analyser's finding) over the
    window's steps (1,057 and 1,172 ms: mean 1,113.3 ms), 90.6% of them; taken off the run's step
    (1,056.6 ms, the median of every ProfilerStep): 99.2 ms, not the 47.8 ms of the two subtracted."""
    from diag.advise.calibrate import window_step
    d = with_advice(diagnose(load_job("tests/data/dlrm_4_ranks_alltoall")))
    top = d.recommendations[0]
    wait = next(f for f in d.findings if f.what == "waiting for rank 2")
    assert top.rule == "straggler" and "rank 2" in top.title
    assert window_step(d) == pytest.approx((1.057 + 1.172 + 1.057 + 1.172 + 1.057 + 1.162 + 1.056 + 1.173) / 8, abs=2e-3)
    share = wait.seconds_per_step / window_step(d)
    assert top.step_s_after == pytest.approx(d.throughput.step_time_s * (1 - share), rel=1e-9)
    assert top.step_s_after == pytest.approx(0.0992, abs=1e-3)
    assert not any(r.rule == "micro_batch" for r in d.recommendations)   # idle explained by the straggler


def test_a_wait_of_a_whole_step_predicts_no_step():
    """A straggler's wait no shorter than the steps it was measured in leaves no step to predict: no
    step after, never a negative one (dp2_no_overlap's summed waits once gave 201.4 -> -45.0 ms)."""
    from diag.advise.calibrate import window_step
    d = with_advice(diagnose(load_job("tests/data/dlrm_4_ranks_alltoall")))
    wait = next(f for f in d.findings if f.what == "waiting for rank 2")
    wait.seconds_per_step = window_step(d)
    rec = next(r for r in advise(d).recommendations if r.rule == "straggler")
    assert rec.step_s_after is None and not rec.upper_bound


def test_sample_trace_recommendations_and_no_model_without_metadata():
    d = with_advice(diagnose(load_job("sample_traces/dp2_no_overlap")))
    over = next(r for r in d.recommendations if r.rule == "dp_overlap")
    assert "--overlap-grad-reduce" in over.command and "--out sample_traces/dp2_no_overlap-dp_overlap" in over.command
    a = advise(with_advice(diagnose(load_job("tests/data/a100_single_ns_resolution"))))
    assert "cannot calibrate" in a.calibration[0]


def test_rerun_command_sets_flags():
    cmd = "python -m instrumented_trainer --nproc 2 --micro-batch-size 8 --overlap-grad-reduce --out runs/x"
    assert rerun_command(cmd, {"--micro-batch-size": "2", "--overlap-grad-reduce": None}, "bubble") == \
        "python -m instrumented_trainer --nproc 2 --micro-batch-size 2 --out runs/x-bubble"
    assert rerun_command(cmd, {"--ddp-bucket-size": "100"}, "b").endswith("--ddp-bucket-size 100 --out runs/x-b")
    assert rerun_command(None, {"--x": "1"}, "b") is None


def test_cli_recommend_json_and_bad_path(tmp_path):
    r = CliRunner().invoke(main, ["recommend", "tests/data/dlrm_4_ranks_alltoall", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["recommendations"][0]["rule"] == "straggler"
    r = CliRunner().invoke(main, ["recommend", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "error" in r.output


def test_interleaving_is_simulated_and_prices_the_extra_messages(tmp_path):
    """p=2, m=2 of micro-batch 1 (nothing to split), 8 layers: the bubble is 1/3 of the step. The
    interleaved schedule is simulated, not estimated: its prediction equals the model's own step
    for v virtual stages, (m + (p-1)/v)(tf+tb) plus v-fold pipeline messages on a slow PP link."""
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS, p2p_bytes=ACT)
    c = Config(pp=2, num_micro_batches=2, micro_batch_size=1)
    links = Links(pp=100e9)
    d = job(tmp_path, w, c, links)
    (rec,) = [r for r in d.recommendations if r.rule == "interleave"]
    v = int(rec.title.split(" with ")[1].split()[0])
    assert rec.flags == {"--pipeline-schedule": "interleaved-1f1b",
                         "--num-layers-per-virtual-pipeline-stage": str(4 // v)}
    assert rec.runnable                                   # the trainer runs it (issue #18)
    truth = step_time(w, Config(pp=2, num_micro_batches=2, micro_batch_size=1, schedule="interleaved",
                                virtual_stages=v), links)
    assert rec.step_s_after == pytest.approx(truth, rel=1e-3)
    free = step_time(w, Config(pp=2, num_micro_batches=2, schedule="interleaved", virtual_stages=v), Links())
    assert truth > free                                   # the extra messages are priced, not ignored
    assert free == pytest.approx((2 + 1 / v) * 3 * 4 * MS, rel=1e-9)


def test_full_recompute_that_memory_does_not_need_is_turned_off(tmp_path):
    """Full recompute on a model that fits an 80 GB H100 without it: the rule proposes removing
    --recompute-granularity, priced by the model as one forward per micro-batch less per layer:
    step = m x L x (f + 2f + f) = 2 x 8 x 8 ms = 128 ms; without the recomputed forward 96 ms (-25%)."""
    w = Workload(num_layers=8, fwd_s_per_layer=2 * MS, recompute="full")
    c = Config(pp=1, num_micro_batches=2, micro_batch_size=1)
    d = job(tmp_path, w, c, Links())
    (rec,) = [r for r in d.recommendations if r.rule == "recompute"]
    assert rec.flags == {"--recompute-granularity": None} and rec.title == "no activation recompute"
    assert d.throughput.step_time_s == pytest.approx(2 * 8 * 2 * MS * 4, rel=1e-3)     # m x L x (f + 2f + f)
    assert rec.step_s_after == pytest.approx(2 * 8 * 2 * MS * 3, rel=1e-3)              # the recompute gone
    assert rec.memory_after_bytes > rec.memory_before_bytes and rec.memory_after_bytes < rec.memory_capacity_bytes
    assert "--recompute-granularity" not in (rec.command or "")


def test_recompute_on_a_gpu_that_waits_on_the_host_is_priced_by_the_traced_step_it_became():
    """sample_traces/h200_recompute: one rank on an H200, full recompute, the GPU idle 80% of the step
    between its kernels; variants/no_recompute is the same job without it (bench_tune's first pair).
    The launch overhead is the idle over the modelled kernels, a recomputed forward's two among them
    (6 a layer and micro-batch, not 4): so read, it is the same in both runs (1.59 and 1.53 ms; 2.38
    against 1.53 counted over 4), the model holds the measured step, and removing the recompute, one
    forward with its two launches a layer and micro-batch less, is priced at the step the variant's
    trace measured (131.1 against 131.9 ms: -31.4%)."""
    before = calibrate(diagnose(load_job("sample_traces/h200_recompute")))
    after = calibrate(diagnose(load_job("sample_traces/h200_recompute/variants/no_recompute")))
    assert before.workload.recompute == "full" and after.workload.recompute == "none"
    assert before.workload.launch_overhead_s == pytest.approx(after.workload.launch_overhead_s, rel=0.05)
    assert before.model_step_s == pytest.approx(before.measured_step_s, rel=0.02)
    priced = before.predict(before.config, replace(before.workload, recompute="none"))
    assert priced == pytest.approx(after.measured_step_s, rel=0.02)
    d = with_advice(diagnose(load_job("sample_traces/h200_recompute")))
    (rec,) = [r for r in d.recommendations if r.rule == "recompute"]
    assert rec.step_s_after == pytest.approx(priced, rel=1e-9)
    with open("sample_traces/h200_recompute/variants/no_recompute/steps.jsonl") as f:
        peak = max(json.loads(line)["peak_memory_bytes"] for line in f)
    assert rec.memory_after_bytes == pytest.approx(peak, rel=0.05)
    # kernels of 77.8 us median, but idle 80% of the step: the GPU waits on the host (the micro-batch rule's
    # reading), and the run's untraced steps, much shorter, are said: the predictions are of traced steps
    from diag.advise.calibrate import waits_on_host
    idle, med = waits_on_host(d)
    assert med >= 50 and idle >= 0.3
    with open("sample_traces/h200_recompute/diag_run.json") as f:
        untraced = json.load(f)["profile"]["untraced_step_s"]
    said = (f"the run's untraced steps' median {untraced * 1e3:.4g} ms (diag_run.json) is "
            f"{100 * (1 - untraced / before.measured_step_s):.0f}% shorter than the traced step "
            f"{before.measured_step_s * 1e3:.4g} ms: the GPU waits on the host, so torch.profiler's host callbacks")
    assert any(n.startswith(said) for n in before.assumptions)


def test_zero3_that_memory_does_not_need_is_lowered_and_priced(tmp_path):
    """ZeRO-3 (FSDP) at DP 2 on a model that fits an 80 GB H100 replicated: L = 8 layers of 1 GB
    gradients (fp32), 100 GB/s busbw, f = 2 ms. Each layer's all-gather (1e9 x 1/2 / 100e9 = 5 ms)
    outlasts its forward (2 ms) and backward (4 ms), so a pass costs L x 5 ms + its last layer:
    m x (42 + 44) + 5 ms (the last reduce-scatter) = 177 ms. Replicated, with --overlap-grad-reduce,
    the eight 10 ms bucket all-reduces start as the last micro-batch's backward frees them:
    96 - 8 x 4 + 4 + 80 = 148 ms. The rule proposes no sharding, priced by the model, with the
    flags that remove it.
    Its memory: synth's GPT (h 4096, f 16384, V 50304, 8 layers, bf16), a block 4 h^2 + 2 h f =
    201,326,592 parameters, the ends 2 V h = 412,090,368, 2,022,703,104 in all. Replicated holds
    18 B a parameter, ZeRO-3 at DP 2 9 B: 9 x 2,022,703,104 = 18,204,327,936 more; but ZeRO-3 also
    holds its own buffers, which replicated does not: the ends and two blocks gathered in bf16,
    (412,090,368 + 2 x 201,326,592) x 2 = 1,629,487,104, and (m = 2, one in flight) every unsharded
    gradient until the deferred reduce-scatter, 2,022,703,104 x 4 = 8,090,812,416. The change of
    peak: 18,204,327,936 - 9,720,299,520 = 8,484,028,416 B."""
    w = Workload(num_layers=8, fwd_s_per_layer=2 * MS, grad_bytes=8e9)
    c = Config(dp=2, num_micro_batches=2, zero=3, overlap_grad_reduce=True, bucket_bytes=5e8)
    links = Links(dp=100e9)
    assert step_time(w, c, links) == pytest.approx(177 * MS, rel=1e-9)
    d = job(tmp_path, w, c, links)
    cal = calibrate(d)
    assert cal.config.zero == 3 and cal.workload.grad_bytes == pytest.approx(8e9, rel=1e-6)
    assert cal.links.dp == pytest.approx(100e9, rel=1e-3)
    assert cal.measured_step_s == pytest.approx(177 * MS, rel=1e-3)
    (rec,) = [r for r in d.recommendations if r.rule == "zero_down"]
    assert rec.title == "replicated data parallelism instead of ZeRO-3"
    assert rec.flags == {"--data-parallel-sharding-strategy": None, "--use-distributed-optimizer": None}
    assert rec.step_s_after == pytest.approx(148 * MS, rel=1e-3)
    assert rec.step_s_after == pytest.approx(step_time(w, Config(dp=2, num_micro_batches=2, overlap_grad_reduce=True,
                                                                 bucket_bytes=5e8), links), rel=1e-3)
    assert rec.memory_before_bytes < rec.memory_after_bytes <= rec.memory_capacity_bytes
    assert rec.memory_after_bytes - rec.memory_before_bytes == pytest.approx(8_484_028_416, rel=1e-12)


def test_zero_bubble_schedule_is_simulated(tmp_path):
    """p = 2, m = 2 micro-batches of 2, 8 layers (4 a stage), f = 1 ms per layer: 1F1B takes
    (m + p - 1) x 3 x 4 ms = 36 ms (bubble 1/3); ZB1P 3m x 4 + (p - 1) x 4 = 28 ms, its weight
    gradients filling the waits (tests/test_model.py works it step by step)."""
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS, p2p_bytes=1.0)
    c = Config(pp=2, num_micro_batches=2, micro_batch_size=2)
    d = job(tmp_path, w, c, Links(pp=1e15))
    assert d.throughput.step_time_s == pytest.approx(36 * MS, rel=1e-3)
    (rec,) = [r for r in d.recommendations if r.rule == "zero_bubble"]
    # one stage a rank (4 layers), as priced: the trainer's zb1p alone runs two a rank (v = 2)
    assert rec.flags == {"--pipeline-schedule": "zb1p", "--num-layers-per-virtual-pipeline-stage": "4"}
    assert rec.step_s_after == pytest.approx(28 * MS, rel=1e-3)
    assert rec.step_s_after == pytest.approx(step_time(w, Config(pp=2, num_micro_batches=2, micro_batch_size=2,
                                                                 schedule="zb1p"), Links(pp=1e15)), rel=1e-3)
    # the last stage holds its deferred weight-gradient pass's micro-batch too: 2 in flight, not 1
    from dataclasses import replace
    from diag.advise.memory import of_diagnosis, rank_estimate
    model, lay, _, _ = of_diagnosis(d)
    zb = replace(lay, schedule="zb1p")
    assert [rank_estimate(model.shape, lay, s).in_flight for s in (0, 1)] == [2, 1]
    assert [rank_estimate(model.shape, zb, s).in_flight for s in (0, 1)] == [2, 2]
    assert rec.memory_before_bytes == model.peak(lay).total
    assert rec.memory_after_bytes == model.peak(zb).total > rec.memory_before_bytes
    assert "--pipeline-schedule zb1p --num-layers-per-virtual-pipeline-stage 4" in rec.command
    # a GPU timeline whose kernels never wait on the host: the split's host time hides behind them, said
    assert any("priced as dear as the fused one: on a GPU its extra is host time" in a for a in rec.assumptions)


def test_schedule_changes_on_a_cpu_timeline_are_low_confidence_and_say_why():
    """The multi-stage pipelining runtime's host work per action beyond its posts is not in the model; on a
    CPU trace the schedule levers say so and are low confidence, whatever the fit (the synthesised GPU
    jobs above keep the fit's confidence)."""
    d = with_advice(diagnose(load_job("sample_traces/tp2_pp2_dp2")))
    recs = {r.rule: r for r in d.recommendations}
    assert {"zero_bubble", "interleave"} <= set(recs)
    for rule in ("zero_bubble", "interleave"):
        assert recs[rule].confidence == "low"
        assert any("that runtime's other host work per action is not priced" in a
                   for a in recs[rule].assumptions)
    assert any("split backward (input, then weight gradients: two autograd passes) priced 14% dearer" in a
               for a in recs["zero_bubble"].assumptions)


def test_schedule_changes_on_a_gpu_that_waits_on_the_host_price_the_split_and_say_the_runtime():
    """sample_traces/h200_pp2_memory: the H200 idles 37% of the step between short kernels; its variants
    measured torch's multi-stage runtime at about twice 1F1B's untraced step (the figures the caveat
    quotes read here from the variants' steps.jsonl: steps 1 and 4 untraced). Where the GPU waits on the
    host the zero-bubble price pays torch's split backward's host time a layer and micro-batch on the
    second stage (calibrate.SPLIT_BACKWARD_HOST_S, measured on an H200): 2 layers x 4 micro-batches x
    1.45 ms, which turns the -3% it was priced at without it into no gain: not proposed, with its price.
    The runtime's caveat stays for the schedule levers that do price a gain on such a GPU."""
    from diag.advise.calibrate import SPLIT_BACKWARD_HOST_S, waits_on_host
    from diag.advise.propose import Context
    from diag.advise.rules import _schedule_caveat, _split_words
    root = "sample_traces/h200_pp2_memory"

    def untraced(path):
        with open(os.path.join(path, "steps.jsonl")) as f:
            rows = {r["step"]: r["step_seconds"] * 1e3 for r in map(json.loads, f)}
        return [rows[1], rows[4]]
    one, multi = untraced(root), untraced(f"{root}/variants/interleaved") + untraced(f"{root}/variants/zb1p")
    assert 62 <= min(one) and max(one) <= 65.5 and 119.5 <= min(multi) and max(multi) <= 126.5
    d = diagnose(load_job(root))
    idle, med = waits_on_host(d)
    assert round(idle, 2) == 0.37 and round(med, 1) == 43.5
    cal = calibrate(d)
    c, w = cal.config, cal.workload
    assert (c.pp, c.num_micro_batches, w.num_layers, c.schedule) == (2, 4, 4, "1f1b")
    assert w.split_backward_host_s == SPLIT_BACKWARD_HOST_S and w.split_backward_extra == 0
    zb = replace(c, schedule="zb1p")
    priced, unpriced = cal.predict(zb), cal.predict(zb, replace(w, split_backward_host_s=0.0))
    assert unpriced < cal.measured_step_s < priced
    # stage 1's backward pays 2 layers x 4 micro-batches of it; its waits absorb none of it
    assert priced - unpriced == pytest.approx(2 * 4 * SPLIT_BACKWARD_HOST_S, rel=0.35)
    a = advise(d)
    assert "zero_bubble" not in {r.rule for r in a.recommendations}
    said = (f"not proposed: the zero-bubble schedule (ZB1P) instead of 1F1B "
            f"({100 * (priced / cal.measured_step_s - 1):+.1f}% predicted: no faster); pipeline bubble")
    assert any(line.startswith(said) for line in a.calibration)
    ctx = Context(d=d, cal=cal, step_s=cal.measured_step_s)
    assert _split_words(ctx).startswith("torch's split backward (input, then weight gradients: two autograd passes) "
                                        "priced 1.45 ms of host time a layer and micro-batch over the fused one on "
                                        "every stage past the first, paid in full: the GPU waits on the host (37% "
                                        "idle between kernels of 43.5 us median)")
    caveat = _schedule_caveat(ctx)
    assert caveat.startswith("the GPU waits on the host (37% idle between kernels of 43.5 us median)")
    assert "120-126 ms a step" in caveat and "62-65 ms under 1F1B" in caveat


def test_a_loss_whose_every_change_prices_no_gain_is_said_not_dropped():
    """sample_traces/h200_tp2_sp_zero3 (TP 2 x ZeRO-3 DP 2, four ranks on one H200, NCCL over sockets):
    exposed TP communication is 74% of the step, and the tp_layout rule's candidates (TP 1 x PP 2,
    TP 1 x DP 4) both price slower, ZeRO-3's all-gathers at its measured 0.7 GB/s growing with the
    unsharded layer. The advice said "nothing worth changing: no measured loss crossed a rule's
    threshold, or ..."; it now names the change, its price (the model's, recomputed here) and the
    evidence that called for it."""
    d = diagnose(load_job("sample_traces/h200_tp2_sp_zero3"))
    a = advise(d)
    assert a.recommendations == [] and "measured losses crossed rules' thresholds" in a.nothing
    cal = calibrate(d)
    c = cal.config
    assert (c.tp, c.pp, c.dp, c.num_micro_batches) == (2, 1, 2, 2)
    prices = {"TP 1 x PP 2 x DP 2": cal.predict(replace(c, tp=1, pp=2), None, {}),
              "TP 1 x PP 1 x DP 4": cal.predict(replace(c, tp=1, dp=4, num_micro_batches=1), None, {})}
    best = min(prices, key=prices.get)
    assert prices[best] > a.measured_step_s
    exposed = next(x for x in d.comm.axes if x.axis == "tp").exposed_per_step_s
    assert exposed > 0.7 * a.measured_step_s
    want = (f"not proposed: {best} instead of TP 2 x PP 1 x DP 2 ({100 * (prices[best] / a.measured_step_s - 1):+.1f}% "
            f"predicted: no faster); exposed TP communication = {exposed * 1e3:.3g} ms/step (threshold "
            f"{0.1 * a.measured_step_s * 1e3:.3g} ms/step)")
    assert want in a.calibration


def test_a_change_priced_under_two_percent_is_said_with_its_price():
    """dlrm 4 ranks (fp32): the fp32 GEMMs are 59.8% of compute kernel time, over the 30% threshold;
    bf16 is priced at -1.1%, under the 2% a re-run is worth: said, not proposed."""
    d = diagnose(load_job("tests/data/dlrm_4_ranks_alltoall"))
    a = advise(d)
    assert not any(r.rule == "bf16" for r in a.recommendations)
    note = next(n for n in a.calibration if n.startswith("not proposed: bf16 mixed precision"))
    pct = float(note.split("(")[1].split("%")[0])
    assert -2.0 < pct < 0.0
    assert note.endswith("predicted: under the 2% a re-run is worth); fp32 GEMM share of compute kernel time, "
                         "rank 0 = 59.8% (threshold 30.0%)")


def test_idle_between_long_kernels_is_said_as_waiting_on_the_host_not_launches():
    """sampled_2_of_128_ranks (HTA's test data, not ours): 53.5% GPU idle between compute kernels
    whose median (mean duration of the top ones) is 2.2 ms. The rule fires on its waiting-on-the-host
    threshold (30%), not the launch-bound one (10%, kernels under 50 us), and says so: its evidence
    names 30%, its why does not blame launches, and it says where to look. The MI250 trace's 8 us
    kernels keep the launch-bound reading. Neither knows the tokens per step: no tokens/s is printed."""
    from diag.advise.rules import SHORT_KERNEL_US, WAITING_HOST_MIN, IDLE_MIN
    from diag.report.advice import rec_lines
    for path, long_kernels in (("tests/data/sampled_2_of_128_ranks", True), ("tests/data/mi250_rocm_single", False)):
        d = with_advice(diagnose(load_job(path)))
        rec = next(r for r in d.recommendations if r.rule == "micro_batch")
        idle, kernels = rec.evidence[0], rec.evidence[1]
        med = sorted(k.mean_us for r in d.ranks for k in r.top_kernels if k.kind == "compute")
        assert kernels.value == pytest.approx(med[len(med) // 2])
        assert (kernels.value >= SHORT_KERNEL_US) is long_kernels
        assert idle.threshold == (WAITING_HOST_MIN if long_kernels else IDLE_MIN)
        assert idle.value >= idle.threshold
        assert ("not on launches" in rec.why) is long_kernels and bool(rec.checks) is long_kernels
        assert rec.tokens_per_s_before is None
        text = "\n".join(rec_lines(1, rec))
        assert "tokens/s" not in text and f"(threshold {100 * idle.threshold:.1f}%)" in text


def test_a_change_paired_with_sequence_parallelism_is_priced_with_it(tmp_path):
    """The CPU sample on a 6 MiB device: interleaving fits only with sequence parallelism (torch's DTensor
    plan, what the trainer runs: its saving counted as that plan keeps it) and ZeRO-1, and its step is
    priced with both (model.sp_costs). Over gloo, the run's backend, SP's reduce-scatters run as whole
    all-reduces and its norm reductions pay the run's small TP call: interleaving is then no faster, so
    it is dropped, and said so; without SP's price it would have been proposed. Over NCCL it is kept, at
    the model's price of the layout with SP and ZeRO-1, saying how SP was priced."""
    from diag.advise.propose import MIN_GAIN, SP_TIME
    out = tmp_path / "d.json"
    r = CliRunner().invoke(main, ["analyze", "sample_traces/tp2_pp2_dp2", "--format", "json", "-o", str(out),
                                  "--memory-per-gpu", "0.006"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    recs = {x["rule"]: x for x in doc["recommendations"]}
    assert "interleave" not in recs
    assert ("dropped, does not fit: interleaved 1F1B with 2 virtual stages per rank (1 layer each), with sequence "
            "parallelism and ZeRO-1 to fit: with sequence parallelism and ZeRO-1 it is no longer faster"
            in doc["advice_basis"]["calibration"])
    assert SP_TIME not in recs["tp_layout"]["assumptions"]          # TP 1: no SP to add
    d = diagnose(load_job("sample_traces/tp2_pp2_dp2"), shape={"memory_per_gpu_bytes": int(0.006 * 2**30)})
    cal = calibrate(d)
    il = replace(cal.config, schedule="interleaved", virtual_stages=2, zero=1)
    assert cal.predict(il) < cal.measured_step_s * (1 - MIN_GAIN)     # proposed, were SP free
    assert cal.predict(replace(il, sequence_parallel=True)) > cal.measured_step_s * (1 - MIN_GAIN)
    d.facts = msgspec.structs.replace(d.facts, backend="nccl")
    nccl = with_advice(d)
    rec = next(x for x in nccl.recommendations if x.rule == "interleave")
    assert rec.title.endswith("with sequence parallelism and ZeRO-1 to fit")
    assert rec.flags["--sequence-parallel"] == "" and SP_TIME in rec.assumptions
    assert rec.step_s_after == pytest.approx(calibrate(d).predict(replace(il, sequence_parallel=True)), rel=1e-9)
