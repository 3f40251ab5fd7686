"""The closed loop's record: every kept reading of bench_tune.py, priced again by the model at this code.

bench_tune.py reads each lever once, on a machine whose pairs of runs move by 10-50 points and whose
level moves from hour to hour, so one reading cannot tell the model's bias from the day's. This reads
the runs every kept reading left (DIR/<lever>/before, after, before-i, after-i: bench_tune.py's and
`diag tune`'s layout), prices each "before" run's change again with the model as it is now (that run's
recommendation of the lever with the flags its "after" run ran: tune.price_again; a declined lever's
change as bench_tune.py prices it), measures each pair's change from the two runs' unprofiled steps
(tune.pair_changes), and prints per lever, over every reading together: the readings and pairs, the
median price, the median measured change with its interval (tune.median_interval), the step error
between the two, how many readings met issue #19's goal on their own (their prices' median against
their pairs'), and the peak memory's error. A model change can so be read against every stored
measurement in minutes, where a new reading takes twenty and says less. CPU readings only (a run
whose diag_run.json says `cuda` is left out, and counted).

    python benchmarks/tune_record.py [DIR ...] [--only interleave,...] [--jobs 2] [--by-reading]
        (default DIR: bench_out/tune-*, bench_out/tune, every reading kept there)
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_tune import (CASES, DECLINED, GOAL_MEMORY, GOAL_STEP, MEMORY_GIB, _pct, declined_memory,  # noqa: E402
                        declined_price, near_zero)
from diag.advise.recommend import advise  # noqa: E402
from diag.advise.tune import measured_peak_memory, measured_steps, median_interval, pair_changes, step_error  # noqa: E402
from diag.analysis import diagnose  # noqa: E402
from diag.analysis.collect import load_summaries  # noqa: E402
from diag.trace.columns import median  # noqa: E402


@dataclass
class Pair:
    """One pair of runs of a reading: the before run's price of the change, both runs' unprofiled steps,
    the change's predicted and measured peak memory (bytes); skip: why the pair is left out."""
    reading: str
    lever: str
    index: int
    price: Optional[float] = None
    before: list = field(default_factory=list)
    after: list = field(default_factory=list)
    memory_predicted: Optional[float] = None
    memory_measured: Optional[float] = None
    skip: str = ""


def pairs_of(reading: str, lever: str) -> list[tuple[int, str, str]]:
    """(index, before dir, after dir) of every pair the reading kept for the lever, in run order. A run
    older than the one before it (a directory an earlier, longer reading left in the same place) ends
    the pairs: it is not this reading's."""
    base, out, last = os.path.join(reading, lever), [], 0.0
    for i in range(0, 1000):
        suffix = f"-{i}" if i else ""
        b, a = os.path.join(base, "before" + suffix), os.path.join(base, "after" + suffix)
        try:
            times = [os.stat(os.path.join(x, "steps.jsonl")).st_mtime for x in (b, a)]
        except OSError:
            break
        if not last <= times[0] <= times[1]:
            break
        out.append((i, b, a))
        last = times[1]
    return out


def _command_flags(out: str) -> list[str]:
    with open(os.path.join(out, "diag_run.json")) as f:
        meta = json.load(f)
    if meta.get("device") == "cuda":
        raise ValueError("a GPU run")
    return shlex.split(meta.get("command") or "")


def flag_values(args: list[str]) -> dict:
    """--flag -> its value as the trainer reads it (the last one given wins, as argparse's); None for a
    flag followed by another flag or by nothing (a switch)."""
    out = {}
    for i, x in enumerate(args):
        if x.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else None
            out[x] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def ran_as(ran: dict, flag: str, value) -> bool:
    """Whether a run's flags (flag_values) carry a recommendation's flag as it sets it: None, removed
    (the trainer's default); "", a switch given; else that value."""
    if value is None:
        return flag not in ran
    return flag in ran and ran[flag] == (value or None)


def _shape(lever: str) -> Optional[dict]:
    gib = MEMORY_GIB.get(lever)
    return {"memory_per_gpu_bytes": int(gib * (1 << 30))} if gib else None


def price(lever: str, d, after_args: list[str]) -> tuple[Optional[float], Optional[float]]:
    """(the change the model prices from diagnosis d, its predicted peak memory per rank): the lever's
    recommendation whose flags the after run ran; a declined lever's change as bench_tune.py prices it."""
    if lever in DECLINED:
        return declined_price(d, lever)[2], declined_memory(d, lever)[1]
    ran = flag_values(after_args)
    for r in advise(d).recommendations:
        if r.rule == lever and r.step_s_before and r.step_s_after is not None and \
                all(ran_as(ran, k, v) for k, v in r.flags.items()):
            return r.step_s_after / r.step_s_before - 1, r.memory_after_bytes
    return None, None


def measure(job: tuple) -> Pair:
    """One pair, read and priced (a worker's task: nothing shared)."""
    reading, lever, i, b, a = job
    p = Pair(os.path.basename(os.path.normpath(reading)), lever, i)
    try:
        args = _command_flags(a)
        db = diagnose(load_summaries(b), shape=_shape(lever))
        da = diagnose(load_summaries(a), shape=_shape(lever))
        p.before, p.after = measured_steps(b, db.run), measured_steps(a, da.run)
        p.price, p.memory_predicted = price(lever, db, args)
        p.memory_measured = measured_peak_memory(a, da)
    except Exception as e:                   # noqa: BLE001 - one unreadable pair is one pair left out
        p.skip = f"{type(e).__name__}: {str(e)[:100]}"
    return p


