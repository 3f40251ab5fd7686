"""`diag compare`: two runs side by side, values as the two diagnoses give them."""
import json

import pytest
from click.testing import CliRunner

from diag.advise import Config, Links, Workload, simulate
from diag.advise.compare import compare
from diag.advise.synth import write_job
from diag.analysis import diagnose
from diag.cli import main
from diag.trace import load_job

MS = 1e-3


def job(path, m, mbs):
    w = Workload(num_layers=8, fwd_s_per_layer=1 * MS * mbs / 4)
    c = Config(pp=2, num_micro_batches=m, micro_batch_size=mbs)
    write_job(simulate(w, c, Links(pp=1e15), steps=4), str(path), c, w)
    return diagnose(load_job(str(path)))


def test_pipeline_change_side_by_side(tmp_path):
    """m=1 x 4 -> m=4 x 1: step 24 -> 15 ms ((m+p-1)(tf+tb)), worst bubble 1/2 -> 1/5, tokens/s x 1.6."""
    a, b = job(tmp_path / "a", 1, 4), job(tmp_path / "b", 4, 1)
    c = compare(a, b)
    rows = {r.metric: r for r in c.rows}
    assert rows["step time"].a == pytest.approx(24.0, rel=1e-3) and rows["step time"].b == pytest.approx(15.0, rel=1e-3)
    assert rows["step time"].change == pytest.approx(15 / 24 - 1, rel=1e-3)
    assert rows["pipeline bubble (worst stage)"].a == pytest.approx(50.0, abs=0.1)
    assert rows["pipeline bubble (worst stage)"].b == pytest.approx(20.0, abs=0.1)
    assert rows["tokens/s/GPU"].change == pytest.approx(24 / 15 - 1, rel=1e-3)
    assert ["micro_batch_size", 4, 1] in c.config and ["num_micro_batches", 1, 4] in c.config


def test_cli_compare_text_json_and_errors(tmp_path):
    r = CliRunner().invoke(main, ["compare", "sample_traces/dp2_no_overlap", "sample_traces/dp2_overlap"])
    assert r.exit_code == 0, r.output
    assert "step time" in r.output and "overlap_grad_reduce: False -> True" in r.output
    r = CliRunner().invoke(main, ["compare", "sample_traces/dp2_no_overlap", "sample_traces/dp2_overlap",
                                  "--format", "json"])
    rows = {x["metric"]: x for x in json.loads(r.output)["rows"]}
    a = diagnose(load_job("sample_traces/dp2_no_overlap"))
    assert rows["step time"]["a"] == pytest.approx(a.throughput.step_time_s * 1e3)
    r = CliRunner().invoke(main, ["compare", "sample_traces/dp2_overlap", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "error" in r.output
