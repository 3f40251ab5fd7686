"""What one step of the demo job costs before and after the trainer's parallelism was rebuilt on
DeviceMesh / DTensor / pipelining (issue #18).

Same model, same layout, same flags (`make demo`'s job: TP2 x PP2 x DP2, 8 gloo processes,
global batch 16, micro-batch 2, --overlap-grad-reduce). "before" is the hand-written trainer of
git revision `--before` (default 4f7efa1, the last one before the rebuild), extracted into a
temporary directory and run with this checkout's `diag`; "after" is this checkout. Runs alternate
before/after `--repeats` times so a shared machine's drift hits both alike; the first
`--skip` steps (start-up, DTensor's sharding caches, pipelining's shape inference) are left out
and reported separately as start-up. Telemetry is as in the demo unless `--bare` (no profiler,
no comm log, no metrics): the bare numbers separate DTensor's own cost from the communication
tap's.

    python benchmarks/trainer_rebuild.py [--repeats 2] [--train-iters 14] [--bare]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--global-batch-size", "16", "--micro-batch-size", "2", "--overlap-grad-reduce"]
TELEMETRY = ["--profile-wait", "1", "--profile-warmup", "1", "--profile-active", "3",
             "--no-trace-summary"]
BARE = ["--no-profile", "--no-comm-log", "--no-metrics"]


def extract(rev: str, dest: Path) -> Path:
    """The trainer package of `rev`, alone in `dest` (diag comes from this checkout)."""
    archive = subprocess.run(["git", "archive", rev, "instrumented_trainer"], cwd=ROOT,
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run(tree: Path, iters: int, flags: list[str], out: Path) -> tuple[list[float], float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    cmd = [sys.executable, "-m", "instrumented_trainer", "--nproc", "8", "--out", str(out),
           "--train-iters", str(iters), *DEMO, *flags]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=tree)
    steps = [json.loads(x)["step_seconds"] for x in (out / "steps.jsonl").read_text().split()]
    return steps, sum(steps)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", default="4f7efa1")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--train-iters", type=int, default=14)
    p.add_argument("--skip", type=int, default=6, help="steps left out (start-up, profiler)")
    p.add_argument("--bare", action="store_true", help="telemetry off in both")
    args = p.parse_args()
    flags = BARE if args.bare else TELEMETRY
    steady: dict[str, list[float]] = {"before": [], "after": []}
    startup: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": extract(args.before, Path(tmp)), "after": ROOT}
        for i in range(args.repeats):
            for name, tree in trees.items():
                steps, _ = run(tree, args.train_iters, flags, Path(tmp) / f"{name}-{i}")
                steady[name] += steps[args.skip:]
                startup[name].append(sum(steps[:args.skip]))
    before, after = statistics.median(steady["before"]), statistics.median(steady["after"])
    print(json.dumps({
        "telemetry": "off" if args.bare else "demo's", "repeats": args.repeats,
        "median_step_seconds_before": round(before, 4),
        "median_step_seconds_after": round(after, 4),
        "ratio_after_before": round(after / before, 3),
        "first_steps_seconds_before": [round(x, 2) for x in startup["before"]],
        "first_steps_seconds_after": [round(x, 2) for x in startup["after"]],
        "steps_measured_each": len(steady["after"]),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
