"""Two runs side by side: how a user checks that a recommendation paid off.

Problem: after a re-run the user wants one table with the numbers that moved: step time,
where the time goes (compute, exposed communication, idle), the pipeline bubble, busbw per
axis and throughput, each before, after and the change. Values come from the two
Diagnoses as they are; a value one run cannot give is None, not zero.
"""
from __future__ import annotations

from dataclasses import field
from typing import Optional

import numpy as np

from ..runmeta import RunFacts
from ..analysis.results import Diagnosis, steps_in_window
from ..record import record

CONFIG_KEYS = ("tp", "pp", "dp", "micro_batch_size", "num_micro_batches", "global_batch_size",
               "pipeline_schedule", "overlap_grad_reduce", "ddp_bucket_size", "dtype")


@record
class Row:
    metric: str
    unit: str
    a: Optional[float]
    b: Optional[float]
    better: str = "lower"          # which direction is an improvement: lower | higher

    @property
    def change(self) -> Optional[float]:
        """b / a - 1; None when either is unknown or a is 0."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a - 1


@record
class Comparison:
    a: str
    b: str
    config: list = field(default_factory=list)     # [key, value in A, value in B] where they differ
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _steps(d: Diagnosis) -> int:
    return steps_in_window(d.ranks)


def _mean_per_step(d: Diagnosis, attr: str) -> Optional[float]:
    if not d.ranks:
        return None
    return float(np.mean([getattr(r.breakdown, attr) for r in d.ranks])) / _steps(d)


def _axis(d: Diagnosis, axis: str, what: str) -> Optional[float]:
    a = next((x for x in (d.comm.axes if d.comm else []) if x.axis == axis), None)
    if a is None:
        return None
    return a.exposed_per_step_s if what == "exposed" else a.comm_s / _steps(d)


def _busbw(d: Diagnosis, axis: str) -> Optional[float]:
    """busbw (GB/s) of the axis's most time-consuming op with a busbw, transfer basis preferred."""
    ops = [o for o in (d.comm.ops if d.comm else []) if o.axis == axis and o.busbw_median_gbps]
    best = [o for o in ops if o.busbw_basis == "transfer"] or ops
    return max(best, key=lambda o: o.time_s).busbw_median_gbps if best else None


def _metrics(d: Diagnosis) -> dict:
    t, p = d.throughput, d.pipeline
    tok = t.tokens_per_s_per_gpu if t else None
    out = {("step time", "ms"): (t.step_time_s * 1e3 if t and t.step_time_s else None, "lower"),
           ("tokens/s/GPU", "tokens/s"): (tok, "higher"),
           ("MFU", "%"): (100 * t.mfu if t and t.mfu else None, "higher"),
           ("compute", "ms/step"): (_ms(_mean_per_step(d, "compute_s")), "lower"),
           ("exposed communication", "ms/step"): (_ms(_mean_per_step(d, "comm_s")), "lower"),
           ("idle", "ms/step"): (_ms(_mean_per_step(d, "idle_s")), "lower"),
           ("pipeline bubble (worst stage)", "% step"):
               (100 * max((s.bubble_fraction or 0) for s in p.stages) if p and p.stages else None, "lower")}
    for axis in ("tp", "pp", "dp"):
        out[(f"{axis.upper()} exposed", "ms/step")] = (_ms(_axis(d, axis, "exposed")), "lower")
        out[(f"{axis.upper()} busbw", "GB/s")] = (_busbw(d, axis), "higher")
    return out


def _ms(s: Optional[float]) -> Optional[float]:
    return None if s is None else s * 1e3


def compare(a: Diagnosis, b: Diagnosis) -> Comparison:
    ma, mb = _metrics(a), _metrics(b)
    c = Comparison(a=a.source, b=b.source)
    for key, (va, better) in ma.items():
        vb = mb[key][0]
        if va is not None or vb is not None:
            c.rows.append(Row(key[0], key[1], va, vb, better))
    ra, rb = a.run or RunFacts(), b.run or RunFacts()
    c.config = [[k, getattr(ra, k), getattr(rb, k)] for k in CONFIG_KEYS if getattr(ra, k) != getattr(rb, k)]
    if a.run is None or b.run is None:
        c.notes.append("a run without diag_run.json: its configuration is unknown")
    if (a.world_size or 0) != (b.world_size or 0):
        c.notes.append(f"world sizes differ ({a.world_size} vs {b.world_size}): compare tokens/s/GPU, not step time")
    if a.backend != b.backend:
        c.notes.append(f"backends differ ({a.backend} vs {b.backend})")
    return c
