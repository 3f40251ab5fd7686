#!/usr/bin/env python3
"""One huge trace: `diag analyze` on a 2 GB uncompressed trace must stay within 6 GiB of RAM.

Builds the trace once with make_big_trace.py (a real A100 + NCCL trace repeated in time, the
same generator as the 52/105 MB points of bench_analyze.py), then measures, each in its own
child process with bench_analyze.measure (wall time; peak memory = max(ru_maxrss, the peak of
the PSS summed over the child's process tree, so forked workers count once per shared page)):

  * diag analyze FILE --format json --output /dev/null --no-summaries   (default workers)
  * the same with DIAG_WORKERS=1 (one process)
  * the same on a gzipped copy (made with `gzip -1`), with --gz: inflated to a temporary file
  * HTA (hta_run.py: load + breakdown + overlap), with --hta; it needs about 8x the file in RAM

    .venv/bin/python benchmarks/bench_big.py --out bench_out/bench_big_2gb.json [--hta]

Prints a table and `memory target: PASS/FAIL` (exit 1 on FAIL).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_analyze import find_diag, measure  # noqa: E402

SRC = os.path.join(ROOT, "tests", "data", "a100_rank0_of_2_nccl_args")
COPY_BYTES = 8_862_000            # one copy of SRC in make_big_trace's output (bytes per copy)


def make(path: str, target_bytes: int) -> dict:
    copies = math.ceil(target_bytes / COPY_BYTES)
    info_path = path + ".info.json"           # make_big_trace's report (events, copies), kept
    if os.path.exists(path) and os.path.getsize(path) >= target_bytes:
        info = json.load(open(info_path)) if os.path.exists(info_path) else {}
        return {**info, "made": False, "bytes": os.path.getsize(path)}
    out = subprocess.run([sys.executable, os.path.join(HERE, "make_big_trace.py"), SRC, path,
                          "--copies", str(copies)], check=True, capture_output=True, text=True)
    with open(info_path, "w") as f:
        f.write(out.stdout)
    return {"made": True, **json.loads(out.stdout)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=os.path.join(ROOT, "bench_out", "a100_nccl_2gb.json"))
    ap.add_argument("--gb", type=float, default=2.0, help="uncompressed size to build (1 GB = 1e9 bytes)")
    ap.add_argument("--limit-gib", type=float, default=6.0)
    ap.add_argument("--hta", action="store_true", help="also run HTA on it (slow, ~8x the file in RAM)")
    ap.add_argument("--gz", action="store_true", help="also run diag on a gzipped copy")
    ap.add_argument("--hta-limit-gib", type=float, default=18.0,
                    help="kill HTA once it holds more than this (the machine's memory is not the benchmark's)")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    os.makedirs(os.path.dirname(args.trace), exist_ok=True)
    info = make(args.trace, int(args.gb * 1e9))
    size = os.path.getsize(args.trace)
    diag = find_diag(None)
    if diag is None:
        sys.exit("no diag executable next to this python: make setup")

    def analyze(path: str) -> list:
        return diag + ["analyze", path, "--format", "json", "--output", "/dev/null", "--no-summaries"]

    runs = {"diag": measure(analyze(args.trace), args.timeout, capture=False),
            "diag[w=1]": measure(["env", "DIAG_WORKERS=1"] + analyze(args.trace), args.timeout, capture=False)}
    if args.gz:
        gz = args.trace + ".gz"
        if not os.path.exists(gz) or os.path.getmtime(gz) < os.path.getmtime(args.trace):
            with open(gz, "wb") as f:
                subprocess.run(["gzip", "-1", "-c", args.trace], stdout=f, check=True)
        runs[f"diag .gz ({os.path.getsize(gz) / 1e6:.0f} MB)"] = measure(analyze(gz), args.timeout, capture=False)
    if args.hta:
        runs["HTA"] = measure([sys.executable, os.path.join(HERE, "hta_run.py"), args.trace, "--quiet"],
                              args.timeout, capture=False, kill_above_mib=args.hta_limit_gib * 1024)
    events = info.get("events")
    print(f"trace: {args.trace}: {size / 1e9:.2f} GB uncompressed" + (f", {events:,} events" if events else ""))
    print(f"| tool | rc | wall s | peak MiB | peak / file size | cpu s |")
    print(f"|---|---|---|---|---|---|")
    for label, r in runs.items():
        why = " (timeout)" if r["timed_out"] else " (killed: over --hta-limit-gib)" if r.get("over_memory_limit") else ""
        print(f"| {label} | {r['rc']}{why} | {r['wall_s']:.1f} | "
              f"{r['peak_mib']:.0f} | {r['peak_mib'] * 2**20 / size:.2f} | {r['user_s'] + r['sys_s']:.1f} |")
    ok = all(r["rc"] == 0 and r["peak_mib"] <= args.limit_gib * 1024 for k, r in runs.items() if k.startswith("diag"))
    print(f"memory target (<= {args.limit_gib:g} GiB for diag): {'PASS' if ok else 'FAIL'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"trace": args.trace, "bytes": size, "info": info, "runs": runs,
                       "limit_gib": args.limit_gib, "pass": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
