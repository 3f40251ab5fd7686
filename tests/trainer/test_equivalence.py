"""Every parallel layout computes the same training run as a single process.

Same seed, same synthetic global batch, parameters initialised from the full weights: the loss
of TP, PP, DP and TPxPPxDP runs must match the 1x1x1 run for 10 steps. fp32 reductions split
across ranks change the summation order, so bit-equality is not expected; 1e-5 relative is.
"""

from __future__ import annotations

import pytest

from .runner import assert_ok, run_trainer

REL_TOL = 1e-5

LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2_1f1b": (2, ["--pipeline-model-parallel-size", "2"]),
    "pp2_gpipe": (2, ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "gpipe"]),
    "dp2": (2, []),
    "dp2_overlap_small_buckets": (2, ["--overlap-grad-reduce", "--ddp-bucket-size", "4096"]),
    "tp2_pp2_dp2": (8, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                        "2", "--overlap-grad-reduce", "--ddp-bucket-size", "20000"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_process(layout, tmp_path, reference_losses):
    nproc, args = LAYOUTS[layout]
    run = run_trainer(tmp_path, nproc, "--train-iters", "10", "--no-profile", *args)
    assert_ok(run)
    losses = run.losses()
    assert len(losses) == len(reference_losses) == 10
    for step, (got, want) in enumerate(zip(losses, reference_losses)):
        assert abs(got - want) <= REL_TOL * abs(want), (layout, step, got, want)


@pytest.mark.slow
def test_loss_goes_down(reference_losses):
    assert reference_losses[-1] < reference_losses[0]
