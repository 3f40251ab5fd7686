"""Impossible configurations are refused with one line and exit code 2, before any process
starts (the launcher validates without importing torch)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .runner import ROOT

BAD = {
    "world not divisible by tp*pp": (["--nproc", "3", "--tensor-model-parallel-size", "2"],
                                     "world size 3"),
    "heads not divisible by tp": (["--nproc", "2", "--tensor-model-parallel-size", "2",
                                   "--num-attention-heads", "3", "--hidden-size", "63"],
                                  "--num-attention-heads 3"),
    "vocab not divisible by tp": (["--nproc", "2", "--tensor-model-parallel-size", "2",
                                   "--vocab-size", "127"], "--vocab-size 127"),
    "layers not divisible by pp": (["--nproc", "3", "--pipeline-model-parallel-size", "3",
                                    "--num-layers", "4"], "--num-layers 4"),
    "batch not divisible": (["--nproc", "2", "--micro-batch-size", "3",
                             "--global-batch-size", "8"], "--global-batch-size 8"),
    "zero1 with optimizer instances": (["--nproc", "4", "--use-distributed-optimizer",
                                        "--num-distributed-optimizer-instances", "2"],
                                       "--num-distributed-optimizer-instances"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_impossible_configuration_exits_2(case, tmp_path):
    args, fragment = BAD[case]
    # torch is made unimportable: validation must happen before it is needed
    code = ("import sys; sys.modules['torch'] = None; from instrumented_trainer.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-c", code, *args, "--out", str(tmp_path / "o")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines
    assert not (tmp_path / "o").exists()  # nothing started, nothing written


def test_valid_configuration_builds_job():
    from instrumented_trainer.cli import build_parser, job_from_args

    args = build_parser().parse_args(["--tensor-model-parallel-size", "2",
                                      "--pipeline-model-parallel-size", "2"])
    job = job_from_args(args, 8, ["python"])
    assert job.parallel.grid.dp == 2 and job.num_micro_batches == 2
    assert job.model.ffn_hidden_size == 256


@pytest.mark.parametrize("flags", [["--use-distributed-optimizer"],
                                   ["--data-parallel-sharding-strategy", "optim"]])
def test_both_zero1_spellings_are_one_job(flags):
    """Megatron-LM's `--use-distributed-optimizer` and the `optim` sharding strategy are ZeRO-1:
    replicated DP (no FSDP2, no dp_shard axis) with the optimizer states sharded."""
    from instrumented_trainer.cli import build_parser, job_from_args

    job = job_from_args(build_parser().parse_args(flags), 2, ["python"])
    assert job.parallel.use_distributed_optimizer and job.parallel.zero1
    assert not job.parallel.sharded and job.parallel.grid.dp == 2


def test_distributed_optimizer_under_fsdp_is_fsdps_own():
    """With FSDP2 sharding the states are sharded already: no second sharding on top."""
    from instrumented_trainer.cli import build_parser, job_from_args

    args = build_parser().parse_args(["--use-distributed-optimizer",
                                      "--data-parallel-sharding-strategy", "optim_grads"])
    job = job_from_args(args, 2, ["python"])
    assert job.parallel.sharded and not job.parallel.zero1


@pytest.mark.parametrize("flags, runs, says", [([], "gpipe", "1f1b"),
                                               (["--pipeline-schedule", "gpipe"], "gpipe", "gpipe"),
                                               (["--global-batch-size", "4"], "1f1b", "1f1b")])
def test_one_micro_batch_a_stage_runs_gpipe_and_says_1f1b(flags, runs, says):
    """1F1B with fewer micro-batches than stages runs torch's GPipe (its 1F1B refuses it), and
    diag_run.json says the schedule asked for: diag's bubble lever re-runs it at m >= p, where 1F1B,
    not GPipe, runs and holds min(m, p - i) micro-batches."""
    from instrumented_trainer.cli import build_parser, job_from_args
    from instrumented_trainer.telemetry import run_metadata

    args = build_parser().parse_args(["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2",
                                      "--global-batch-size", "2", *flags])
    job = job_from_args(args, 2, ["python"])
    assert job.pipeline_schedule == runs
    assert run_metadata.build(job, backend="gloo", dtype="fp32", cuda=False).pipeline_schedule == says
