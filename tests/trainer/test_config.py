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
