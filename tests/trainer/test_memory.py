"""ZeRO-1 (`--use-distributed-optimizer`) really shards the optimizer states, every process
group the trainer creates has the job's `--dist-timeout`, and the peak memory measured on CPU
moves with ZeRO stages and recomputation the way the byte arithmetic says.
"""

from __future__ import annotations

import pytest

from .runner import run_workers

TP2 = ["--tensor-model-parallel-size", "2"]


@pytest.fixture(scope="module")
def tp2_dp2_zero1(tmp_path_factory):
    """TP=2 x DP=2 with ZeRO-1 (DTensor parameters), --dist-timeout 37 s."""
    return run_workers("tests.trainer.setup_worker", tmp_path_factory.mktemp("zero1"), 4, *TP2,
                       "--use-distributed-optimizer", "--dist-timeout", "37")


def test_distributed_optimizer_shards_states_over_dp(tp2_dp2_zero1):
    """Each TP rank's two DP replicas hold the same parameters and split their AdamW states:
    exp_avg and exp_avg_sq (4 B per fp32 element each) and a 4 B `step` per tensor, once over
    the pair; ZeroRedundancyOptimizer partitions whole tensors, so each share is near half."""
    for tp in (0, 1):
        pair = [r for r in tp2_dp2_zero1 if r["coords"]["tp"] == tp]
        assert len(pair) == 2
        params, tensors = pair[0]["param_bytes"], pair[0]["param_tensors"]
        assert [r["param_bytes"] for r in pair] == [params, params]  # replicated
        assert sum(r["state_bytes"] for r in pair) == 2 * params + 4 * tensors
        assert sum(r["state_tensors"] for r in pair) == 3 * tensors
        for r in pair:
            assert 0.35 * 2 * params < r["state_bytes"] < 0.65 * 2 * params, r


def test_every_process_group_has_the_job_timeout(tp2_dp2_zero1):
    """The default group and each DeviceMesh dimension's group (c10d's gloo backend options
    report the timeout it was created with; without the override a sub-group gets 30 min)."""
    for r in tp2_dp2_zero1:
        assert r["default_timeout"] == 37.0
        assert r["timeouts"] == {a: 37.0 for a in r["timeouts"]}, r
