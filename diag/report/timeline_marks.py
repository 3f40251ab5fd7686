"""The Diagnosis's findings as slices on a "diag findings" track of the job's timeline.

Problem: a finding says a rank is late or a stage waits; the user wants to see the events
behind it. Each finding is drawn where the Diagnosis places it, one thread of the findings
process per finding and rank, so the track sits above the ranks and names whom it is about:
- a straggler (found at collectives): the member's arrivals at the collectives it delayed
  (Straggler.arrivals), so the mark lies over that rank's late collective;
- the worst pipeline bubble: the stage with the largest bubble (Pipeline.stages), over the step
  the Diagnosis drew for it (its Gantt row), and inside it the stretches that stage spent in
  pipeline send/recv not hidden by compute;
- exposed communication: on the ranks with the most of it (CommAnalysis.ranks), the intervals
  where their communication is not under compute (RankComms.exposed, the same intervals the
  exposed seconds are the length of).
Nothing is measured here: times come from the Diagnosis and the job's comms, moved onto the
shared axis by each rank's clock offset. A finding the Diagnosis has no time for is not drawn,
and the metadata says why.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..analysis.results import Diagnosis, StragglerBasis

EXPOSED_RANKS = 2          # exposed communication marked on the ranks with the most of it
MAX_INTERVALS = 500        # per rank: the longest exposed intervals (a long run has tens of thousands)
Shift = Callable[[int], float]   # rank -> us to add to its trace times


class Marks:
    """Slices of the findings process, one tid per (finding, rank), and what was left out."""

    def __init__(self, pid: int, shift: Shift) -> None:
        self.pid, self.shift = pid, shift
        self.tids: dict[str, int] = {}
        self.events: list[dict] = []
        self.left_out: list[str] = []

    def add(self, track: str, rank: int, name: str, ts_us: float, dur_us: float, **args) -> None:
        tid = self.tids.setdefault(track, len(self.tids) + 1)
        self.events.append({"ph": "X", "cat": "diag.finding", "name": name, "pid": self.pid, "tid": tid,
                            "ts": ts_us + self.shift(rank), "dur": max(0.0, dur_us), "args": {"rank": rank, **args}})

    def metadata(self) -> list[dict]:
        out = [{"ph": "M", "name": "process_name", "pid": self.pid, "args": {"name": "diag findings"}},
               {"ph": "M", "name": "process_sort_index", "pid": self.pid, "args": {"sort_index": -1}}]
        for track, tid in self.tids.items():
            out.append({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid, "args": {"name": track}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": self.pid, "tid": tid, "args": {"sort_index": tid}})
        return out


def stragglers(m: Marks, d: Diagnosis) -> None:
    for s in (d.comm.stragglers if d.comm else []):
        if s.basis is not StragglerBasis.COLLECTIVES:
            m.left_out.append(f"straggler {s.who} ({s.reason}): found from step times, no collective to mark")
            continue
        for rank, ts_us, dur_us in s.arrivals:
            m.add(f"straggler: rank {rank}", int(rank), f"late: {s.who} {s.reason}", ts_us, dur_us,
                  straggler=s.who, evidence=s.evidence)


def worst_bubble(m: Marks, d: Diagnosis) -> None:
    p = d.pipeline
    stages = [st for st in (p.stages if p else []) if st.bubble_s is not None]
    if not stages:
        if p is not None:
            m.left_out.append("pipeline bubble: no stage's bubble could be measured")
        return
    worst = max(stages, key=lambda st: st.bubble_s)
    row = next((r for r in (d.gantt.rows if d.gantt else []) if r.stage == worst.stage and r.start_us is not None), None)
    if row is None:
        m.left_out.append(f"pipeline bubble: stage {worst.stage} has no drawn step to place it in")
        return
    share = f", {100 * worst.bubble_fraction:.0f}% of the step" if worst.bubble_fraction is not None else ""
    track = f"worst pipeline bubble: stage {worst.stage} (rank {row.rank})"
    m.add(track, row.rank, f"worst bubble: stage {worst.stage}, step {row.step}{share}", row.start_us, row.step_s * 1e6,
          stage=worst.stage, bubble_s_per_step=worst.bubble_s, bubble_fraction=worst.bubble_fraction)
    for seg in row.segments:
        if seg.kind == "send/recv":
            m.add(track, row.rank, "waiting on pipeline neighbours", row.start_us + seg.start_s * 1e6,
                  (seg.end_s - seg.start_s) * 1e6, stage=worst.stage)


def exposed_comm(m: Marks, d: Diagnosis, comms_of: dict) -> None:
    top = sorted((r for r in (d.comm.ranks if d.comm else []) if r.exposed_s > 0), key=lambda r: -r.exposed_s)
    for r in top[:EXPOSED_RANKS]:
        rc = comms_of.get(r.rank)
        if rc is None:
            continue
        lo, hi = rc.exposed()
        keep = np.sort(np.argsort(lo - hi, kind="stable")[:MAX_INTERVALS])   # the longest, in time order
        if keep.size < lo.size:
            m.left_out.append(f"exposed communication on rank {r.rank}: the {keep.size} longest of {lo.size} "
                              "intervals marked")
        for a, b in zip(lo[keep].tolist(), hi[keep].tolist()):
            m.add(f"exposed communication: rank {r.rank}", r.rank, "exposed communication",
                  rc.clock0_us + a / 1000.0, (b - a) / 1000.0, rank_exposed_s=r.exposed_s)


def findings_marks(d: Diagnosis, comms_of: dict, pid: int, shift: Shift) -> Marks:
    """Every mark of the Diagnosis; comms_of: rank -> its RankComms (the job's, as diagnosed)."""
    m = Marks(pid, shift)
    stragglers(m, d)
    worst_bubble(m, d)
    exposed_comm(m, d, comms_of)
    return m


def rank_name(rank: int, dims: Optional[list]) -> str:
    """'rank 5 (pp1 dp0 tp1)' with the layout's coordinates; 'rank 5' when the layout is unknown."""
    if not dims:
        return f"rank {rank}"
    from ..layout import Layout

    layout = Layout([(a, n) for a, n in dims])
    if not 0 <= rank < layout.world_size:
        return f"rank {rank}"
    c = layout.coords(rank)
    return f"rank {rank} (" + " ".join(f"{a}{c[a]}" for a, _ in layout.dims) + ")"
