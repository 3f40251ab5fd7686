"""Every parallel layout computes the same training run as a single process.

Same seed, same synthetic global batch, parameters initialised from the full weights: the loss
of TP (DTensor, with and without sequence parallelism), PP (torch.distributed.pipelining: GPipe,
1F1B, interleaved 1F1B, the zero-bubble schedules, uneven stages), DP (replicated; ZeRO-1 with
ZeroRedundancyOptimizer, also under TP and PP; FSDP2 ZeRO-2, ZeRO-3 and HSDP), activation recomputation (full, selective) and TPxPPxDP runs must
match the 1x1x1 run for 10 steps. fp32 reductions split across ranks change the summation order
(a TP all-reduce adds two partial dot products, a DP all-reduce two partial gradient sums), so
bit-equality is not expected. The tolerance is 1e-5 relative: fp32's unit roundoff is 6e-8, and
a reordered sum of n terms moves by at most ~n x 6e-8 relative (n ~ 100 along a reduction here),
compounded over 10 AdamW steps; measured, the largest difference is 1e-7 (4.8356423 against
4.8356428 at TP2 x PP2 x DP2 with SP, step 4), the others bit-equal.
"""

from __future__ import annotations

import json

import pytest

from .runner import assert_ok, run_trainer

REL_TOL = 1e-5

PP2 = ["--pipeline-model-parallel-size", "2"]
LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "tp2_sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "pp2_1f1b": (2, PP2),
    "pp2_gpipe_uneven": (2, [*PP2, "--pipeline-schedule", "gpipe",
                             "--decoder-first-pipeline-num-layers", "1"]),
    "pp2_interleaved": (2, [*PP2, "--pipeline-schedule", "interleaved-1f1b",
                            "--num-layers-per-virtual-pipeline-stage", "1"]),
    "pp2_zb1p": (2, [*PP2, "--pipeline-schedule", "zb1p"]),
    "pp2_zbv": (2, [*PP2, "--pipeline-schedule", "zbv"]),
    "pp2_dualpipev": (2, [*PP2, "--pipeline-schedule", "dualpipev"]),
    "dp2": (2, []),
    "dp2_overlap_small_buckets": (2, ["--overlap-grad-reduce", "--ddp-bucket-size", "4096"]),
    "dp2_zero1": (2, ["--use-distributed-optimizer"]),
    "tp2_dp2_zero1": (4, ["--tensor-model-parallel-size", "2",
                          "--data-parallel-sharding-strategy", "optim"]),
    "pp2_dp2_zero1": (4, [*PP2, "--use-distributed-optimizer"]),
    "dp2_zero3": (2, ["--data-parallel-sharding-strategy", "optim_grads_params"]),
    "pp2_dp2_zero2": (4, [*PP2, "--data-parallel-sharding-strategy", "optim_grads"]),
    "tp2_sp_dp2_zero3_gpipe": (4, ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                   "--data-parallel-sharding-strategy", "optim_grads_params",
                                   "--pipeline-schedule", "gpipe"]),
    "hsdp_2x2": (4, ["--data-parallel-sharding-strategy", "optim_grads_params",
                     "--num-distributed-optimizer-instances", "2"]),
    "tp2_recompute_full": (2, ["--tensor-model-parallel-size", "2",
                               "--recompute-granularity", "full"]),
    "pp2_recompute_selective": (2, [*PP2, "--recompute-granularity", "selective"]),
    "tp2_pp2_dp2_sp": (8, ["--tensor-model-parallel-size", "2", *PP2, "--sequence-parallel",
                           "--overlap-grad-reduce", "--ddp-bucket-size", "20000"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_single_process(layout, tmp_path, reference_losses):
    nproc, args = LAYOUTS[layout]
    run = run_trainer(tmp_path, nproc, "--train-iters", "10", "--no-profile", *args)
    assert_ok(run)
    losses = run.losses()
    # the start-up timing of what SP would cost the optimizer: at TP 2 without SP, through each layout's own
    # optimizer (ZeRO-1's too); none at TP 1, nor where SP is on (run_metadata.sp_grad_sync)
    sync = json.loads((run.out / "diag_run.json").read_text())["sp_grad_sync_s"]
    if "--tensor-model-parallel-size" in args and "--sequence-parallel" not in args:
        assert sync is not None and sync > 0, (layout, sync)
    else:
        assert sync is None, (layout, sync)
    assert len(losses) == len(reference_losses) == 10
    for step, (got, want) in enumerate(zip(losses, reference_losses)):
        assert abs(got - want) <= REL_TOL * abs(want), (layout, step, got, want)


@pytest.mark.slow
def test_loss_goes_down(reference_losses):
    assert reference_losses[-1] < reference_losses[0]


# bf16 (the GPU path's dtype: autocast to bfloat16, the same code as on CUDA, run here on the CPU):
# each TP rank's partial matmul output is rounded to bf16 before the all-reduce adds them, so the
# parallel run differs from the single process by rounding of bf16's unit roundoff 2^-8 = 3.9e-3
# per element; the tolerance is 1e-2 relative over 5 steps. Measured: 2.9e-5 at TP2 with SP, 0 at
# PP2 (the stages compute what the single process does, in the same order).
BF16_TOL = 1e-2
BF16 = ["--train-iters", "5", "--no-profile", "--dtype", "bf16"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tp2_sp", "pp2_1f1b"])
def test_bf16_layout_matches_single_process(layout, tmp_path):
    nproc, args = LAYOUTS[layout]
    ref = run_trainer(tmp_path / "ref", 1, *BF16)
    run = run_trainer(tmp_path / "par", nproc, *BF16, *args)
    assert_ok(ref)
    assert_ok(run)
    want, got = ref.losses(), run.losses()
    assert len(got) == len(want) == 5
    fp32 = run_trainer(tmp_path / "fp32", 1, "--train-iters", "5", "--no-profile", "--dtype", "fp32")
    assert_ok(fp32)
    assert want != fp32.losses()           # bf16 really ran: its losses are not fp32's
    for step, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= BF16_TOL * abs(w), (layout, step, g, w)
