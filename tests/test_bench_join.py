"""`diag analyze --bench`: each collective set against the busbw `diag bench` measured on its axis."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from diag.analysis import diagnose
from diag.analysis.benchcurve import parse_bench
from diag.trace import load_job

SAMPLE = os.path.join(ROOT, "sample_traces", "tp2_pp2_dp2")


def curve_doc(gbps_at: dict) -> dict:
    """A collbench result whose busbw is flat at the given GB/s per (axis, op) over 1 B .. 1 GiB."""
    results = [{"axis": axis, "op": op, "bytes": 2 ** k, "time_s": 1.0, "busbw": gbps * 1e9, "group_size": 2}
               for (axis, op), gbps in gbps_at.items() for k in range(0, 31)]
    return {"schema": "diag.collbench/1", "backend": "gloo", "device": "cpu", "world_size": 8, "results": results}


def test_efficiency_is_training_busbw_over_the_measured_curve():
    doc = curve_doc({("tp", "all_reduce"): 2.0, ("dp", "all_reduce"): 0.5, ("pp", "send_recv"): 1.0})
    d = diagnose(load_job(SAMPLE), bench=parse_bench(doc))
    checked = 0
    for o in d.comm.ops:
        want = {("tp", "all_reduce"): 2.0, ("dp", "all_reduce"): 0.5, ("pp", "send"): 1.0,
                ("pp", "recv"): 1.0}.get((o.axis, o.op))
        if want is None or o.busbw_median_gbps is None:
            continue
        assert o.achievable_gbps == pytest.approx(want)
        assert o.bench_efficiency == pytest.approx(o.busbw_median_gbps / want)
        checked += 1
    assert checked >= 3


def test_cli_finds_the_bench_next_to_the_traces_and_refuses_a_bad_one(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    (run / "diag_bench.json").write_text(json.dumps(curve_doc({("tp", "all_reduce"): 2.0})))
    p = subprocess.run([sys.executable, "-m", "diag.cli", "analyze", str(run), "--format", "json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    ops = json.loads(p.stdout)["comm"]["ops"]
    assert any(o["axis"] == "tp" and o["achievable_gbps"] == pytest.approx(2.0) for o in ops)
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something else"}')
    p = subprocess.run([sys.executable, "-m", "diag.cli", "analyze", str(run), "--bench", str(bad)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and str(bad) in p.stderr and "not a collbench result" in p.stderr
