"""Training steps (`ProfilerStep#N`) and the analysis window.

The profiler marks each step on the host with a `ProfilerStep#N` span. GPU work
belongs to the step whose host span launched it (kernel `correlation` = launch
`correlation`), because kernels run later than they are launched.

Window convention (same as HTA 0.5, so results agree): when a trace has two or more
steps, GPU work launched at or after the start of the last step is left out — the
profiler stops while that step's kernels may still be queued, so it is often
incomplete — and so is GPU work whose launch is not in the trace. With fewer than two
steps, everything is analysed.
"""
from __future__ import annotations

import re

import numpy as np

from ..trace.kinds import Kind
from ..trace.table import EventTable
from .hostlink import launches
from .results import WHOLE_TRACE
from ..record import record

STEP_RE = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")


@record
class StepSpans:
    """A rank's ProfilerStep spans, one row per step."""

    number: np.ndarray     # int64 step numbers as written (ProfilerStep#N)
    start_ns: np.ndarray   # host span start
    end_ns: np.ndarray     # host span end

    def __len__(self) -> int:
        return int(self.number.size)


def host_steps(t: EventTable) -> StepSpans:
    rows = np.flatnonzero(t.name_mask(STEP_RE.match) & t.mask(Kind.ANNOTATION, Kind.CPU_OP))
    rows = rows[np.argsort(t.ts_ns[rows], kind="stable")]
    nums = np.array([int(STEP_RE.match(t.name(r)).group(1)) for r in rows], dtype=np.int64)
    return StepSpans(nums, t.ts_ns[rows], t.end_ns[rows])


def stub_last(t: EventTable, steps: StepSpans) -> bool:
    """Whether the last of two or more steps is a stub: a ProfilerStep in which the host ran no
    operator and launched nothing, which the profiler opened as it stopped (a ROCm trace of
    shared/traces ends in a 49 us ProfilerStep#2 after its 9.3 ms step #1). It is no step: the
    run's step time leaves it out, where the median of the two would have read half a step."""
    if len(steps) < 2:
        return False
    ts = t.ts_ns[t.mask(Kind.CPU_OP, Kind.RUNTIME)]
    return not bool(((ts >= steps.start_ns[-1]) & (ts < steps.end_ns[-1])).any())


def launch_times(t: EventTable, rows: np.ndarray) -> np.ndarray:
    """Host time at which each GPU row was launched; -1 where the launch is not in the trace."""
    return launches(t, rows)[0]


@record
class Window:
    """Which GPU rows (or host rows) an analysis covers, and how they map to steps."""

    rows: np.ndarray        # event rows in the window
    step_index: np.ndarray  # per row: index into steps, -1 outside every step
    steps: StepSpans
    excluded_rows: int      # timeline rows left out by the window convention
    convention: str
    excluded_why: str = ""


def work_spans(t: EventTable, w: Window) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step indices, first start, last end) of the window's rows in each step that has any: one
    sort and a reduce over the rows, linear in the trace, not one pass over it per step (a
    masked pass per step took 30,000 steps to 25 s and a million past the hour)."""
    inside = w.step_index >= 0
    step, rows = w.step_index[inside], w.rows[inside]
    if step.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(step, kind="stable")
    step, rows = step[order], rows[order]
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    lo = np.minimum.reduceat(t.ts_ns[rows], first)
    hi = np.maximum.reduceat(t.ts_ns[rows] + t.dur_ns[rows], first)
    return step[first].astype(np.int64), lo.astype(np.int64), hi.astype(np.int64)


def gpu_window(t: EventTable, steps: StepSpans) -> Window:
    rows = np.flatnonzero(t.gpu_mask())
    launched = launch_times(t, rows)
    if len(steps) >= 2:
        keep = (launched >= 0) & (launched < steps.start_ns[-1])
        conv = "GPU work launched before the last ProfilerStep (HTA convention)"
    else:
        keep = np.ones(rows.size, dtype=bool)
        conv = WHOLE_TRACE
    step_of = _step_of(steps, launched[keep])
    return Window(rows[keep], step_of, steps, int((~keep).sum()), conv,
                  "launched in the last ProfilerStep, or launch not in the trace")


def host_window(t: EventTable, rows: np.ndarray, steps: StepSpans) -> Window:
    if len(steps) >= 2:
        keep = t.ts_ns[rows] < steps.start_ns[-1]
        conv = "host events before the last ProfilerStep (HTA convention)"
    else:
        keep = np.ones(rows.size, dtype=bool)
        conv = WHOLE_TRACE
    kept = rows[keep]
    return Window(kept, _step_of(steps, t.ts_ns[kept]), steps, int((~keep).sum()), conv,
                  "started in the last ProfilerStep")


def _step_of(steps: StepSpans, times: np.ndarray) -> np.ndarray:
    if len(steps) == 0:
        return np.full(times.size, -1, dtype=np.int64)
    i = np.searchsorted(steps.start_ns, times, side="right") - 1
    inside = (i >= 0) & (times < steps.end_ns[np.maximum(i, 0)])
    return np.where(inside, i, -1)


def window_of(rt) -> tuple[str, Window]:
    """A rank's timeline ("gpu" or "host") and its analysis window."""
    t, steps = rt.events, host_steps(rt.events)
    if rt.has_gpu:
        return "gpu", gpu_window(t, steps)
    step_rows = t.name_mask(lambda s: s.startswith("ProfilerStep"))
    host_rows = np.flatnonzero(t.mask(Kind.CPU_OP, Kind.ANNOTATION) & ~step_rows)
    return "host", host_window(t, host_rows, steps)
