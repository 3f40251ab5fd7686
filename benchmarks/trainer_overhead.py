"""Overhead of the trainer's telemetry on step time.

Runs the same job with telemetry off (no profiler, no comm log, no metrics thread) and on
(comm log, metrics sampler, profiler armed), alternating off/on `--repeats` times so that drift of
a shared machine hits both equally, and compares median step times. With telemetry on, the
profiler's wait/warmup/active window is put at the start of the run and the steps inside it are
excluded: the number is the steady-state cost of being instrumented, not the cost of the
profiler's active window (which is paid for a few steps only).

    python benchmarks/trainer_overhead.py [--nproc 2] [--train-iters 30] [--repeats 2] [-- extra]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WINDOW = ["--profile-wait", "1", "--profile-warmup", "1", "--profile-active", "1"]
SKIP_STEPS = 5  # start-up steps and the profiler window (steps 0-2) are not measured
OFF = ["--no-profile", "--no-comm-log", "--no-metrics"]
ON = ["--profile", *WINDOW, "--comm-log", "--metrics"]


def run(nproc: int, iters: int, telemetry: list[str], extra: list[str], out: Path) -> list[float]:
    cmd = [sys.executable, "-m", "instrumented_trainer", "--nproc", str(nproc), "--out", str(out),
           "--train-iters", str(iters), *telemetry, *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    lines = (out / "steps.jsonl").read_text().splitlines()
    return [json.loads(x)["step_seconds"] for x in lines][SKIP_STEPS:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--train-iters", type=int, default=30)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("extra", nargs="*", help="more trainer flags (after --)")
    args = p.parse_args()
    extra = args.extra or ["--pipeline-model-parallel-size", "2"]
    steps: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, flags in (("off", OFF), ("on", ON)):
                out = Path(tmp) / f"{name}-{i}"
                steps[name] += run(args.nproc, args.train_iters, flags, extra, out)
    off, on = statistics.median(steps["off"]), statistics.median(steps["on"])
    result = {"config": extra, "nproc": args.nproc, "median_step_seconds_off": off,
              "median_step_seconds_on": on, "ratio_on_off": on / off,
              "steps_measured": len(steps["on"])}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
