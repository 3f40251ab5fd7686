"""Typed recommendation results: what was seen, what to change, what it should buy.

A Recommendation is part of the Diagnosis (`Diagnosis.recommendations`) and of its JSON
form, so every number in it must trace back to a number in the report: the evidence names
the metric, its value and the threshold that fired the rule; the prediction comes from the
step-time model calibrated on the same diagnosis (calibrate.py). docs/recommendations.md
documents every field.
"""
from __future__ import annotations

import math
from dataclasses import field
from typing import Optional

from ..record import record

CONFIDENCES = ("high", "medium", "low")


def amount(x: float, unit: str) -> str:
    """An evidence value or threshold in its unit, as the report and the notes both show it."""
    if unit.startswith("fraction"):
        return f"{100 * x:.1f}%"
    if unit == "ratio":
        return f"{x:.2f}"
    # three significant digits without switching to exponent notation (1,008 not 1.01e+03)
    digits = max(0, 2 - int(math.floor(math.log10(abs(x))))) if x else 0
    return f"{x:,.{digits}f} {unit}"


@record
class Evidence:
    """One measured number that fired a rule."""

    metric: str                        # e.g. "pipeline bubble, stage 0"
    value: float
    threshold: float
    unit: str                          # "fraction of step", "ms/step", "ratio", ...
    source: str = ""                   # where in the report it is ("Pipeline bubble per stage")


@record
class Recommendation:
    """One configuration change, with its predicted step time and memory."""

    rule: str                          # bubble | dp_overlap | dp_bucket | tp_layout | cp_down | micro_batch | rebalance | bf16 | straggler
                                       # | <axis>_exposed (unpriced: the model could not be calibrated)
    title: str                         # one line: the change, in words
    evidence: list[Evidence]
    flags: dict                        # trainer / Megatron-LM flag -> new value ("" for a switch turned on,
                                       # None for a flag removed)
    command: Optional[str]             # the exact re-run command; None when the run's command is unknown
    step_s_before: Optional[float]     # measured median step time
    step_s_after: Optional[float]      # predicted by the calibrated model
    tokens_per_s_before: Optional[float] = None   # whole job
    tokens_per_s_after: Optional[float] = None
    confidence: str = "low"
    why: str = ""                      # the mechanism, in one or two sentences
    assumptions: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)   # what to look at (stragglers), when there is no flag
    runnable: bool = True              # False when the instrumented trainer lacks the flag (Megatron-LM only)
    upper_bound: bool = False          # step_s_after is the best case (the whole loss removed), not a prediction
    memory_before_bytes: Optional[float] = None   # modelled peak of the largest rank, measured configuration
    memory_after_bytes: Optional[float] = None    # ... after the change (advise/memory.py)
    memory_capacity_bytes: Optional[float] = None  # the device's memory (--memory-per-gpu); None: unknown
    memory: list[str] = field(default_factory=list)   # the arithmetic behind the two peaks

    def __post_init__(self) -> None:
        if self.confidence not in CONFIDENCES:
            raise ValueError(f"confidence must be one of {CONFIDENCES}, got {self.confidence!r}")
        if not self.evidence:
            raise ValueError(f"{self.rule}: no recommendation without evidence")

    @property
    def flag_words(self) -> str:
        """The flags as a person reads them: `--size 2 --switch-on no --flag-removed`."""
        return " ".join(k if v == "" else f"no {k}" if v is None else f"{k} {v}" for k, v in self.flags.items())

    @property
    def gain(self) -> Optional[float]:
        """Predicted fraction of the step saved: 1 - after / before."""
        if not self.step_s_before or self.step_s_after is None:
            return None
        return 1.0 - self.step_s_after / self.step_s_before


@record
class Basis:
    """What a diagnosis's recommendations rest on, carried beside them in the Diagnosis."""

    calibration: list[str] = field(default_factory=list)   # assumptions and measured inputs, in words
    model_step_s: Optional[float] = None                   # the model's step time for the measured config
    measured_step_s: Optional[float] = None
    nothing: Optional[str] = None                          # why nothing is recommended, when nothing is


@record
class Advice:
    """The ranked recommendations for one diagnosis, and what the model was calibrated on."""

    recommendations: list[Recommendation] = field(default_factory=list)
    calibration: list[str] = field(default_factory=list)   # assumptions and measured inputs, in words
    model_step_s: Optional[float] = None                   # the model's step time for the measured config
    measured_step_s: Optional[float] = None
    nothing: Optional[str] = None                          # why nothing is recommended, when nothing is
    memory_parts: list = field(default_factory=list)       # analysis.results.MemoryParts per stage, measured config
    memory_basis: Optional[str] = None                     # the memory model's calibration, or why there is none

    @classmethod
    def of(cls, d) -> "Advice":
        """The advice a Diagnosis carries (advise.recommend.with_advice computed it once)."""
        b = d.advice_basis or Basis()
        return cls(recommendations=list(d.recommendations), calibration=list(b.calibration),
                   model_step_s=b.model_step_s, measured_step_s=b.measured_step_s, nothing=b.nothing)
