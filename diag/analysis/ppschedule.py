"""The pipeline schedule as the traces show it: its name, micro-batches (m), chunks per rank (v)
and each stage's order of forwards and backwards.

Problem: a bubble means little without the schedule's ideal, and the ideal needs the schedule,
m and v, which traces from torchtitan or Megatron-LM do not state. What they can show, read
here per rank (strongest first):

1. torch.distributed.pipelining's runtime schedules (Interleaved1F1B, LoopedBFS,
   InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) wrap every action in
   `record_function("PP:<action>")`: `PP:2F0` is stage 2's forward of micro-batch 0, `B` a full
   backward, `I` / `W` the split backward (input / weight) of the zero-bubble schedules,
   `PP:(0F1;1B0)OVERLAP_F_B` DualPipeV's overlapped pair; `SEND_F`, `RECV_B`, ... post transfers.
2. ScheduleGPipe wraps each micro-batch in `Forward i` / `Backward i` (no stage index).
3. Schedule1F1B (torch 2.13) and Megatron-LM write nothing a torch.profiler trace keeps
   (Megatron's ranges are NVTX, off by default and not recorded by Kineto). Then the order comes
   from the compute itself: a backward is a run of autograd nodes
   (`autograd::engine::evaluate_function`), a forward a run of matrix multiplies outside them,
   and a point-to-point op or a change of kind separates one micro-batch from the next.

The job-level reading (`schedule_of`) takes each stage's order and names the schedule; values
the user or the trainer gave (`pipeline_schedule`, `num_micro_batches`,
`virtual_pipeline_stages`) win over what is read.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..runmeta import RunFacts
from ..trace.kinds import Kind
from ..trace.table import RankTrace
from . import intervals as iv
from .collectives import RankComms
from .hostlink import kernel_spans
from .ppwaits import P2P_OPS, P2PWaits, gpu_waits, host_waits, main_thread
from .steps import Window, _step_of

ACTIONS = ("F", "B", "I", "W")          # forward, full backward, backward input, backward weight
_KIND = {k: i for i, k in enumerate(ACTIONS)}
_ACTION = r"(\d+)(F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)(\d*)"
_PP_RE = re.compile(r"^PP:" + _ACTION + "$")
_ONE_RE = re.compile(_ACTION + "$")
_OVERLAP_RE = re.compile(r"^PP:\((.*)\)OVERLAP_F_B$")
_GPIPE_RE = re.compile(r"^(Forward|Backward) (\d+)$")
_BACKWARD = "autograd::engine::evaluate_function"
SINGLE_STAGE = ("1f1b", "gpipe")          # schedules of one model chunk per rank
_GEMMS = frozenset({"aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm", "aten::baddbmm"})

SOURCES = {
    "pp": "the trace's PP:<action> annotations of torch.distributed.pipelining",
    "gpipe": "the trace's Forward i / Backward i annotations of torch.distributed.pipelining's GPipe",
    "compute": "the order of forward and backward compute between pipeline sends/receives, the trace "
               "having no schedule annotations",
}


def _ints(dtype) -> np.ndarray:
    return np.zeros(0, dtype)


@dataclass
class PPTrace:
    """What one rank's trace shows of its pipeline (plain data: it travels in the rank summary)."""

    source: str = ""                  # a key of SOURCES; "" when nothing was read
    overlapped: int = 0               # DualPipeV's OVERLAP_F_B actions seen
    act_step: np.ndarray = field(default_factory=lambda: _ints(np.int64))   # ProfilerStep number
    act_stage: np.ndarray = field(default_factory=lambda: _ints(np.int32))  # named stage, -1 none
    act_kind: np.ndarray = field(default_factory=lambda: _ints(np.int8))    # index into ACTIONS
    act_mb: np.ndarray = field(default_factory=lambda: _ints(np.int32))     # micro-batch, -1 unknown
    # where each action ran, ns on the rank's timeline (the Gantt's clock): the annotation's span
    # on a host timeline, the span of the compute kernels launched inside it on a GPU; -1 unknown
    act_start_ns: np.ndarray = field(default_factory=lambda: _ints(np.int64))
    act_end_ns: np.ndarray = field(default_factory=lambda: _ints(np.int64))
    p2p: P2PWaits = field(default_factory=P2PWaits)

    def step_order(self, step: int) -> list[str]:
        """One step's compute actions as torch names them: '2F0' (stage 2, forward, micro-batch 0),
        'F0' where no stage is named."""
        sel = self.act_step == step
        cols = (self.act_stage[sel].tolist(), self.act_kind[sel].tolist(), self.act_mb[sel].tolist())
        return [(f"{s}" if s >= 0 else "") + ACTIONS[k] + (f"{m}" if m >= 0 else "") for s, k, m in zip(*cols)]

    def labels(self, schedule: Optional[str]) -> list[Optional[str]]:
        """Each action as the Gantt labels it: 'F3' (forward of micro-batch 3; B, I, W alike), 'F3.1'
        on a rank that holds several stages (.1: its second model chunk, its stages in order); None
        where the micro-batch is unknown. Micro-batches numbered from the compute's order are known
        only when the job's schedule (`schedule`, diag's name) runs them in order: 1F1B or GPipe."""
        if self.source == "compute" and schedule not in SINGLE_STAGE:
            return [None] * self.act_kind.size
        held = sorted(set(self.act_stage[self.act_stage >= 0].tolist()))
        chunk = {s: i for i, s in enumerate(held)} if len(held) > 1 else {}
        cols = (self.act_stage.tolist(), self.act_kind.tolist(), self.act_mb.tolist())
        return [None if m < 0 else f"{ACTIONS[k]}{m}" + (f".{chunk[s]}" if s in chunk else "")
                for s, k, m in zip(*cols)]


