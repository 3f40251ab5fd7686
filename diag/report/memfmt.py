"""Measured memory in words and table rows, shared by the text, Markdown and HTML reports and the
dashboard: the peak per rank (per stage on big jobs), where the job's peak came from, and what
the memory model says it is made of."""
from __future__ import annotations

from typing import Optional

from ..analysis.results import Diagnosis, MemoryUsage, RankPeak

MEMORY_HEADER = ["rank(s)", "stage", "device", "peak MiB", "memory events"]
PER_STAGE_FROM = 17          # more ranks than this: one row per stage (max over its ranks)
MiB = float(1 << 20)


def mib(n: Optional[float]) -> str:
    return "unknown" if n is None else f"{n / MiB:,.1f}"


def _row(who: str, peaks: list[RankPeak]) -> list[str]:
    known = [p for p in peaks if p.peak_bytes is not None]
    top = max(known, key=lambda p: p.peak_bytes) if known else peaks[0]
    bound = "≥ " if top.lower_bound else ""
    stage = "-" if top.stage is None else str(top.stage)
    return [who, stage, top.device or "-", bound + mib(top.peak_bytes), str(sum(p.events for p in peaks))]


def memory_rows(d: Diagnosis) -> list[list[str]]:
    """The measured peak of each rank, or of each stage (its largest rank) past PER_STAGE_FROM
    ranks when the stages are known; none when no rank has one (memory_lines says why)."""
    m = d.memory
    if m is None or not any(p.peak_bytes is not None for p in m.ranks):
        return []
    stages: dict = {}
    for p in m.ranks:
        stages.setdefault(p.stage, []).append(p)
    if len(m.ranks) >= PER_STAGE_FROM and None not in stages:
        return [_row(f"{len(ps)} ranks" if len(ps) > 1 else str(ps[0].rank), ps) for _, ps in sorted(stages.items())]
    return [_row(str(p.rank), [p]) for p in m.ranks]


def memory_caption(m: MemoryUsage) -> str:
    parts = ["Peak: the largest `Total Allocated` of the rank's compute device among the trace's memory "
             "events in the analysed window."]
    if any(p.lower_bound for p in m.ranks):
        parts.append("≥: a lower bound (CPU: only what was allocated while the profiler recorded).")
    return " ".join(parts)


def peak_line(d: Diagnosis) -> str:
    """The job's peak per rank (the largest) and its source, or why it is unknown."""
    m, peak = d.memory, d.facts.peak_memory_bytes
    if peak:
        return f"Peak memory per rank (the largest): {mib(peak)} MiB, from {m.peak_source if m else 'diag_run.json'}"
    return "Peak memory per rank: unknown" + (f" ({m.unknown})" if m and m.unknown else "")


def model_lines(m: Optional[MemoryUsage]) -> list[str]:
    """The memory model's parts per stage for the measured layout, and how it was calibrated."""
    if m is None or not (m.model or m.model_basis):
        return []
    out = [f"Memory model: {m.model_basis}"] if m.model_basis else []
    out += [f"  stage {p.stage}: weights {mib(p.weights)} + gradients {mib(p.grads)} + optimizer {mib(p.optimizer)}"
            + (f" + ZeRO-3 buffers {mib(p.sharding_buffers)}" if p.sharding_buffers else "")
            + (f" + DP buckets {mib(p.dp_buckets)}" if p.dp_buckets else "")
            + f" + activations {mib(p.activations)}"
            + (f" {'+' if p.other >= 0 else '-'} other {mib(abs(p.other))}" if p.other else "")
            + f" = {mib(p.total)} MiB" for p in m.model]
    return out


def memory_lines(d: Diagnosis) -> list[str]:
    return [peak_line(d), *model_lines(d.memory)]
