"""Overhead of the trainer's telemetry on step time.

Runs the same job with telemetry off (no profiler, no comm log, no metrics thread), with the
defaults (metrics sampler, profiler armed: the comm tap runs only in its window) and with the comm
log on too (the tap in every step), alternating `--repeats` times so that drift of a shared
machine hits all three equally, and compares median step times. With telemetry on, the
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
DEFAULT = ["--profile", *WINDOW, "--no-comm-log", "--metrics"]
COMM_LOG = ["--profile", *WINDOW, "--comm-log", "--metrics"]


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
    arms = (("off", OFF), ("default", DEFAULT), ("comm_log", COMM_LOG))
    steps: dict[str, list[float]] = {name: [] for name, _ in arms}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, flags in arms:
                out = Path(tmp) / f"{name}-{i}"
                steps[name] += run(args.nproc, args.train_iters, flags, extra, out)
    med = {name: statistics.median(v) for name, v in steps.items()}
    result = {"config": extra, "nproc": args.nproc,
              **{f"median_step_seconds_{name}": round(v, 5) for name, v in med.items()},
              "ratio_default_off": round(med["default"] / med["off"], 3),
              "ratio_comm_log_off": round(med["comm_log"] / med["off"], 3),
              "steps_measured": len(steps["off"])}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