def _parse(name: str) -> Optional[list[tuple[int, int, int]]]:
    """(stage, kind, micro-batch) of the compute actions an annotation names; [] for a pipelining
    annotation that computes nothing (a transfer's post); None for any other name."""
    m = _GPIPE_RE.match(name)
    if m:
        return [(-1, _KIND["F" if m.group(1) == "Forward" else "B"], int(m.group(2)))]
    m = _OVERLAP_RE.match(name)
    parts = [_ONE_RE.match(p.strip()) for p in m.group(1).split(";")] if m else [_PP_RE.match(name)]
    if not all(parts):
        return None
    return [(int(p.group(1)), _KIND[p.group(2)], int(p.group(3)) if p.group(3) else -1)
            for p in parts if p.group(2) in _KIND]


def _annotated(t, steps_of) -> Optional[tuple]:
    """Actions from pipelining annotations: (source, overlapped, columns), or None; columns as _columns."""
    parsed = {i: acts for i, n in enumerate(t.symbols.names) if (acts := _parse(n)) is not None}
    rows = np.flatnonzero(np.isin(t.name_id, list(parsed)) & t.mask(Kind.CPU_OP, Kind.ANNOTATION)) if parsed else []
    if len(rows) == 0:
        return None
    rows = rows[np.argsort(t.ts_ns[rows], kind="stable")]
    step = steps_of(t.ts_ns[rows])
    acts = [(s, *a, int(t.ts_ns[r]), int(t.end_ns[r]))
            for r, s in zip(rows.tolist(), step.tolist()) if s >= 0 for a in parsed[int(t.name_id[r])]]
    names = {int(i): t.symbols[int(i)] for i in np.unique(t.name_id[rows])}
    gpipe = all(_GPIPE_RE.match(n) for n in names.values())
    overlapped = int(np.isin(t.name_id[rows], [i for i, n in names.items() if n.endswith("OVERLAP_F_B")]).sum())
    return "gpipe" if gpipe else "pp", overlapped, _columns(acts)


_DTYPES = (np.int64, np.int32, np.int8, np.int32, np.int64, np.int64)


def _columns(acts: list[tuple]) -> tuple:
    """(step, stage, kind, micro-batch, host start, host end) arrays of the actions."""
    cols = list(zip(*acts)) if acts else [()] * len(_DTYPES)
    return tuple(np.array(c, d) for c, d in zip(cols, _DTYPES))


