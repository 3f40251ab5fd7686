"""The closed loop: run the trainer, diagnose, apply the top recommendation, re-run, and check.

Problem: a predicted gain is only worth trusting if the tool checks it. `tune` runs the
instrumented trainer (a subprocess: diag never imports torch) with a configuration, analyses
its traces, takes the top recommendation the trainer can run, re-runs with exactly its
command, and reports predicted against measured change of the step time.

Measured step time, two ways: from `steps.jsonl`, the unprofiled steps (after the first): the
step time training really gets, so the basis of `error`: each run's median; a configuration's
step, the median of those over its runs (`across_runs`); the measured change, the median over the
pairs of runs made one after the other (before i, then after i) of after i / before i - 1
(`paired_change`): the load of a shared machine drifts between pairs more than within one, and with
three pairs or more a pair that other work disturbed does not set it; and the median
ProfilerStep time of the traces (profiled steps, slowed by the profiler itself, the basis the
model is calibrated on). Both are reported.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from math import comb
from dataclasses import field
from typing import Optional

from ..runmeta import RunFacts
from ..analysis import diagnose
from ..analysis.collect import load_summaries
from ..analysis.results import Diagnosis
from ..trace.columns import median
from .recommend import DECLINED, advise
from .results import Recommendation
from ..record import record

SKIP_FIRST = 1             # steps: allocator and gloo warm-up
SETTLE = 0.10              # the measured change's interval (median_interval) this wide or less: no more pairs,
SETTLE_SHARE = 0.25        # and its half-width this share of the median change or less (a change of -12% is
                           # known to within 3 points before a prediction's error against it can be read)
COVERAGE = 0.75            # the least coverage of that interval


class TuneError(RuntimeError):
    """The trainer failed or left nothing to analyse (the message says which run)."""


@record
class Run:
    out: str
    command: str
    step_s: float                  # steps.jsonl outside the profiled window: the median of the runs' medians
    steps: int                     # how many steps that median is over
    runs: int                      # the profiled run and its unprofiled repeats
    trace_step_s: Optional[float]  # median ProfilerStep time, all ranks and repeats (the model's basis)
    diagnosis: Diagnosis = field(repr=False)


@record
class TuneResult:
    before: Run
    after: Optional[Run]
    applied: Optional[Recommendation]
    predicted_change: Optional[float] = None   # after / before - 1, from the model: median of predicted_changes
    measured_change: Optional[float] = None    # from steps.jsonl (unprofiled steps): paired_change
    predicted_changes: list = field(default_factory=list)  # per "before" run, its calibration's price of the
                                                           # change (None: that run's recommendation differed)
    measured_changes: list = field(default_factory=list)   # per pair of runs: pair_changes
    trace_change: Optional[float] = None       # from the traces' median step times (profiled steps)
    message: str = ""
    memory_before: Optional[float] = None      # measured peak memory per rank (largest), bytes
    memory_after: Optional[float] = None
    stopped: str = ""                          # why the pairs stopped: "settled", "repeats" (no more asked),
                                               # "max_repeats" or "max_minutes" (settled not reached)

    @property
    def measured_interval(self) -> Optional[tuple[float, float, float]]:
        """The measured change's interval over the pairs (median_interval: lo, hi, coverage); None
        with fewer than two pairs."""
        return median_interval(self.measured_changes) if len(self.measured_changes) > 1 else None

    @property
    def settled(self) -> bool:
        """Whether the pairs pin the measured change down (settled): if not, its error is not yet
        read to 25%."""
        return settled(self.measured_changes)

    @property
    def error(self) -> Optional[float]:
        """|predicted - measured| / |measured| change, measured on the unprofiled steps."""
        return step_error(self.predicted_change, self.measured_change)


def step_error(predicted: Optional[float], measured: Optional[float]) -> Optional[float]:
    """|predicted - measured| / |measured| change; None where either is unknown or nothing was measured."""
    if predicted is None or not measured:
        return None
    return abs(predicted - measured) / abs(measured)


def _argv(command: str, out: str, python: str) -> list[str]:
    args = shlex.split(command)
    if args[:3] == ["python", "-m", "instrumented_trainer"] or args[1:3] == ["-m", "instrumented_trainer"]:
        args = args[3:]
    i = args.index("--out") if "--out" in args else None
    if i is not None:
        del args[i:i + 2]
    # The trainer's background `diag summarize` would run in the very steps measured here (right
    # after the profiler's window), and tune reads the traces at once itself: no summaries (said once:
    # a re-run's command, from a run tune made, says it already).
    args = [a for a in args if a != "--no-trace-summary"]
    return [python, "-m", "instrumented_trainer", *args, "--no-trace-summary", "--out", out]


def measured_steps(out: str, meta: Optional[RunFacts]) -> list[float]:
    prof = meta.profile if meta is not None else None
    lo = prof.wait if prof is not None and prof.enabled else 10**9
    hi = lo + (prof.warmup + prof.active if prof is not None else 0)   # + 1: the export step
    return [r["step_seconds"] for r in step_rows(out) if r["step"] >= SKIP_FIRST and not lo <= r["step"] <= hi]


def step_rows(out: str) -> list[dict]:
    """The trainer's steps.jsonl rows (one parser for step times and peak memory)."""
    path = os.path.join(out, "steps.jsonl")
    try:
        with open(path) as f:
            return [json.loads(x) for x in f if x.strip()]
    except OSError as e:
        raise TuneError(f"{path}: cannot read: {e.strerror or e}") from None


