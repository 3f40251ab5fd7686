"""A job that is not ours, end to end, as a user runs it: `diag analyze` on the root folder of a
torchtitan-style run (DeviceMesh, DTensor TP, torch.distributed.pipelining, FSDP2, gloo; no diag
labels, no diag_run.json) with one rank made slow.

What the traces alone must give: the layout from the process-group names, the iteration folder
picked and said, the slow rank named from the collectives it makes the others wait at, the model
shape from the GEMMs, and recommendations (never "nothing worth changing" when waiting leads).
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SLOW_RANK, SLOW_MS = 5, 1000      # a second per step: far above what a loaded 2-core machine adds by chance


@pytest.fixture(scope="module")
def report(native3d_run):
    path = native3d_run("1f1b", "--slow-rank", str(SLOW_RANK), "--slow-ms", str(SLOW_MS))
    assert not os.path.exists(os.path.join(path, "diag_run.json"))
    p = subprocess.run([sys.executable, "-m", "diag", "analyze", path, "--format", "json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return path, json.loads(p.stdout)


@pytest.mark.slow
def test_layout_and_iteration_from_the_traces(report):
    path, d = report
    assert d["layout"] == "pp2 × dp2 × tp2, from process-group names"
    assert d["layout_dims"] == [["pp", 2], ["dp", 2], ["tp", 2]]
    assert any("iteration_" in n and "picked" in n for n in d["notes"])
    axes = {o["axis"] for o in d["comm"]["ops"]}
    assert {"tp", "pp", "dp"} <= axes


@pytest.mark.slow
def test_the_slow_rank_is_named(report):
    _, d = report
    late = [s for s in d["comm"]["stragglers"] if s["basis"] == "collectives"]
    assert late and late[0]["ranks"] == [SLOW_RANK], d["comm"]["stragglers"]
    top = d["findings"][0]
    assert top["kind"] == "straggler" and top["ranks"] == [SLOW_RANK], d["findings"][:3]
    # the injected sleep is once per step; the others' wait for it is at least most of it
    assert top["seconds_per_step"] >= 0.5 * SLOW_MS / 1e3


@pytest.mark.slow
def test_shape_from_the_gemms_and_advice(report):
    _, d = report
    # the workload's model: hidden 64, SwiGLU MLP of 172 (tests/workloads/torch_native_3d.py)
    assert (d["facts"]["hidden_size"], d["facts"]["ffn_hidden_size"], d["facts"]["swiglu"]) == (64, 172, True)
    assert d["recommendations"], "a run whose top loss is waiting must get advice"
    assert d["recommendations"][0]["rule"] == "straggler"
