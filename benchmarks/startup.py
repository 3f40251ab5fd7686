#!/usr/bin/env python3
"""Start-up of `diag analyze FILE`: from fork to the moment the trace file is opened.

A child process runs the `diag` command line in-process under an audit hook (sys.addaudithook,
PEP 578) that notes the wall clock when FILE is first opened; the parent notes the clock before
it forks, so the difference is interpreter start-up, site, and every import made before the
first byte is read. Also timed: `diag --help` whole (fork to exit), and `python -c pass` (the
interpreter alone) for scale. Each is run --rounds times; medians, with the spread, are printed.
The modules imported by then are listed with --modules. Children run with -P (no current
directory on sys.path), so PYTHONPATH picks the checkout measured.

    python benchmarks/startup.py tests/data/a100_single_ns_resolution --rounds 9
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time
target = os.path.abspath(sys.argv[1])
seen = []

def hook(event, args):
    if not seen and event == "open" and isinstance(args[0], str) and os.path.abspath(args[0]).startswith(target):
        seen.append(time.time())
        sys.stderr.write("FIRST_OPEN %r %s\n" % (seen[0], json.dumps(sorted(sys.modules))))

sys.addaudithook(hook)
sys.argv = ["diag", "analyze", sys.argv[1], "--format", "json", "--output", os.devnull]
from diag.cli import main
try:
    main()
except SystemExit:
    pass
"""


def first_open(path: str) -> tuple[float, list[str]]:
    """Seconds from fork to the first open of a file under path, and the modules loaded by then."""
    t0 = time.time()
    done = subprocess.run([sys.executable, "-P", "-c", CHILD, path], capture_output=True, text=True)
    for line in done.stderr.splitlines():
        if line.startswith("FIRST_OPEN "):
            stamp, modules = line.split(" ", 2)[1:]
            return float(stamp) - t0, json.loads(modules)
    raise SystemExit(f"the trace was never opened:\n{done.stderr[-2000:]}")


def whole(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True)
    return time.perf_counter() - t0


def summary(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.3f} s (min {min(xs):.3f}, max {max(xs):.3f}, n={len(xs)})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", help="a trace file or folder")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--modules", action="store_true", help="list the modules imported before the first read")
    ap.add_argument("--json", help="write the samples here")
    args = ap.parse_args(argv)
    py = [sys.executable]
    samples: dict[str, list[float]] = {"python -c pass": [], "diag --help": [], "diag analyze: until first byte": []}
    modules: list[str] = []
    for _ in range(args.rounds):
        samples["python -c pass"].append(whole(py + ["-c", "pass"]))
        samples["diag --help"].append(whole(py + ["-P", "-m", "diag", "--help"]))
        t, modules = first_open(os.path.abspath(args.path))
        samples["diag analyze: until first byte"].append(t)
    for k, xs in samples.items():
        print(f"{k:32s} {summary(xs)}")
    heavy = [m for m in modules if m.split(".")[0] in ("numpy", "rich", "plotly", "streamlit", "pandas", "hta")
             or m.startswith(("diag.analysis", "diag.advise", "diag.report.text"))]
    print(f"modules loaded before the first byte: {len(modules)}; heavy ones: {sorted(set(m.split('.')[0] for m in heavy)) or 'none'}")
    if args.modules:
        print("\n".join(modules))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": samples, "modules_before_first_byte": modules}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
