"""What every rule needs to turn evidence into a Recommendation: pricing and the re-run command.

Problem: the rules (rules.py) should each read like one paragraph of reasoning. The shared
work lives here: pricing candidate configurations with the calibrated model and keeping the
best, the confidence that follows from how well the model fits the measured run, and the
exact command that re-runs the job with the changed flags.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable, Optional

from ..analysis.results import AxisOverlap, Diagnosis
from .calibrate import Calibration
from .results import Evidence, Recommendation

MIN_GAIN = 0.02            # a change the model prices under 2% of the step is not worth a re-run
PREFER_SHARE = 0.8         # with `prefer`, the smallest change within 80% of the best predicted gain


def ev(metric: str, value: float, threshold: float, unit: str, source: str = "") -> Evidence:
    return Evidence(metric=metric, value=float(value), threshold=float(threshold), unit=unit, source=source)


def rerun_command(command: Optional[str], flags: dict, rule: str) -> Optional[str]:
    """The run's command with `flags` set (value "" = a switch, None = removed) and a new --out."""
    if not command:
        return None
    args = shlex.split(command)
    out = {}
    for i, a in enumerate(args):
        if a == "--out" and i + 1 < len(args):
            out["--out"] = args[i + 1].rstrip("/") + f"-{rule}"
    for flag, value in {**flags, **out}.items():
        if flag in args:
            i = args.index(flag)
            has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
            del args[i:i + 1 + has_value]
        if value is not None:
            args += [flag] + ([value] if value != "" else [])
    return shlex.join(args)


def _confidence(fit_error: float) -> str:
    return "high" if fit_error <= 0.10 else "medium" if fit_error <= 0.25 else "low"


@dataclass
class Context:
    d: Diagnosis
    cal: Optional[Calibration]
    step_s: Optional[float]

    def axis(self, name: str) -> Optional[AxisOverlap]:
        return next((a for a in (self.d.comm.axes if self.d.comm else []) if a.axis == name), None)

    def make(self, rule: str, title: str, evidence: list, flags: dict, after: Optional[float],
             confidence: Optional[str] = None, **kw) -> list[Recommendation]:
        """One recommendation, or none when the predicted gain is below MIN_GAIN."""
        if after is not None and self.step_s and rule != "straggler" and after > self.step_s * (1 - MIN_GAIN):
            return []
        conf = confidence or (_confidence(self.cal.fit_error) if self.cal else "low")
        runnable = kw.pop("runnable", True)
        cmd = rerun_command(self.d.run.command if self.d.run else None, flags, rule) if flags and runnable else None
        tokens = (self.cal.tokens_per_step if self.cal else None) or \
            (self.d.throughput.tokens_per_step if self.d.throughput else None)
        rate = (lambda s: tokens / s if tokens and s else None)
        assumptions = kw.pop("assumptions", [])
        return [Recommendation(rule=rule, title=title, evidence=evidence, flags=flags, command=cmd,
                               step_s_before=self.step_s, step_s_after=after,
                               tokens_per_s_before=rate(self.step_s), tokens_per_s_after=rate(after),
                               confidence=conf, runnable=runnable, assumptions=assumptions, **kw)]

    def best(self, rule: str, candidates: list, evidence: list, title: Callable, slowdown=None,
             prefer: Optional[Callable] = None, **kw) -> list[Recommendation]:
        """Price (config, workload or None, flags) candidates with the model; propose the fastest."""
        if not candidates:
            return []
        priced = [(self.cal.predict(c, w, slowdown), c, f) for c, w, f in candidates]
        after, config, flags = min(priced, key=lambda x: x[0])
        if self.step_s and after >= self.step_s:
            return []                                # no candidate is predicted to be faster
        if prefer is not None and self.step_s:      # the smallest change that gets most of the best gain
            enough = [x for x in priced if self.step_s - x[0] >= PREFER_SHARE * (self.step_s - after)]
            after, config, flags = min(enough, key=lambda x: prefer(x[1]))
        alts = [f"{title(c)}: {a * 1e3:,.1f} ms predicted" for a, c, _ in sorted(priced, key=lambda x: x[0])[1:]]
        kw["assumptions"] = kw.get("assumptions", []) + (["other candidates: " + "; ".join(alts)] if alts else [])
        return self.make(rule, title(config), evidence, flags, after, **kw)