def read(pairs: list[Pair]) -> tuple[list[Pair], list[float], list[float]]:
    """(the pairs read, their prices, their measured changes)."""
    ok = [p for p in pairs if not p.skip and p.before and p.after]
    return ok, [p.price for p in ok if p.price is not None], pair_changes([p.before for p in ok], [p.after for p in ok])


def reading_figures(pairs: list[Pair]) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """One reading's (median price, median measured change, step error) of a lever's pairs; None where unread."""
    _, prices, changes = read(pairs)
    pred = float(median(prices)) if prices else None
    meas = float(median(changes)) if changes else None
    return pred, meas, step_error(pred, meas)


def by_reading(levers: list[str], pairs: list[Pair]) -> list[str]:
    """A table of the readings (rows) by lever: each reading's median price / median measured change
    (step error), so that an hour's or a day's misses show as a row."""
    readings = sorted({p.reading for p in pairs})
    lines = ["| reading | " + " | ".join(levers) + " |", "|---|" + "---|" * len(levers)]
    for r in readings:
        cells = []
        for lever in levers:
            pred, meas, e = reading_figures([p for p in pairs if p.reading == r and p.lever == lever])
            cells.append("-" if pred is None or meas is None else
                         f"{_pct(pred)} / {_pct(meas)}" + ("" if e is None or near_zero(lever, pred) else f" ({100 * e:.0f}%)"))
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return lines


def lever_row(lever: str, pairs: list[Pair]) -> tuple[list[str], Optional[float]]:
    """The lever's cells over every reading's pairs, and its pooled step error (None: declined, or unread)."""
    ok, prices, changes = read(pairs)
    readings = sorted({p.reading for p in ok})
    if not prices or not changes:
        return [lever, str(len(readings)), str(len(changes)), *["-"] * 6], None
    pred, meas = float(median(prices)), float(median(changes))
    iv = median_interval(changes) if len(changes) > 1 else None
    declined = near_zero(lever, pred)
    met = 0
    for r in readings:
        _, _, e = reading_figures([p for p in ok if p.reading == r])
        met += e is not None and e <= GOAL_STEP
    mem = [p.memory_predicted / p.memory_measured - 1 for p in ok if p.memory_predicted and p.memory_measured]
    err = step_error(pred, meas)
    step_cell = f"{100 * abs(pred - meas):.1f} pts (declined)" if declined else f"{100 * err:.0f}%"
    return [lever, str(len(readings)), str(len(changes)), _pct(pred), _pct(meas),
            "-" if iv is None else f"{_pct(iv[0])}..{_pct(iv[1])} ({100 * iv[2]:.0f}%)", step_cell,
            "-" if declined else f"{met} of {len(readings)}",
            _pct(float(median(mem))) if mem else "-"], None if declined else err


HEAD = ["lever", "readings", "pairs", "predicted (median of prices)", "measured (median of pairs)",
        "measured interval", "step error", "readings within 25%", "memory error (median)"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="*", help="readings (bench_tune.py --out DIRs); default: bench_out/tune-*, bench_out/tune")
    ap.add_argument("--only", default="", help="comma-separated levers (default: all of bench_tune.py's CPU cases)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes reading runs")
    ap.add_argument("--by-reading", action="store_true",
                    help="also a table of each reading's price / measured change (step error) per lever")
    a = ap.parse_args()
    dirs = a.dirs or sorted(glob.glob(os.path.join("bench_out", "tune-*")) + glob.glob(os.path.join("bench_out", "tune")))
    dirs = [d for d in dirs if os.path.isdir(d)]
    levers = [x for x in a.only.split(",") if x] or list(CASES)
    unknown = [x for x in levers if x not in CASES]
    if unknown:
        raise SystemExit(f"tune_record: no CPU case for {', '.join(unknown)} (have: {', '.join(CASES)})")
    jobs = [(r, lever, i, b, af) for r in dirs for lever in levers for i, b, af in pairs_of(r, lever)]
    if not jobs:
        raise SystemExit(f"tune_record: no pair of runs under {', '.join(dirs) or 'bench_out'}: run "
                         "benchmarks/bench_tune.py (make bench-tune) first")
    print(f"tune_record: {len(jobs)} pairs in {len(dirs)} readings, {a.jobs} processes", file=sys.stderr, flush=True)
    pairs: list[Pair] = []
    with ProcessPoolExecutor(max(1, a.jobs)) as pool:
        for n, p in enumerate(pool.map(measure, jobs, chunksize=1), 1):
            pairs.append(p)
            if n % 20 == 0 or n == len(jobs):
                print(f"  {n} of {len(jobs)} pairs read", file=sys.stderr, flush=True)
    skipped = [p for p in pairs if p.skip]
    rows = [lever_row(lever, [p for p in pairs if p.lever == lever]) for lever in levers]
    print("| " + " | ".join(HEAD) + " |\n|" + "---|" * len(HEAD))
    for cells, _ in rows:
        print("| " + " | ".join(cells) + " |")
    if a.by_reading:
        print("\n" + "\n".join(by_reading(levers, pairs)))
    errs = [(cells[0], e) for cells, e in rows if e is not None]
    out = [f"{n} {100 * e:.0f}%" for n, e in errs if e > GOAL_STEP]
    print(f"\npooled: step change within {100 * GOAL_STEP:.0f}% for {len(errs) - len(out)} of {len(errs)} levers"
          + (f" (out: {', '.join(out)})" if out else "")
          + f"; memory goal {100 * GOAL_MEMORY:.0f}% (per lever above)")
    if skipped:
        print(f"{len(skipped)} pairs left out: " + "; ".join(f"{p.reading}/{p.lever}/{p.index}: {p.skip}"
                                                              for p in skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
