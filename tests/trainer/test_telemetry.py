"""Telemetry leaves the evidence the analyser needs, and never breaks training.

End to end: a profiled 2x2x2 run writes per-rank gzipped traces with ProfilerStep#N and the
diag:comm:<axis>:<op>:<bytes> labels, comm and metrics logs, steps.jsonl and diag_run.json, and
computes the same losses as the unprofiled reference. Failure cases: missing NVML, an
unwritable output directory, and a profiler that fails at start, at step and at export.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys

import pytest

from instrumented_trainer.telemetry import safe
from instrumented_trainer.telemetry.metrics import HostSource, MetricsSampler, open_source
from instrumented_trainer.telemetry.profiler import ProfilerSession
from instrumented_trainer.config import TelemetryConfig

from .runner import assert_ok, run_trainer

RUN_KEYS = {"schema_version", "tp", "pp", "dp", "world_size", "micro_batch_size",
            "num_micro_batches", "global_batch_size", "seq_length", "num_layers", "hidden_size",
            "num_attention_heads", "vocab_size", "ffn_hidden_size", "parameter_count", "dtype",
            "device_name", "peak_flops", "pipeline_schedule", "overlap_grad_reduce",
            "torch_version", "backend", "backend_version", "command", "profile"}


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    run = run_trainer(tmp_path_factory.mktemp("profiled"), 8, "--tensor-model-parallel-size",
                      "2", "--pipeline-model-parallel-size", "2", "--overlap-grad-reduce",
                      "--train-iters", "4", "--profile-wait", "1", "--profile-warmup", "1",
                      "--profile-active", "1", "--metrics-interval", "0.2", "--comm-log")
    assert_ok(run)
    return run


@pytest.mark.slow
def test_profiled_run_writes_traces_with_labels(profiled_run):
    for rank in range(8):
        path = profiled_run.out / f"rank-{rank}.pt.trace.json.gz"
        trace = json.loads(gzip.decompress(path.read_bytes()))
        names = {e.get("name", "") for e in trace["traceEvents"]}
        assert "ProfilerStep#2" in names
        labels = {n for n in names if n.startswith("diag:comm:")}
        assert all(re.fullmatch(r"diag:comm:(tp|pp|dp):[a-z_]+:\d+", n) for n in labels)
        axes = {n.split(":")[2] for n in labels}
        assert {"tp", "pp"} <= axes, axes
        assert trace["distributedInfo"]["rank"] == rank
    dp_labels = json.loads(gzip.decompress((profiled_run.out / "rank-6.pt.trace.json.gz")
                                           .read_bytes()))
    assert any(e.get("name", "").startswith("diag:comm:dp:all_reduce:")
               for e in dp_labels["traceEvents"])


@pytest.mark.slow
def test_profiled_run_writes_logs_and_metadata(profiled_run, reference_losses):
    meta = json.loads((profiled_run.out / "diag_run.json").read_text())
    assert RUN_KEYS <= meta.keys()
    assert (meta["tp"], meta["pp"], meta["dp"], meta["num_micro_batches"]) == (2, 2, 2, 2)
    assert meta["backend"] == "gloo" and meta["dtype"] == "fp32" and meta["peak_flops"] is None
    assert "--overlap-grad-reduce" in meta["command"].split()
    # the host's cores as rank 0 sees them (its affinity), the 8 local ranks, one intra-op thread each
    assert (meta["host_cpus"], meta["ranks_per_host"], meta["threads_per_rank"]) == \
        (len(os.sched_getaffinity(0)), 8, 1)
    # what a gradient left partial over TP costs rank 0's optimizer, timed at start-up (sequence parallelism's price)
    assert 0 < meta["sp_grad_sync_s"] < 60 and meta["tp_latency_s"] is None     # the older probe: no longer run
    for rank in range(8):
        comm = [json.loads(x) for x in
                (profiled_run.out / f"comm-rank-{rank}.jsonl").read_text().splitlines()]
        keys = {"op", "axis", "group_ranks", "bytes", "start", "duration"}
        assert comm and keys <= comm[0].keys()
        metrics = (profiled_run.out / f"metrics-rank-{rank}.jsonl").read_text().splitlines()
        assert json.loads(metrics[0])["source"] == "host"
    losses = profiled_run.losses()  # telemetry does not change what is computed
    assert losses == pytest.approx(reference_losses[:4], rel=1e-5)


@pytest.mark.slow
def test_unwritable_output_directory_does_not_stop_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    run = run_trainer(blocker / "out", 1, "--train-iters", "3", "--profile-wait", "0",
                      "--profile-warmup", "0", "--profile-active", "1")
    assert_ok(run)
    assert len(re.findall(r"^step +\d+/3", run.stdout, re.M)) == 3
    assert "warning: telemetry" in run.stderr


def test_missing_nvml_falls_back_to_host_metrics(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were not installed
    safe.failures.clear()
    source = open_source(prefer_gpu=True, device_index=0)
    assert isinstance(source, HostSource)
    assert safe.failures["nvml metrics (falling back to host metrics)"] == 1


def test_nvml_without_driver_falls_back(tmp_path):
    pytest.importorskip("pynvml")
    with MetricsSampler(str(tmp_path / "m.jsonl"), 0, 0.05, prefer_gpu=True) as sampler:
        pass
    assert sampler.source is not None  # NVML on a GPU machine, psutil here
    assert (tmp_path / "m.jsonl").read_text().strip()


class _Boom(RuntimeError):
    pass


def _failing_factory(**kwargs):
    raise _Boom("profiler cannot start")


class _FailingStepProfiler:
    def __init__(self, **kwargs):
        self.stopped = False

    def __enter__(self):
        return self

    def step(self):
        raise _Boom("profiler step failed")

    def __exit__(self, *exc):
        self.stopped = True


@pytest.mark.parametrize("factory", [_failing_factory, _FailingStepProfiler])
def test_profiler_failure_is_one_warning(factory, tmp_path, capsys):
    safe.failures.clear()
    cfg = TelemetryConfig(out=str(tmp_path))
    with ProfilerSession(cfg, rank=0, cuda=False, factory=factory) as prof:
        for _ in range(3):
            prof.step()  # must not raise
    assert sum(safe.failures.values()) == 1
    assert capsys.readouterr().err.count("warning: telemetry") == 1


def test_profiler_export_failure_is_one_warning(tmp_path, capsys):
    import torch

    safe.failures.clear()
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    cfg = TelemetryConfig(out=str(blocker / "out"), profile_wait=0, profile_warmup=0,
                          profile_active=1)
    with ProfilerSession(cfg, rank=0, cuda=False) as prof:
        for _ in range(2):
            torch.ones(4).sum()
            prof.step()
    assert safe.failures["profiler export"] == 1
    assert prof.exported is None


def test_comm_log_does_not_keep_collectives_waited_elsewhere(tmp_path):
    """A collective waited inside c10d (FSDP2's all-gathers and reduce-scatters: the tap never
    sees their wait) is logged with an unknown duration, and its tensors are freed when the
    caller drops them: the log held each one's Work (which holds its output and input) until the
    next step's flush, so the trainer measured ZeRO-3's peak with every all-gather output of the
    step alive (docs/trainer.md). Real gloo, one rank, the profiler's allocation counter: after
    4 MiB in and 4 MiB out are dropped, less than one of them is still allocated (8 MiB before
    the fix). A collective waited through the tap keeps its duration."""
    from .runner import run_workers

    (rec,) = run_workers("tests.trainer.tap_worker", tmp_path, 1)
    assert rec["allocated_after"] < 4 * (1 << 20), rec["allocated_after"]
    by_op = {r["op"]: r for r in rec["records"]}
    assert by_op["all_gather"]["duration"] is None and by_op["all_gather"]["bytes"] == 4 * (1 << 20)
    assert by_op["all_reduce"]["duration"] is not None and by_op["all_reduce"]["duration"] > 0
    # a coalesced batch (NCCL): its ops timed by the batch's Work; a Work-less op alone: unknown
    assert by_op["send"]["duration"] > 0 and by_op["recv"]["duration"] > 0
    assert by_op["broadcast"]["duration"] is None


def test_the_sp_gradient_probe_times_the_optimizers_own_path(tmp_path):
    """The start-up probe of what a gradient left Partial over TP costs the optimizer (sequence parallelism's
    norms, run_metadata.sp_grad_sync), on two real gloo ranks: an optimizer that sleeps 4 ms per partial
    gradient reads 4 ms a parameter (sleep never returns early; the bound above allows a loaded machine's
    late wake-ups, 12 ms each, and is still under the 32 ms the step's 8 parameters would read undivided);
    the trainer's AdamW reads more than nothing, its step reducing each partial gradient
    once per read (3: lerp_, and addcmul_'s two operands); a TP mesh of one rank, and an optimizer that
    cannot be built, give None (the latter with a warning), and the process goes on."""
    from .runner import run_workers

    for rec in run_workers("tests.trainer.sp_sync_worker", tmp_path, 2):
        assert rec["sleep_s"] <= rec["sleeper"] < rec["sleep_s"] + 12e-3, rec
        assert rec["adamw"] > 0 and rec["adamw_reductions"] == 3, rec
        assert rec["tp1"] is None and rec["broken"] is None, rec


def test_the_tap_runs_only_in_the_steps_that_need_it(tmp_path):
    """Without the comm log or the live exporter, the dispatch tap (one Python call per op) runs
    only in the profiler's warmup and active steps, whose trace it labels: real gloo, one rank,
    six steps with an all-reduce each, the tap switched on for steps 2 and 3. The log saw exactly
    those steps' collectives (with their durations), no dispatch mode was active in the others or
    after the switch closed, and the Works the tap held strongly were let go when it went off."""
    from .runner import run_workers

    (rec,) = run_workers("tests.trainer.tapswitch_worker", tmp_path, 1)
    assert rec["modes"] == [None, None, rec["tap_class"], rec["tap_class"], None, None, None]
    assert [(r["step"], r["op"], r["axis"]) for r in rec["records"]] == [(2, "all_reduce", "dp"),
                                                                         (3, "all_reduce", "dp")]
    assert all(r["duration"] > 0 for r in rec["records"])
    assert rec["held_at_exit"] == []


def test_the_default_run_labels_its_trace_without_a_comm_log(tmp_path):
    """The trainer's defaults (profiler on, no comm log): no comm-rank file, and the profiled
    steps' collectives still carry their diag:comm labels in the trace."""
    from .runner import assert_ok, run_trainer

    run = run_trainer(tmp_path / "run", 2, "--tensor-model-parallel-size", "2", "--train-iters", "4",
                      "--profile-wait", "1", "--profile-warmup", "1", "--profile-active", "1", "--no-metrics")
    assert_ok(run)
    assert not list(run.out.glob("comm-rank-*.jsonl"))
    with gzip.open(run.out / "rank-0.pt.trace.json.gz") as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    assert any(n.startswith("diag:comm:tp:all_reduce:") for n in names), sorted(names)[:20]


def test_untraced_median_leaves_out_the_traced_the_export_and_the_first_step():
    from instrumented_trainer.telemetry.steps import StepLog

    log = StepLog("/nonexistent", False, 1, 9)
    for step, seconds in enumerate([9.0, 1.0, 7.0, 7.0, 7.0, 3.0, 2.0, 4.0, 5.0]):
        log.record(step, 0.0, seconds)
    assert log.untraced_median(range(2, 4)) == 3.0      # traced 2-3, export 4: steps 1, 5-8 (1, 3, 2, 4, 5)
    assert log.untraced_median(range(0)) == 4.5         # no profiler: steps 1-8 (1, 7, 7, 7, 3, 2, 4, 5)
    assert StepLog("/nonexistent", False, 1, 1).untraced_median(range(0)) is None


def test_the_run_says_its_untraced_steps_median(tmp_path):
    """diag_run.json's profile.untraced_step_s is the median of the steps outside the profiler's
    warmup and active steps and the export step, the first left out (one rank: steps.jsonl's own)."""
    run = run_trainer(tmp_path / "run", 1, "--train-iters", "8", "--profile-wait", "1", "--profile-warmup", "1",
                      "--profile-active", "1", "--no-metrics")
    assert_ok(run)
    profile = json.loads((run.out / "diag_run.json").read_text())["profile"]
    rows = [json.loads(x) for x in (run.out / "steps.jsonl").read_text().splitlines()]
    untraced = sorted(r["step_seconds"] for r in rows if r["step"] >= 4)      # traced 1-2, export 3
    assert len(untraced) == 4 and profile["untraced_step_s"] == pytest.approx((untraced[1] + untraced[2]) / 2,
                                                                              rel=1e-12)
