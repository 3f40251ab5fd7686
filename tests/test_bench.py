"""Collective benchmark (instrumented_trainer.collbench, `diag bench`) and BenchCurve.

Multi-process tests run gloo on CPU with 2 and 4 processes, 1 KiB..4 MiB, few iterations.
The machine has 2 cores and may be shared, so single timings are noisy (we have seen 3x
swings between neighbouring sizes); the shape assertions therefore compare medians and
fitted log-log slopes over several sizes, never one point against its neighbour.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import OtherWork, timing_verdict
from diag.analysis.benchcurve import load_bench, parse_bench
from diag.cli import main
from diag.ports import free_port
from diag.trace.errors import TraceError
from diag.trace.kinds import Coll

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS5 = "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all"
OTHER_WORK: dict[str, float] = {}   # fixture -> the share of the machine other work took while it ran
FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
          "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
          "broadcast": lambda n: 1.0, "send_recv": lambda n: 1.0}


def _collbench(tmp_path, nproc, *args):
    out = tmp_path / f"bench{nproc}.json"
    cmd = [sys.executable, "-m", "instrumented_trainer.collbench", "--nproc", str(nproc),
           "--min-bytes", "1K", "--max-bytes", "4M", "--cpu", "--out", str(out), *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.fixture(scope="module")
def bench2(tmp_path_factory):
    """2 processes (DP=2) through `diag bench`, so the CLI wiring is tested too."""
    out = tmp_path_factory.mktemp("b2") / "bench.json"
    with OtherWork() as other:
        res = CliRunner().invoke(main, ["bench", "--nproc", "2", "--min-bytes", "1K",
                                        "--max-bytes", "64M", "--iters", "10", "--warmup", "3",
                                        "--ops", OPS5, "--cpu", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output
    OTHER_WORK["bench2"] = other.share or 0.0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def bench4(tmp_path_factory):
    """4 processes, TP=2 x PP=2: two axes, send/recv on PP only."""
    return _collbench(tmp_path_factory.mktemp("b4"), 4, "--tp", "2", "--pp", "2",
                      "--iters", "4", "--warmup", "2", "--ops", "all_reduce,send_recv")


def _curve(doc, axis, op):
    rows = sorted((r for r in doc["results"] if (r["axis"], r["op"]) == (axis, op)),
                  key=lambda r: r["bytes"])
    return np.array([r["bytes"] for r in rows], float), np.array([r["busbw"] for r in rows])


# --- the sweep ---------------------------------------------------------------------------
@pytest.mark.slow
def test_two_process_sweep_covers_ops_and_sizes(bench2):
    assert (bench2["backend"], bench2["device"], bench2["world_size"]) == ("gloo", "cpu", 2)
    assert bench2["grid"] == {"tp": 1, "pp": 1, "dp": 2}
    ops = {r["op"] for r in bench2["results"]} | {s["op"] for s in bench2["skipped"]}
    assert ops == set(OPS5.split(","))
    for s in bench2["skipped"]:
        assert s["reason"]                        # a skipped op always says why
    assert {r["axis"] for r in bench2["results"]} == {"dp"}
    sizes, _ = _curve(bench2, "dp", "all_reduce")
    assert list(sizes) == [1024 * 2 ** k for k in range(17)]  # 1 KiB .. 64 MiB, x2 steps


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS5.split(","))
def test_busbw_rises_then_flattens(bench2, op):
    """gloo on loopback, 2 processes on 2 cores (measured: 1 KiB-1 MiB latency-bound at 1-6 ms
    with much jitter; a plateau of 0.7-1.0 GB/s from a few MiB). Rises: the top three sizes'
    median busbw is >= 10x the bottom three's (measured ~1000x). Flattens: over the top three
    sizes (16-64 MiB, a 4x span) busbw grows less than 2x, where a curve still rising linearly
    would grow 4x (all_gather even drops there: its large buffers are copy-bound). (Comparing fitted slopes of the first and last doublings failed
    once under load: too noisy.)"""
    if op in {s["op"] for s in bench2["skipped"]}:
        pytest.skip(f"{op} skipped by the backend")
    sizes, bw = _curve(bench2, "dp", op)
    assert sizes[-1] == 64 << 20
    # timings of one sweep: judged only while the rest of the machine left the sweep its cores
    # (a load beside it once depressed broadcast's 16 MiB point enough to fail "flattens")
    noise = OTHER_WORK["bench2"]
    timing_verdict(np.median(bw[-3:]) >= 10 * np.median(bw[:3]), noise, 0.10,
                   f"{op}: top three sizes' busbw {np.median(bw[-3:]):.3g} not 10x the bottom three's "
                   f"{np.median(bw[:3]):.3g}")                               # rises
    timing_verdict(bw[-1] < 2 * bw[-3], noise, 0.10,
                   f"{op}: busbw at 64 MiB {bw[-1]:.3g} >= 2x that at 16 MiB {bw[-3]:.3g}")  # and flattens


@pytest.mark.slow
def test_four_process_grid_axes_and_send_recv(bench4):
    doc, stdout = bench4
    assert doc["grid"] == {"tp": 2, "pp": 2, "dp": 1}
    keys = {(r["axis"], r["op"]) for r in doc["results"]}
    assert keys == {("tp", "all_reduce"), ("pp", "all_reduce"), ("pp", "send_recv")}
    for r in doc["results"]:
        assert r["group_size"] == 2 and r["time_s"] > 0
    sizes, bw = _curve(doc, "tp", "all_reduce")
    assert np.median(bw[-3:]) >= 3 * np.median(bw[:3])
    assert "# axis pp  op send_recv" in stdout and "(GB/s)" in stdout  # nccl-tests table


# --- the numbers -------------------------------------------------------------------------
@pytest.mark.slow
def test_algbw_busbw_follow_nccl_tests_formulas(bench2):
    """algbw = S/t, busbw = algbw x f(op, n) (nccl-tests PERFORMANCE.md), to 1e-9 relative;
    S is the nccl-tests size: the buffer for all_reduce/broadcast, the whole (n x per-rank)
    buffer for all_gather/reduce_scatter, the per-rank send buffer for all_to_all."""
    for r in bench2["results"]:
        n = r["group_size"]
        assert r["bytes"] == r["count"] * 4
        assert math.isclose(r["algbw"], r["bytes"] / r["time_s"], rel_tol=1e-9)
        assert math.isclose(r["busbw"], r["algbw"] * FACTOR[r["op"]](n), rel_tol=1e-9)


_PLAIN = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(int(sys.argv[1]) // 4)
    for _ in range(3):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(int(sys.argv[2])):
        dist.all_reduce(t)
    dt = torch.tensor([(time.perf_counter() - t0) / int(sys.argv[2])], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(dt.item())
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_time_agrees_with_a_plain_all_reduce_loop(bench2, tmp_path):
    """An independent timing: a hand-written gloo all_reduce loop in a spawned pair. On a
    shared 2-core machine two runs of the same loop differ by up to ~2x, so the tolerance is
    a factor of 3 either way at 4 MiB (bandwidth-bound, where scheduling noise is smallest)."""
    from instrumented_trainer.launch import _child_env
    script = tmp_path / "plain.py"
    script.write_text(_PLAIN)
    port, nbytes = free_port(), 4 << 20
    with OtherWork() as other:
        procs = [subprocess.Popen([sys.executable, str(script), str(nbytes), "10"], cwd=ROOT,
                                  env=_child_env(r, 2, port, "plain"), stdout=subprocess.PIPE,
                                  text=True) for r in range(2)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    plain = float(outs[0].strip().splitlines()[-1])
    (row,) = [r for r in bench2["results"] if r["op"] == "all_reduce" and r["bytes"] == nbytes]
    # two timings taken minutes apart: judged only while other work left both their cores (beside
    # two CPU burners the plain loop once read 3.4x the sweep's time)
    timing_verdict(plain / 3 <= row["time_s"] <= plain * 3, max(OTHER_WORK["bench2"], other.share or 0.0), 0.10,
                   f"diag bench's 4 MiB all_reduce {row['time_s']:.3g} s against the plain loop's {plain:.3g} s")


def test_diag_bench_modules_do_not_import_torch():
    code = ("import sys, diag.commands.bench, diag.analysis.benchcurve; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_bench_rejects_indivisible_grid():
    res = CliRunner().invoke(main, ["bench", "--nproc", "3", "--tp", "2"])
    assert res.exit_code == 2 and "not divisible" in res.output


# --- BenchCurve ----------------------------------------------------------------------------
def _doc(points):
    return {"schema": "diag.collbench/1", "backend": "gloo", "device": "cpu", "world_size": 2,
            "results": [{"axis": a, "op": o, "bytes": s, "time_s": 1.0, "busbw": b,
                         "group_size": 2} for a, o, s, b in points],
            "skipped": [{"axis": "dp", "op": "reduce_scatter", "reason": "unsupported"}]}


# busbw in the file is bytes/s; busbw_at answers in GB/s (1e9 B/s), the report's unit.
CURVE = parse_bench(_doc([("dp", "all_reduce", 4096, 3e9), ("dp", "all_reduce", 1024, 1e9),
                          ("dp", "all_reduce", 16384, 4e9), ("pp", "send_recv", 1024, 5e8)]))


def test_busbw_at_measured_points_and_interpolation_by_hand():
    assert CURVE.busbw_at("dp", "all_reduce", 1024) == 1.0       # measured points exactly
    assert CURVE.busbw_at("dp", "all_reduce", 16384) == 4.0
    # 2048 is half-way between 1024 and 4096 in log2: 1 + 0.5 x (3 - 1) = 2 GB/s
    assert math.isclose(CURVE.busbw_at("dp", "all_reduce", 2048), 2.0)
    # 1024 x 2^0.5: a quarter of the way (0.5 of 2 doublings): 1 + 0.25 x 2 = 1.5 GB/s
    assert math.isclose(CURVE.busbw_at("dp", "all_reduce", 1024 * 2 ** 0.5), 1.5)
    # 8192 is half-way between 4096 and 16384: 3 + 0.5 x 1 = 3.5 GB/s
    assert math.isclose(CURVE.busbw_at("dp", "all_reduce", 8192), 3.5)


def test_busbw_at_none_outside_range_or_unmeasured():
    assert CURVE.busbw_at("dp", "all_reduce", 1023) is None
    assert CURVE.busbw_at("dp", "all_reduce", 16385) is None
    assert CURVE.busbw_at("dp", "all_reduce", 0) is None
    assert CURVE.busbw_at("tp", "all_reduce", 2048) is None      # unmeasured axis
    assert CURVE.busbw_at("dp", "reduce_scatter", 2048) is None  # skipped op
    assert CURVE.busbw_at("pp", "send_recv", 2048) is None       # single point: only 1024
    assert CURVE.skipped[0]["reason"] == "unsupported"


def test_busbw_at_accepts_coll_values():
    assert CURVE.busbw_at("dp", Coll.ALL_REDUCE, 2048) == CURVE.busbw_at("dp", "all_reduce", 2048)
    assert CURVE.busbw_at("pp", Coll.SEND, 1024) == 0.5
    assert CURVE.busbw_at("pp", "send", 1024) == 0.5         # Coll.SEND.name.lower()
    assert CURVE.busbw_at("pp", "recv", 1024) == 0.5
    assert CURVE.busbw_at("pp", Coll.BARRIER, 1024) is None


@pytest.mark.parametrize("content, problem", [
    ("{not json", "not valid JSON"),
    ('{"schema": "other", "results": []}', "schema"),
    ('{"schema": "diag.collbench/1"}', "'results'"),
    ('{"schema": "diag.collbench/1", "results": [{"axis": "dp"}]}', "results[0] lacks"),
    ('{"schema": "diag.collbench/1", "results": [{"axis": "dp", "op": "all_reduce", '
     '"bytes": "x", "time_s": 1, "busbw": 1, "group_size": 2}]}', "non-numeric"),
])
def test_load_bench_bad_file_names_file_and_problem(tmp_path, content, problem):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(TraceError) as e:
        load_bench(p)
    assert str(p) in str(e.value) and problem in str(e.value)


def test_load_bench_missing_file(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_bench(tmp_path / "nope.json")


def test_load_bench_round_trip(tmp_path):
    p = tmp_path / "ok.json"
    p.write_text(json.dumps(_doc([("tp", "all_gather", 1024, 1.0), ("tp", "all_gather", 2048, 2.0)])))
    curve = load_bench(p)
    assert curve.points[("tp", "all_gather")] == [(1024, 1.0), (2048, 2.0)]
    assert curve.backend == "gloo" and curve.world_size == 2


@pytest.mark.slow
def test_real_run_reads_back_in_gb_per_s(bench2, tmp_path):
    """busbw_at on a real run returns the JSON's measured busbw / 1e9 at a measured size."""
    p = tmp_path / "b.json"
    p.write_text(json.dumps(bench2))
    (row,) = [r for r in bench2["results"] if r["op"] == "all_reduce" and r["bytes"] == 1 << 20]
    assert math.isclose(load_bench(p).busbw_at("dp", Coll.ALL_REDUCE, 1 << 20), row["busbw"] / 1e9)


def test_size_parsing_and_sweep():
    from instrumented_trainer.collbench import parse_size, sizes
    assert [parse_size(s) for s in ("8", "1K", "1KiB", "64M", "1G")] == [8, 1024, 1024,
                                                                         64 << 20, 1 << 30]
    assert sizes(1024, 5000) == [1024, 2048, 4096]
