#!/usr/bin/env python3
"""The HTML report's cost against the number of ProfilerSteps: it must grow linearly, not as
the square (issue #20: 30,000 steps took 39 s, a million more than 400 s).

Writes one-rank traces of N steps (tests/kineto.py's TraceBuilder: one kernel per step), runs
the analysis once per N, then times `render_html` alone (median of --rounds) and prints, for
each N, the time, the page size and the ratio to the smallest N: linear rendering keeps the
time ratio near 1 (the step heatmap has at most charts.MAX_STEP_COLUMNS columns), a quadratic
one multiplies it by (N / N0)^2.

    .venv/bin/python benchmarks/bench_html_report.py --steps 3000 30000
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from kineto import TraceBuilder  # noqa: E402

from diag.analysis import diagnose  # noqa: E402
from diag.report.html import render_html  # noqa: E402
from diag.trace import load_job  # noqa: E402


def trace_of(n: int, folder: str) -> str:
    b, at = TraceBuilder(), 0.0
    for k in range(n):
        dur = 1000.0 + 10 * (k % 7)
        b.step(k, at, dur).kernel("gemm_kernel", at + 100, 500)
        at += dur + 5
    b.write(os.path.join(folder, "rank-0.pt.trace.json.gz"))
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[3000, 30000])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    base = None
    print(f"{'steps':>9}  {'render s':>9}  {'page MB':>8}  {'time / first':>12}")
    for n in sorted(args.steps):
        with tempfile.TemporaryDirectory(prefix="diag-bench-html-") as folder:
            d = diagnose(load_job(trace_of(n, folder)))
        times, size = [], 0
        for _ in range(args.rounds):
            t = time.perf_counter()
            size = len(render_html(d))
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        base = base or med
        print(f"{n:>9,}  {med:>9.3f}  {size / 1e6:>8.2f}  {med / base:>12.2f}")


if __name__ == "__main__":
    main()
