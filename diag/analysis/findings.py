"""Rank the ways a step loses time, biggest first, each with the numbers behind it."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..trace.columns import median
from .results import CommAnalysis, Finding, FindingKind, RankResult, StragglerBasis, window_is_steps

MIN_SHARE = 0.01       # under 1% of a step is not worth a line


def _per_step(ranks: list[RankResult]) -> tuple[Optional[float], int, str]:
    """The median step in the window (None where the figures are not per step), the steps in the
    window, and what the figures are per, in words."""
    steps = max((r.window_steps for r in ranks), default=0)
    times = [r.window_step_s for r in ranks if r.window_step_s]
    step_s = float(median(times)) if times else None
    if not steps:
        return None, 0, "in the window (no ProfilerStep marks)"
    if not window_is_steps(ranks):
        span = float(median([r.breakdown.span_s for r in ranks]))
        return None, steps, (f"in the window (its ProfilerStep{'s' * (steps > 1)} do not bound the work: "
                             f"the step {step_s * 1e3:,.1f} ms, the window {span * 1e3:,.1f} ms)"
                             if step_s else "in the window")
    return step_s, steps, "per step"


def _rest_of_exposed(ranks: list[RankResult], comm: CommAnalysis, n: int, add) -> None:
    """The ranks' mean exposed communication (the breakdown's, over every communication event)
    less what the axes' rows hold (their matched collectives), so the communication rows add up
    to the per-rank exposed time the breakdown shows; the rest is communication the analysis
    could not join to a collective of an axis (a host thread's gloo work outside the matched
    spans, an unlabelled op)."""
    rank_mean = float(np.mean([r.overlap.exposed_per_step_s if r.overlap.exposed_per_step_s is not None
                               else r.overlap.exposed_s / n for r in ranks]))
    axes = sum(a.exposed_per_step_s if a.exposed_per_step_s is not None else a.exposed_s for a in comm.axes)
    rest = rank_mean - axes
    add("exposed communication not joined to an axis", rest,
        f"the ranks' mean exposed communication ({rank_mean * 1e3:,.2f} ms) less the rows per axis "
        f"({axes * 1e3:,.2f} ms)", FindingKind.COMM, small_too=True)


def findings(ranks: list[RankResult], comm: Optional[CommAnalysis]) -> list[Finding]:
    if not ranks:
        return []
    step_s, steps, unit = _per_step(ranks)
    n = max(steps, 1)
    out: list[Finding] = []

    def add(what: str, seconds: float, detail: str, kind: FindingKind, ranks: Optional[list] = None,
            small_too: bool = False) -> None:
        """small_too: kept under MIN_SHARE (the communication rows partition the exposed time: drop one
        and they no longer add up to the ranks' exposed communication)."""
        share = seconds / step_s if step_s else None
        if seconds > 0 and (share is None or share >= MIN_SHARE or small_too):
            out.append(Finding(what, seconds, share, detail, kind, list(ranks or [])))

    idle = float(np.mean([r.breakdown.idle_s for r in ranks])) / n
    timeline = ranks[0].breakdown.timeline
    worst = max(ranks, key=lambda r: r.breakdown.idle_s)
    add("GPU idle" if timeline == "gpu" else "host idle (outside operators)", idle,
        f"mean over {len(ranks)} rank(s) {unit}; most on rank {worst.rank} "
        f"({worst.breakdown.pct(worst.breakdown.idle_s):.1f}% of its span)", FindingKind.IDLE)
    mem = float(np.mean([r.breakdown.memory_s for r in ranks])) / n
    add("memory copies not hidden", mem, f"memcpy/memset not under compute or communication, {unit}",
        FindingKind.MEMORY)
    if comm:
        for a in comm.axes:
            label = "communication (axis unknown)" if a.axis == "unknown" else f"exposed {a.axis.upper()} communication"
            hidden = f"{100 * a.hidden_ratio:.0f}% hidden behind compute" if a.hidden_ratio is not None else ""
            add(label, a.exposed_per_step_s if a.exposed_per_step_s is not None else a.exposed_s,
                f"{a.comm_s / n * 1e3:,.2f} ms of communication {unit}, {hidden}", FindingKind.COMM, small_too=True)
        _rest_of_exposed(ranks, comm, n, add)
        for s in comm.stragglers:
            if s.basis == StragglerBasis.COLLECTIVES and s.others_wait_s is not None:
                add(f"waiting for {s.who}", s.others_wait_s / n, s.evidence + " (mean over the ranks that "
                    "waited; this wait is part of their communication time)", FindingKind.STRAGGLER, s.ranks)
    out.sort(key=lambda f: -f.seconds_per_step)
    return out
