#!/usr/bin/env python3
"""Two checkouts' `diag analyze` against each other and against the floor, alternating.

Each round runs `bench_analyze.py INPUTS --skip-hta --rounds 1` once per checkout (the order
swapped every round), diag as `env PYTHONPATH=<checkout> python -P -m diag` (-P: the current
directory does not shadow PYTHONPATH), so both sides and the floor are measured on the same
inputs, close in time, on the same loaded or quiet machine. Prints, per input, the medians of
diag's wall and CPU seconds on each side, of the floor's wall seconds (the fastest parser of
each call), and each side's wall time over the floor's.

    python benchmarks/bench_ab.py --before ../main --after . bench_out/a100_nccl_x6.json --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def one_call(root: str, inputs: list[str], out: str) -> dict:
    diag = f"env PYTHONPATH={os.path.abspath(root)} {sys.executable} -P -m diag"
    subprocess.run([sys.executable, os.path.join(HERE, "bench_analyze.py"), *inputs, "--skip-hta",
                    "--rounds", "1", "--diag", diag, "--out", out], check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return {os.path.basename(r["input"]): r for r in json.load(f)["results"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--before", required=True, help="a checkout (its root)")
    ap.add_argument("--after", required=True, help="another checkout")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    inputs = [os.path.abspath(p) for p in args.inputs]
    got: dict = {}                     # (input, side) -> list of diag summaries; (input, "floor") -> walls
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            sides = ("before", "after") if rnd % 2 == 0 else ("after", "before")
            for side in sides:
                res = one_call(getattr(args, side), inputs, os.path.join(tmp, f"{side}{rnd}.json"))
                for name, r in res.items():
                    got.setdefault((name, side), []).append(r["summary"]["diag"])
                    floors = [s["wall_s"] for t, s in r["summary"].items() if t.startswith("floor:") and s["wall_s"]]
                    got.setdefault((name, "floor"), []).append(min(floors))
                print(f"round {rnd} {side} done", file=sys.stderr, flush=True)
    med = statistics.median
    print("| input | before: wall s (CPU s) | after: wall s (CPU s) | floor wall s | before/floor | after/floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in dict.fromkeys(os.path.basename(p) for p in inputs):
        b, a, fl = got[(name, "before")], got[(name, "after")], med(got[(name, "floor")])
        bw, aw = med(s["wall_s"] for s in b), med(s["wall_s"] for s in a)
        print(f"| {name} | {bw:.3f} ({med(s['cpu_s'] for s in b):.3f}) | {aw:.3f} ({med(s['cpu_s'] for s in a):.3f}) "
              f"| {fl:.3f} | {bw / fl:.2f}x | {aw / fl:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
