#!/usr/bin/env python3
"""What each phase of `diag analyze FILE` costs, in CPU seconds per million events.

One process, one core (DIAG_WORKERS=1, no read-ahead), each phase timed with process_time
(CPU, so a busy machine inflates it less than wall time), best of --rounds after a warm-up:

  imports       a fresh interpreter importing what `diag analyze --format json` imports
                (numpy, msgspec, click, the trace reader, the analysis, the recommender), minus
                `python -c pass`: measured in child processes
  read          read_bytes: the file's bytes, inflated when gzip
  top level     decode_trace: the keys around traceEvents
  decode        schema.event_chunks: the events' JSON into Python objects (msgspec)
  columns       chunks.chunk_columns: those objects into numpy columns
  load          build_rank as the loader runs it: decode + columns chunk by chunk, the columns
                joined, the communication table (decode and columns are timed apart above,
                so load - decode - columns is what the table and comms cost, within the noise)
  rank pass     analysis.rankpass.summarize: breakdown, overlap, steps, kernels, comms
  merge+render  analysis.diagnose on the job, and the JSON report

Only public functions are called, so the same script times an older checkout
(PYTHONPATH=that checkout) for a before/after table (benchmarks/README.md).

    PYTHONPATH=. python benchmarks/phases.py bench_out/a100_nccl_x6.json --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ["DIAG_WORKERS"] = "1"
os.environ["DIAG_NO_PREFETCH"] = "1"

IMPORTS = ("import numpy, msgspec, click, diag.cli, diag.trace.job, diag.analysis, diag.analysis.collect, "
           "diag.advise.recommend, diag.report.jsonfmt")


def _cpu_of(code: str) -> float:
    out = subprocess.run([sys.executable, "-c", code + "\nimport time, sys; sys.stdout.write(repr(time.process_time()))"],
                         capture_output=True, text=True, check=True)
    return float(out.stdout)


def import_cost(rounds: int) -> float:
    return min(_cpu_of(IMPORTS) for _ in range(rounds)) - min(_cpu_of("") for _ in range(rounds))


def one_round(path: str) -> tuple[dict, int]:
    from diag.analysis import diagnose
    from diag.analysis.rankpass import summarize
    from diag.report import render
    from diag.trace import build, chunks, read, schema
    from diag.trace.job import Job

    t, clock = {}, time.process_time
    a = clock(); data = read.read_bytes(path); t["read"] = clock() - a
    a = clock(); doc = read.decode_trace(path, data); t["top level"] = clock() - a
    t["decode"] = t["columns"] = 0.0
    events, it = 0, schema.event_chunks(doc.traceEvents)
    while True:                       # chunk by chunk, as build_rank does: one chunk alive at a time
        a = clock()
        chunk = next(it, None)
        t["decode"] += clock() - a
        if chunk is None:
            break
        a = clock()
        chunks.chunk_columns(chunk)
        t["columns"] += clock() - a
        events += len(chunk)
        del chunk
    a = clock(); rt = build.build_rank(path, doc); t["load"] = clock() - a
    a = clock(); s = summarize(rt); t["rank pass"] = clock() - a
    a = clock(); render(diagnose(Job(source=path, ranks=[s])), "json"); t["merge+render"] = clock() - a
    return t, events


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="append the results here (one JSON object per line)")
    args = ap.parse_args(argv)
    imports = import_cost(args.rounds)
    for path in args.inputs:
        one_round(path)                                     # warm-up: page cache, lazy imports
        runs = [one_round(path) for _ in range(args.rounds)]
        events = runs[0][1]
        best = {k: min(r[0][k] for r in runs) for k in runs[0][0]}
        per_m = {k: v / (events / 1e6) for k, v in best.items()}
        total = sum(v for k, v in best.items() if k not in ("decode", "columns"))   # both are inside load
        print(f"{os.path.basename(path)}: {events} events; imports {imports:.3f} s (once per process)")
        print("  " + "  ".join(f"{k} {v:.3f}" for k, v in best.items()) + f"  | sum {total:.3f} s")
        print("  per M events: " + "  ".join(f"{k} {v:.2f}" for k, v in per_m.items())
              + f"  | sum {total / (events / 1e6):.2f} s")
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({"input": path, "events": events, "imports_s": imports, "phases_s": best,
                                    "code": os.environ.get("PYTHONPATH", "")}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
