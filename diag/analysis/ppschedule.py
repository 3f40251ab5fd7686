"""The pipeline schedule as the traces show it: its name, micro-batches (m), chunks per rank (v)
and each stage's order of forwards and backwards.

Problem: a bubble means little without the schedule's ideal, and the ideal needs the schedule,
m and v, which traces from torchtitan or Megatron-LM do not state. Each rank's actions are read
by ppactions; `schedule_of` takes each stage's order and names the schedule whose shape it has.
Values the user or the trainer gave (`pipeline_schedule`, `num_micro_batches`,
`virtual_pipeline_stages`) win over what is read.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import field
from typing import Optional

import numpy as np

from ..trace.columns import distinct
from ..runmeta import RunFacts
from .ppactions import KIND, SINGLE_STAGE, SOURCES, PPTrace
from ..record import record


@record
class Schedule:
    """The schedule as far as it is known, and where each fact came from."""

    name: Optional[str] = None
    m: Optional[int] = None
    v: Optional[int] = None
    orders: dict = field(default_factory=dict)    # stage -> one step's actions (PPTrace.step_order)
    source: Optional[str] = None                  # in words
    unknown: list = field(default_factory=list)   # what could not be read, and why


def expected_order(name: str, p: int, m: int, stage: int) -> Optional[list[str]]:
    """The F/B order of one stage of a non-interleaved schedule (micro-batches in order).
    1F1B: min(p - stage, m) warm-up forwards (torch's Schedule1F1B; Megatron-LM's p - stage - 1
    warm-ups then forward-first pairs make the same sequence), then one backward and one forward
    in turn, then the remaining backwards. GPipe: all forwards, then all backwards."""
    if name == "gpipe":
        return [f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)]
    if name != "1f1b":
        return None
    warm = min(p - stage, m)
    out = [f"F{i}" for i in range(warm)]
    for i in range(m):
        out.append(f"B{i}")
        if warm + i < m:
            out.append(f"F{warm + i}")
    return out


def _strip_stage(order: list[str]) -> list[str]:
    return [re.sub(r"^\d+", "", a) for a in order]


def _first_step(traces: list[PPTrace]) -> Optional[tuple[PPTrace, int]]:
    """The first rank of a stage that shows actions, and its first analysed step."""
    for pt in traces:
        if pt.source and pt.act_step.size:
            return pt, int(pt.act_step.min())
    return None


def _most_common(values: list) -> Optional[int]:
    return Counter(values).most_common(1)[0][0] if values else None


def _micro_batches(traces: list[PPTrace]) -> Optional[int]:
    """Distinct micro-batches among one step's forwards, the most common over ranks and steps
    (without annotations: the forwards counted, so v·m of an interleaved schedule)."""
    counts = []
    for pt in traces:
        fwd = pt.act_kind == KIND["F"]
        for s in distinct(pt.act_step[fwd]).tolist():
            sel = fwd & (pt.act_step == s)
            counts.append(int(distinct(pt.act_mb[sel]).size) if pt.source != "compute" else int(sel.sum()))
    return _most_common(counts)


def _chunks(p: int, traces: list[PPTrace]) -> tuple[int, bool]:
    """(v, V-shaped): model chunks per rank from the stage indices the annotations name, and
    whether each rank holds stages s and 2p-1-s (ZB-V, DualPipeV) rather than s, s+p, ..."""
    held = [set(pt.act_stage[pt.act_stage >= 0].tolist()) for pt in traces]
    held = [h for h in held if h]
    if not held:
        return 1, False
    v = max(1, len(set().union(*held)) // p)
    v_shape = v == 2 and all(len(h) == 2 and sum(h) == 2 * p - 1 for h in held)
    return v, v_shape


def _name(p: int, m: Optional[int], v: int, v_shape: bool, orders: dict, traces: list[PPTrace]) -> Optional[str]:
    """The schedule whose shape the actions have (diag's names, runconfig.values.SCHEDULES)."""
    kinds = set(np.concatenate([pt.act_kind for pt in traces]).tolist()) if traces else set()
    if {KIND["I"], KIND["W"]} & kinds:
        return "dualpipev" if any(pt.overlapped for pt in traces) else "zbv" if v_shape else "zb1p"
    if v > 1:
        return "looped-bfs" if all(_forwards_first(o) for o in orders.values()) else "interleaved-1f1b"
    if not m:
        return None
    for name in ("gpipe", "1f1b"):
        if all(_strip_stage(o) == expected_order(name, p, m, s) for s, o in orders.items()):
            return name
    return None


def _forwards_first(order: list[str]) -> bool:
    """Every forward of the step before its first backward (GPipe-like, per chunk: looped BFS)."""
    kinds = [re.sub(r"\d", "", a) for a in order]
    return "B" not in kinds or "F" not in kinds[kinds.index("B"):]


def schedule_of(p: int, by_stage: dict, meta: RunFacts) -> Schedule:
    """by_stage: stage -> its ranks' PPTrace, lowest rank first; meta: the run's facts (given
    values win: pipeline_schedule, num_micro_batches, virtual_pipeline_stages)."""
    out = Schedule()
    firsts = {s: f for s, ts in by_stage.items() if (f := _first_step(ts))}
    out.orders = {s: pt.step_order(step) for s, (pt, step) in sorted(firsts.items())}
    traces = [pt for ts in by_stage.values() for pt in ts if pt.source]
    sources = {pt.source for pt in traces}
    read = _read(p, out, traces, sources)
    given = _given(out, meta)
    if out.name in SINGLE_STAGE and "v" not in given:      # one model chunk per rank by definition
        out.v = 1
    elif traces and "v" not in given + read:
        out.unknown.append("v: not visible without PP:<action> annotations, 1 assumed (an interleaved "
                           "schedule's v·m forwards then count as m, which gives the same ideal)")
    read = [k for k in read if k not in given]
    said = [f"{_words(given)} given (run metadata, config file or flags)"] if given else []
    said += [f"{_words(read)} read from {', '.join(SOURCES[s] for s in sorted(sources))}"] if read else []
    out.source = "; ".join(said) or None
    return out


def _read(p: int, out: Schedule, traces: list[PPTrace], sources: set) -> list[str]:
    """Fill schedule, m and v from the traces; returns which of them were read."""
    if not traces:
        out.unknown.append("schedule, m and v: the traces show no pipeline schedule (no PP:<action> or "
                           "Forward i annotations, no forward/backward compute between pipeline sends/receives)")
        return []
    out.m = _micro_batches(traces)
    out.v, v_shape = _chunks(p, traces) if "pp" in sources else (1, False)
    out.name = _name(p, out.m, out.v, v_shape, out.orders, traces)
    if out.name is None:
        out.unknown.append("schedule: the forward/backward order matches no schedule diag knows "
                           "(give --pipeline-schedule)")
    # GPipe's `Forward i` annotations come from single-stage schedules only: v = 1 is read too.
    return [k for k, known in (("schedule", out.name), ("m", out.m), ("v", sources != {"compute"})) if known]


def _words(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]


def _given(out: Schedule, meta: RunFacts) -> list[str]:
    """Values the user or the trainer stated replace what was read; returns which."""
    given = []
    for key, attr, label in (("pipeline_schedule", "name", "schedule"), ("num_micro_batches", "m", "m"),
                             ("virtual_pipeline_stages", "v", "v")):
        value = getattr(meta, key)
        if value not in (None, ""):
            setattr(out, attr, value if attr == "name" else int(value))
            given.append(label)
    out.unknown = [u for u in out.unknown if u.split(":")[0] not in given]
    return given