def _train(argv: list[str], timeout: float) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise TuneError(f"trainer timed out after {timeout:.0f}s: {shlex.join(argv)}") from None
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise TuneError(f"trainer exited {p.returncode}: {tail} ({shlex.join(argv)})")


def analyse(out: str, shape: Optional[dict] = None, bench=None) -> Diagnosis:
    """A run's diagnosis, with `shape`'s facts over the run's (e.g. memory_per_gpu_bytes) and `bench`, a
    `diag bench` busbw curve (analysis.benchcurve), to set its collectives against (dp_bucket_curve)."""
    return diagnose(load_summaries(out), shape=shape, bench=bench)


def run(command: str, out: str, python: str = sys.executable, timeout: float = 600,
        shape: Optional[dict] = None, bench=None) -> Run:
    """One profiled run, analysed (analyse); its unprofiled steps measured."""
    argv = _argv(command, out, python)
    _train(argv, timeout)
    d = analyse(out, shape, bench)
    steps = measured_steps(out, d.run)
    if not steps:
        raise TuneError(f"{out}: no step outside the profiler window to measure: raise --train-iters")
    return Run(out=out, command=shlex.join(argv), step_s=float(median(steps)), steps=len(steps), runs=1,
               trace_step_s=d.throughput.step_time_s if d.throughput else None, diagnosis=d)


def across_runs(runs: list) -> float:
    """The step time of a configuration run several times: the median of each run's median of its
    unprofiled steps (runs: one list of step seconds per run)."""
    return float(median([median(x) for x in runs if len(x)]))


def pair_changes(before: list, after: list) -> list[float]:
    """Per pair of runs made one after the other (before[i], then after[i]; each a list of step
    seconds): median(after[i]) / median(before[i]) - 1 (pairs with an empty side left out)."""
    return [float(median(a) / median(b) - 1) for b, a in zip(before, after) if len(a) and len(b)]


def paired_change(before: list, after: list) -> float:
    """The measured change of runs made in pairs: the median over the pairs of their change."""
    return float(median(pair_changes(before, after)))


