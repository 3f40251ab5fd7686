"""The host operators' fixed cost (issue #19): each lever priced by the model calibrated on one
trace with and without the host terms, against the measured change.

For each lever: the job of bench_tune.py that trips it ("before") and the configuration its
recommendation runs ("after") are run alternately `--repeats` times; the measured change is the
ratio of the medians of their unprofiled steps (as `diag tune`). The predictions come from the
first "before" run's trace alone: "old" with the host terms zeroed (the model before #19), "new"
as calibrated. `pp_scenario` is the larger PP job of issue #19 (1 micro-batch of 8 -> 4 of 2).

    python benchmarks/bench_host_fixed.py [--out bench_out/host_fixed] [--repeats 2] [--only bubble,...]
"""
from __future__ import annotations

import os
import shlex
import sys
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import diag.advise.calibrate as cal_mod  # noqa: E402
from diag.advise.tune import _traced, across_runs, measured_steps, paired_change, repeat, run  # noqa: E402
from bench_tune import CASES as TRIPS, SMALL, lever_args  # noqa: E402

BIG = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --vocab-size 256 --train-iters 10 "
       "--profile-wait 1 --profile-warmup 1 --profile-active 4 --no-metrics --nproc 2 "
       "--pipeline-model-parallel-size 2 --micro-batch-size 8 --global-batch-size 8")
# lever -> (before flags, flags of the after run, the model's change)
CASES = {
    "pp_scenario": (BIG, "--micro-batch-size 2", {"micro_batch_size": 2, "num_micro_batches": 4}),
    "bubble": (SMALL + " " + TRIPS["bubble"], "--micro-batch-size 4", {"micro_batch_size": 4, "num_micro_batches": 2}),
    "micro_batch": (SMALL + " " + TRIPS["micro_batch"], "--micro-batch-size 8",
                    {"micro_batch_size": 8, "num_micro_batches": 1}),
    "tp_layout": (SMALL + " " + TRIPS["tp_layout"], "--tensor-model-parallel-size 1",
                  {"tp": 1, "dp": 2, "num_micro_batches": 2}),
    "interleave": (SMALL + " " + TRIPS["interleave"],
                   "--pipeline-schedule interleaved-1f1b --num-layers-per-virtual-pipeline-stage 1",
                   {"schedule": "interleaved", "virtual_stages": 2}),
}


def with_flags(cmd: str, flags: str) -> str:
    args, new = shlex.split(cmd), shlex.split(flags)
    for i in range(0, len(new), 2):
        if new[i] in args:
            args[args.index(new[i]) + 1] = new[i + 1]
        else:
            args += new[i:i + 2]
    return shlex.join(args)


def predict(d, change: dict, host: bool = True) -> float:
    """Predicted step change from the one trace; host=False zeroes the host terms (the old model)."""
    saved = cal_mod._host_fixed
    if not host:
        cal_mod._host_fixed = lambda *a, **k: (0.0, 0.0)
    try:
        cal = cal_mod.calibrate(d)
    finally:
        cal_mod._host_fixed = saved
    c, w = cal.config, cal.workload
    if "micro_batch_size" in change:
        w = cal_mod.with_micro_batch(w, c.micro_batch_size, change["micro_batch_size"])
    return cal.predict(replace(c, **change), w, {} if "tp" in change else None) / cal.measured_step_s - 1


def row(name: str, out: str, repeats: int) -> dict:
    flags, after_flags, change = CASES[name]
    cmd = "python -m instrumented_trainer " + flags
    b = run(cmd, f"{out}/{name}/before")
    a = run(with_flags(cmd, after_flags), f"{out}/{name}/after")
    tb, ta = [measured_steps(b.out, b.diagnosis.run)], [measured_steps(a.out, a.diagnosis.run)]
    xb, xa = _traced(b.diagnosis), _traced(a.diagnosis)
    for i in range(1, repeats):
        repeat(b, tb, xb, f"{out}/{name}/before-{i}", sys.executable, 600)
        repeat(a, ta, xa, f"{out}/{name}/after-{i}", sys.executable, 600)
    before, after = across_runs(tb), across_runs(ta)
    return dict(lever=name, old=predict(b.diagnosis, change, False), new=predict(b.diagnosis, change),
                measured=paired_change(tb, ta), noise=float(np.std(tb[0]) / np.median(tb[0])),
                before_ms=before * 1e3, after_ms=after * 1e3)


def main() -> None:
    a, only = lever_args(__doc__, "bench_out/host_fixed", CASES)
    print("| lever | predicted, old model | predicted, host terms | measured | noise | before ms | after ms |\n"
          "|---|---|---|---|---|---|---|")
    for name in only:
        r = row(name, a.out, a.repeats)
        print(f"| {name} | {100 * r['old']:+.1f}% | {100 * r['new']:+.1f}% | {100 * r['measured']:+.1f}% | "
              f"{100 * r['noise']:.1f}% | {r['before_ms']:.0f} | {r['after_ms']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