def _tokens(t, main: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, token, end) in time order: 0 a forward's matrix multiply (main thread, outside
    autograd nodes and the optimizer), 1 a run of autograd nodes, 2 a point-to-point op."""
    host = t.mask(Kind.CPU_OP, Kind.ANNOTATION)
    bwd = np.flatnonzero(t.name_mask(lambda s: s.startswith(_BACKWARD)) & host)
    b_set = iv.merge(t.ts_ns[bwd], t.end_ns[bwd])
    opt = np.flatnonzero(t.name_mask(lambda s: s.startswith("Optimizer.")) & host)
    gemm = np.flatnonzero(t.name_mask(lambda s: s in _GEMMS) & (t.kind == Kind.CPU_OP) & (t.thread == main))
    outside = iv.merge(np.concatenate([b_set[0], t.ts_ns[opt]]), np.concatenate([b_set[1], t.end_ns[opt]]))
    fwd = gemm[iv.lengths_in_windows(outside, t.ts_ns[gemm], t.ts_ns[gemm] + 1) == 0]
    p2p = np.flatnonzero(t.name_mask(lambda s: s in P2P_OPS) & (t.kind == Kind.CPU_OP))
    at = np.concatenate([t.ts_ns[fwd], b_set[0], t.ts_ns[p2p]])
    end = np.concatenate([t.end_ns[fwd], b_set[1], t.end_ns[p2p]])
    token = np.repeat(np.arange(3, dtype=np.int8), [fwd.size, b_set[0].size, p2p.size])
    order = np.lexsort((token, at))
    return at[order], token[order], end[order]


def _from_compute(t, steps_of, main: int) -> tuple:
    """Actions from the compute's order (no annotations): a run of forward tokens is a forward,
    a run of autograd nodes a backward; a point-to-point op, a change of kind or of step ends a
    run. Micro-batches are numbered in order, as 1F1B and GPipe run them (the Gantt labels them
    only where the stages' orders are such a schedule's). A run spans from its first op's start
    to the latest end of its ops."""
    at, token, end = _tokens(t, main)
    if at.size == 0:
        return "compute", 0, _columns([])
    step = steps_of(at)
    new_run = np.concatenate([[True], (token[1:] != token[:-1]) | (step[1:] != step[:-1])])
    run_end = np.maximum.reduceat(end, np.flatnonzero(new_run))
    keep = ((token < 2) & (step >= 0))[new_run]          # of the runs: actions in analysed steps
    kind, step = token[new_run][keep], step[new_run][keep]
    return "compute", 0, (step.astype(np.int64), np.full(kind.size, -1, np.int32), kind.astype(np.int8),
                          _number_in_order(step, kind), at[new_run][keep], run_end[keep])


def _number_in_order(step: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... per (step, kind), in order of appearance."""
    key = step * 2 + kind
    order = np.argsort(key, kind="stable")
    first = np.searchsorted(key[order], key[order], side="left")
    out = np.empty(key.size, np.int32)
    out[order] = np.arange(key.size) - first
    return out


def read_rank(rt: RankTrace, w: Window, timeline: str, rc: RankComms) -> PPTrace:
    """The per-rank pass's reading of the pipeline: its actions and its point-to-point waits."""
    t = rt.events
    in_window = np.unique(w.step_index[w.step_index >= 0])

    def steps_of(times: np.ndarray) -> np.ndarray:       # ProfilerStep number of in-window times, -1
        i = _step_of(w.steps, times)
        if len(w.steps) == 0:
            return i
        return np.where(np.isin(i, in_window), w.steps.number[np.maximum(i, 0)], -1)

    main = main_thread(t, np.flatnonzero(t.name_mask(lambda s: s.startswith("ProfilerStep"))
                                         & t.mask(Kind.CPU_OP, Kind.ANNOTATION)))
    source, overlapped, (step, stage, kind, mb, start, end) = \
        _annotated(t, steps_of) or _from_compute(t, steps_of, main)
    if step.size == 0:
        source = ""
    if timeline == "gpu":
        start, end = kernel_spans(t, w.rows[t.kind[w.rows] == Kind.COMPUTE], start, end)
    waits = gpu_waits(rc) if timeline == "gpu" else host_waits(rt, w, in_window, main)
    return PPTrace(source=source, overlapped=overlapped, act_step=step, act_stage=stage, act_kind=kind,
                   act_mb=mb, act_start_ns=start, act_end_ns=end, p2p=waits)


# -- the job's schedule ---------------------------------------------------------------------------
@dataclass
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
        fwd = pt.act_kind == _KIND["F"]
        for s in np.unique(pt.act_step[fwd]).tolist():
            sel = fwd & (pt.act_step == s)
            counts.append(int(np.unique(pt.act_mb[sel]).size) if pt.source != "compute" else int(sel.sum()))
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
    if {_KIND["I"], _KIND["W"]} & kinds:
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
