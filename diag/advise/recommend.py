"""The front of the recommender: a Diagnosis in, ranked recommendations out.

Calibrates the step-time model on the diagnosis (when the run's shape is known), runs every
rule, and ranks what they propose by predicted time saved per step. When no rule's evidence
crosses its threshold it says so plainly instead of inventing a change.
"""
from __future__ import annotations

from ..analysis.results import Diagnosis
from . import memory as mem
from .calibrate import CalibrationError, calibrate
from .propose import Context
from .results import Advice, Basis, Recommendation
from .rules import RULES

DECLINED = "not proposed: "    # the note of a change a rule priced and did not propose (tune.py reads it)


def _saved(r: Recommendation) -> float:
    if r.step_s_before is None or r.step_s_after is None:
        return -1.0
    return r.step_s_before - r.step_s_after


def advise(d: Diagnosis) -> Advice:
    step = d.throughput.step_time_s if d.throughput else None
    try:
        cal = calibrate(d)
        notes = list(cal.assumptions)
        step = cal.measured_step_s      # the trace's, less what only the traced steps paid (the comm tap)
    except CalibrationError as e:
        cal, notes = None, [f"{e}; only rules that need no model were tried"]
    memory, mem_config, capacity, mem_notes = mem.of_diagnosis(d)
    notes += mem_notes + ([f"device memory {mem.human(capacity)} per GPU"] if capacity else
                          ["device memory unknown (--memory-per-gpu): recommendations are not checked for fit"])
    ctx = Context(d=d, cal=cal, step_s=step, memory=memory, mem_config=mem_config, capacity=capacity,
                  memory_unknown=mem_notes[0] if memory is None else "")
    recs: list[Recommendation] = []
    for rule in RULES:
        recs += rule(ctx)
    recs.sort(key=_saved, reverse=True)
    notes += [f"dropped, does not fit: {x}" for x in ctx.dropped]
    notes += [DECLINED + x for x in ctx.declined]
    nothing = None
    if not recs and ctx.declined:
        nothing = ("nothing worth changing: measured losses crossed rules' thresholds, but every change they call for "
                   "is priced under 2% of the step or declined with its reason (each with its price: \"not proposed\" "
                   "below)")
    elif not recs:
        nothing = ("nothing worth changing: no measured loss crossed a rule's threshold, or the model prices "
                   "every candidate change under 2% of the step (thresholds: docs/recommendations.md)")
    return Advice(recommendations=recs, calibration=notes, model_step_s=cal.model_step_s if cal else None,
                  measured_step_s=step, nothing=nothing,
                  memory_parts=memory.parts(mem_config) if memory is not None else [],
                  memory_basis=memory.basis if memory is not None else mem_notes[0])


def with_advice(d: Diagnosis) -> Diagnosis:
    """d with its recommendations and what they rest on, computed once for the run. Advice must not
    cost the diagnosis: a recommender failure becomes a note."""
    try:
        a = advise(d)
    except Exception as e:                       # noqa: BLE001
        failed = f"Recommendations could not be computed ({type(e).__name__}: {e}); the diagnosis above is complete"
        d.notes.append(failed)
        d.advice_basis = Basis(nothing=failed)   # said where the recommendations go, not "nothing worth changing"
        return d
    d.recommendations = a.recommendations
    d.advice_basis = Basis(calibration=a.calibration, model_step_s=a.model_step_s,
                           measured_step_s=a.measured_step_s, nothing=a.nothing)
    if d.memory is not None:
        d.memory.model, d.memory.model_basis = a.memory_parts, a.memory_basis
    return d
