"""Each pipeline schedule the trainer runs is the schedule it names, read back from its trace.

PP=2, m=4 (global batch 8 of micro-batches of 2, one replica), one profiled step. The run's
`diag_run.json` is removed before the analysis, so diag has to read the schedule, m, v and each
stage's order of forwards and backwards from the trace alone (torch.distributed.pipelining's
annotations, or the order of forward and backward compute between pipeline transfers), as it
would for a job that is not ours. The reference orders are independent of diag: the textbook
GPipe and 1F1B orders worked by hand, and torch's own pipeline order for interleaved 1F1B
(`torch_order` in test_pp_schedule.py, shared with the torchtitan-style workload's test).
"""

from __future__ import annotations

import pytest

from diag.analysis import diagnose
from diag.trace import load_job
from test_pp_schedule import M, P, torch_order

from .runner import assert_ok, run_trainer

FLAGS = {
    "gpipe": ["--pipeline-schedule", "gpipe"],
    "1f1b": ["--pipeline-schedule", "1f1b"],
    "interleaved-1f1b": ["--pipeline-schedule", "interleaved-1f1b",
                         "--num-layers-per-virtual-pipeline-stage", "1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("sched", list(FLAGS))
def test_schedule_order_read_back_from_the_trace(sched, tmp_path):
    assert (P, M) == (2, 4)
    run = run_trainer(tmp_path, 2, "--pipeline-model-parallel-size", "2", "--train-iters", "3",
                      "--profile-wait", "1", "--profile-warmup", "1", "--profile-active", "1",
                      "--no-trace-summary", "--no-metrics", *FLAGS[sched])
    assert_ok(run)
    (tmp_path / "diag_run.json").unlink()  # nothing given: all read from the trace
    p = diagnose(load_job(str(tmp_path))).pipeline
    v = 2 if sched == "interleaved-1f1b" else 1
    assert (p.schedule, p.m, p.v, p.p) == (sched, M, v, P), p.source
    assert "read from the" in p.source
    for stage in p.stages:
        assert stage.order == torch_order(sched, stage.stage), (stage.stage, stage.order)