def median_interval(values: list, coverage: float = COVERAGE) -> Optional[tuple[float, float, float]]:
    """The distribution-free interval for the median of what `values` sample: (lo, hi, its coverage).
    Sorted x(1) <= ... <= x(n), [x(k), x(n+1-k)] holds the median with probability
    1 - 2 P(Binomial(n, 1/2) <= k - 1), whatever the distribution; k is the largest whose coverage is
    at least `coverage` (k = 1, the range, where none is: fewer than 4 values at 75%). So the interval
    drops extremes as values accrue (6 at 75%: [x(2), x(5)], 78%), where the range only widens. None
    without values."""
    xs = sorted(values)
    n = len(xs)
    if not n:
        return None
    def cover(k: int) -> float:
        return 1 - 2 * sum(comb(n, i) for i in range(k)) / 2 ** n
    k = max((k for k in range(1, (n + 1) // 2 + 1) if cover(k) >= coverage), default=1)
    return float(xs[k - 1]), float(xs[n - k]), cover(k)


def settled(changes: list, spread: float = SETTLE, coverage: float = COVERAGE, share: float = SETTLE_SHARE) -> bool:
    """Whether the pairs' changes pin the measured change down: their median's interval
    (median_interval) at `coverage` at least (so never on fewer than three pairs at 75%), no wider
    than `spread` (a fraction: 0.10 is 10 points) and no wider either side of the median than `share`
    of it (0.25: a -12% change to within 3 points, the precision a relative error of 25% needs to be
    read; a change near zero does not settle: its pairs run to the limit)."""
    iv = median_interval(changes, coverage)
    if iv is None or iv[2] < coverage:
        return False
    return bool(iv[1] - iv[0] <= min(spread, 2 * share * abs(median(changes))))


def stop_pairs(changes: list, spent_s: float, pair_s: float, max_minutes: Optional[float] = None) -> str:
    """Why no more pairs are made past the asked ones, or "" to make one: "settled" (settled), or
    "max_minutes" where one more pair (pair_s seconds) would take the pairs, `spent_s` so far, past
    max_minutes."""
    if settled(changes):
        return "settled"
    if max_minutes is not None and spent_s + pair_s > 60 * max_minutes:
        return "max_minutes"
    return ""


_STOPPED = {"settled": "settled", "repeats": "the --repeats asked",
            "max_repeats": "not settled at --max-repeats", "max_minutes": "not settled in --max-minutes"}


def _pair_said(say, n: int, before: list, after: list, seconds: Optional[float], out: str) -> None:
    """Progress: pair n's two runs' medians and its change (pair_changes), as it ends (seconds: the
    pair's, where both its runs were timed here)."""
    change = pair_changes(before[-1:], after[-1:])
    took = "" if seconds is None else f" ({seconds:.0f} s)"
    steps = (f"{1e3 * median(before[-1]):.1f} -> {1e3 * median(after[-1]):.1f} ms a step, {100 * change[0]:+.1f}%"
             if change else "n/a")
    say(f"pair {n}: {steps}{took}: {out}")


def repeat(r: Run, runs: list, traced: list, out: str, python: str, timeout: float,
           shape: Optional[dict] = None, bench=None) -> Diagnosis:
    """Run r's command again (profiled, as the diagnosed run); add its unprofiled step times (one
    more list in runs) and its traced ones; its diagnosis (analyse)."""
    _train(_argv(r.command, out, python), timeout)
    d = analyse(out, shape, bench)
    runs.append(measured_steps(out, d.run))
    traced += [s.host_s for x in d.ranks for s in x.steps]
    r.runs += 1
    return d


def price_again(d: Diagnosis, rec: Recommendation) -> Optional[float]:
    """The change `rec` makes, priced by the model calibrated on another run of its configuration
    (`d`): that run's recommendation of the same rule with the same flags, after / before - 1;
    None where it has none (its calibration chose another value, or declined the change)."""
    same = next((x for x in advise(d).recommendations if x.rule == rec.rule and x.flags == rec.flags
                 and x.step_s_before and x.step_s_after is not None), None)
    return same.step_s_after / same.step_s_before - 1 if same is not None else None


def _traced(d: Diagnosis) -> list:
    return [s.host_s for x in d.ranks for s in x.steps]


def measured_peak_memory(out: str, d: Diagnosis) -> Optional[float]:
    """The run's measured peak memory per rank (the largest): the Diagnosis's (diag_run.json's
    peak_memory_bytes, else the traces' GPU memory events: d.memory.peak_source), else the largest
    `peak_memory_bytes` of the trainer's steps.jsonl; None when none says."""
    if d.facts.peak_memory_bytes:
        return float(d.facts.peak_memory_bytes)
    try:
        peaks = [r.get("peak_memory_bytes") for r in step_rows(out)]
    except (TuneError, ValueError):
        return None
    peaks = [p for p in peaks if isinstance(p, (int, float)) and p > 0]
    return float(max(peaks)) if peaks else None


def tune(command: str, out_dir: str, python: str = sys.executable, timeout: float = 600,
         repeats: int = 2, rule: Optional[str] = None, memory_per_gpu: Optional[float] = None,
         max_repeats: Optional[int] = None, max_minutes: Optional[float] = None, say=None,
         bench=None) -> TuneResult:
    """Run `command` (a trainer command line), apply its top runnable recommendation (or the one of
    `rule`), re-run, compare. memory_per_gpu (bytes): the device capacity the recommender checks
    changes against (on CPU there is none to read). bench: a `diag bench` curve (analysis.benchcurve)
    every run's collectives are set against (the dp_bucket_curve rule needs one).

    repeats > 1: both configurations are run again, alternately (profiled as the first runs; their
    unprofiled steps measured), so that a change in the machine's load between runs does not pass
    for the recommendation's effect; each "before" run prices the change again (confirm).
    max_repeats > repeats: more pairs after those, one at a time, until the pairs' changes settle
    (settled: their median's interval 10 points wide or less, and within a quarter of the median
    either side) or there are max_repeats of them, or (max_minutes) one more pair would take the
    pairs past that many minutes (pairs timed as they run; the first "before" run not counted).
    say (str -> None): told of each run as it ends, and of why the pairs stopped (progress).
    """
    say = say or (lambda _: None)
    shape = {"memory_per_gpu_bytes": int(memory_per_gpu)} if memory_per_gpu else None
    t = time.monotonic()
    before = run(command, os.path.join(out_dir, "before"), python, timeout, shape, bench)
    say(f"before: {1e3 * before.step_s:.1f} ms a step ({time.monotonic() - t:.0f} s): {before.out}")
    advice = advise(before.diagnosis)
    recs = [r for r in advice.recommendations if r.command and r.runnable and (rule is None or r.rule == rule)]
    if not recs:
        declined = [n for n in advice.calibration if n.startswith(DECLINED)]
        return TuneResult(before, None, None, message="no runnable recommendation" +
                          (f" of rule {rule}" if rule else "") + ": nothing to apply" +
                          "".join(f"; {n}" for n in declined))
    say(f"applying: {recs[0].title} [{recs[0].rule}]")
    return confirm(before, recs[0], out_dir, python, timeout, repeats, shape, max_repeats=max_repeats,
                   max_minutes=max_minutes, say=say, bench=bench)


def confirm(before: Run, rec: Recommendation, out_dir: str, python: str = sys.executable, timeout: float = 600,
            repeats: int = 2, shape: Optional[dict] = None, price=None, max_repeats: Optional[int] = None,
            max_minutes: Optional[float] = None, say=None, bench=None) -> TuneResult:
    """Run `rec`'s command after `before` (its repeats alternating with before's), compare. `price`
    (diagnosis -> change or None): how a repeat of `before` prices the change (price_again).
    max_repeats: pairs past `repeats` while the pairs' changes have not settled (settled);
    max_minutes: and while one more pair (as long as the median repeated pair so far; before one,
    twice the "after" run) keeps them within that many minutes of the "after" run's start.
    say, bench: as tune's."""
    say = say or (lambda _: None)
    start = time.monotonic()
    after = run(rec.command, os.path.join(out_dir, "after"), python, timeout, shape, bench)
    pairs_s: list = []                                    # the repeats' pairs, timed
    first_pair_s = 2 * (time.monotonic() - start)         # a pair's time until one is: twice the "after" run
    tb = [measured_steps(before.out, before.diagnosis.run)]
    ta = [measured_steps(after.out, after.diagnosis.run)]
    xb, xa = _traced(before.diagnosis), _traced(after.diagnosis)
    predicted = [rec.step_s_after / rec.step_s_before - 1]
    _pair_said(say, 1, tb, ta, None, after.out)
    stopped = ""
    for i in range(1, max(repeats, max_repeats or 0)):
        if i >= repeats:
            stopped = stop_pairs(pair_changes(tb, ta), time.monotonic() - start,
                                 median(pairs_s) if pairs_s else first_pair_s, max_minutes)
            if stopped:
                break
        t = time.monotonic()
        again = repeat(before, tb, xb, os.path.join(out_dir, f"before-{i}"), python, timeout, shape, bench)
        try:
            predicted.append(price(again) if price is not None else price_again(again, rec))
        except Exception:                    # noqa: BLE001 - a repeat that cannot price loses its price only
            predicted.append(None)
        repeat(after, ta, xa, os.path.join(out_dir, f"after-{i}"), python, timeout, bench=bench)
        pairs_s.append(time.monotonic() - t)
        _pair_said(say, i + 1, tb, ta, pairs_s[-1], os.path.join(out_dir, f"after-{i}"))
    changes = pair_changes(tb, ta)
    if not stopped:                      # the loop ran out: settled by its last pair, or at its limit
        stopped = "settled" if settled(changes) else "max_repeats" if (max_repeats or 0) > repeats else "repeats"
    say(f"{len(tb)} pair{'s' * (len(tb) > 1)}: {_STOPPED[stopped]} ({time.monotonic() - start:.0f} s)")
    before.step_s, before.steps, before.trace_step_s = across_runs(tb), sum(map(len, tb)), float(median(xb))
    after.step_s, after.steps, after.trace_step_s = across_runs(ta), sum(map(len, ta)), float(median(xa))
    res = TuneResult(before, after, rec, predicted_change=float(median([p for p in predicted if p is not None])),
                     measured_change=paired_change(tb, ta), predicted_changes=predicted,
                     measured_changes=changes, stopped=stopped)
    if before.trace_step_s and after.trace_step_s:
        res.trace_change = after.trace_step_s / before.trace_step_s - 1
    res.memory_before = measured_peak_memory(before.out, before.diagnosis)
    res.memory_after = measured_peak_memory(after.out, after.diagnosis)
    return res
