#!/usr/bin/env python3
"""Cost of `diag analyze --timeline`: wall time and peak memory against the traces' size.

The timeline copies every rank's events, one rank at a time and a few MB of events at once
(report.timeline_events), so its peak memory should follow the largest chunk and the analysis,
not the job. This repeats a real 2-rank job's traces K times in time (make_big_trace.py, both
ranks alike, so their collectives still match) for two values of K and prints, for each: the
traces' size, the timeline's size, wall seconds and the peak RSS of `diag analyze` with and
without --timeline, and the ratios between the two sizes.

    python benchmarks/bench_timeline.py [--copies 4 16]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "data", "dlrm_2_ranks_alltoall")


def _build(folder: str, copies: int) -> int:
    os.makedirs(folder)
    for name in sorted(os.listdir(JOB)):
        subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "make_big_trace.py"),
                        os.path.join(JOB, name), os.path.join(folder, name), "--copies", str(copies)],
                       check=True, capture_output=True)
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))


def _run(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one `diag` run in a fresh child (the python -c wrapper
    reports its own peak, so earlier children do not count)."""
    code = ("import resource, runpy, sys; sys.argv = ['diag'] + sys.argv[1:]\n"
            "try:\n    runpy.run_module('diag', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write('PEAK %d\\n' % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       env={**os.environ, "DIAG_WORKERS": "1"})
    wall = time.perf_counter() - t
    peak = [int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("PEAK ")]
    assert peak, p.stderr[-2000:]
    return wall, peak[0] / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, nargs=2, default=[4, 16])
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in a.copies:
            folder = os.path.join(tmp, f"x{k}")
            size = _build(folder, k)
            out = os.path.join(tmp, f"timeline_x{k}.json")
            plain = _run(["analyze", folder, "--no-summaries"])
            timed = _run(["analyze", folder, "--no-summaries", "--timeline", out])
            rows.append((k, size / 2**20, os.path.getsize(out) / 2**20, plain, timed))
    print(f"{'copies':>6} {'traces MiB':>10} {'timeline MiB':>12} {'analyze s':>9} {'+timeline s':>11} "
          f"{'analyze RSS':>11} {'+timeline RSS':>13}")
    for k, size, tl, (w0, m0), (w1, m1) in rows:
        print(f"{k:>6} {size:>10.1f} {tl:>12.1f} {w0:>9.2f} {w1:>11.2f} {m0:>9.0f}Mi {m1:>11.0f}Mi")
    (_, s0, _, (p0, r0), (w0, m0)), (_, s1, _, (p1, r1), (w1, m1)) = rows
    print(f"traces x{s1 / s0:.1f}: peak RSS x{m1 / m0:.2f} with --timeline (x{r1 / r0:.2f} without); "
          f"the timeline's own time {s0 / max(w0 - p0, 1e-9):.1f} and {s1 / max(w1 - p1, 1e-9):.1f} MiB of "
          "traces per second (a shared machine's timings are noisy: compare the two runs' ratios only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
