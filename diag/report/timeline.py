"""`diag analyze PATH --timeline OUT.json`: the whole job on one Perfetto / chrome://tracing timeline.

Problem: a finding ("rank 5 arrives last", "stage 1 waits 30% of the step") is a summary; to act
on it a user wants the events behind it, in the viewer they already use. This writes one Chrome
Trace Event Format file holding every rank's events (a process per rank, named with its place in
the layout), the ranks' clocks set against each other on the ends of matched collectives
(analysis.clocks), each matched collective linked to its peers with flow events (from the one
that arrived last, whose wait was shortest, to each rank that waited for it), and the findings
as marked slices on a "diag findings" track (report.timeline_marks).

It is a renderer, so it lives in report/: it takes a Diagnosis (clock offsets, stragglers'
arrivals, the pipeline and its Gantt rows) and the job the Diagnosis was made from (each rank's
trace file, and its comms with their match ids) and computes no metric of its own. It needs the
traces themselves: a rank summary (*.diagsum) has no events to draw. The output is streamed, one
rank's file decoded a chunk at a time (report.timeline_events), so memory stays bounded by a
chunk, not by the job.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
from dataclasses import asdict, field
from typing import Callable, Optional

import numpy as np

from ..analysis.results import Diagnosis
from ..analysis.summary_file import SUFFIX
from ..trace.errors import TraceError
from ..trace.safeio import atomic_open, special
from .timeline_events import copy_rank, thread_metadata
from .timeline_marks import findings_marks, rank_name
from ..record import record

FLOW_CAT = "diag.collective"


@record
class Written:
    """What write_timeline did: for the stderr note and the tests."""

    path: str
    ranks: dict = field(default_factory=dict)       # rank -> timeline_events.Copied
    offsets_ns: dict = field(default_factory=dict)  # rank -> offset applied (0 where not aligned)
    not_found: dict = field(default_factory=dict)   # rank -> matched instances no event of its file matched:
                                                    # their flows have one end only (none on real traces so far)
    aligned: bool = False
    marks: int = 0
    note: str = ""


def unwritable(out: str) -> Optional[str]:
    """Why `out` cannot be written, checked before the traces are read; None when it can."""
    folder = os.path.dirname(os.path.abspath(out))
    if os.path.isdir(out):
        return "is a directory"
    if special(out):                  # /dev/null, a FIFO: written in place (write_timeline)
        return None if os.access(out, os.W_OK) else "is not writable"
    if not os.path.isdir(folder):
        return f"its folder {folder} does not exist"
    if not os.access(folder, os.W_OK):
        return f"its folder {folder} is not writable"
    return None


def _only_summaries(names: list[str]) -> str:
    return (f"--timeline needs the traces' events, and {len(names)} rank(s) have only a summary "
            f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): a summary keeps no events; "
            "give the folder of the trace files")


def refused(out: str, path: str, iteration: Optional[int] = None) -> Optional[str]:
    """Why no timeline can be written, checked before any trace is read: `out` cannot be written,
    or ranks at `path` have a summary (*.diagsum) and no trace. None when it can be."""
    why = unwritable(out)
    if why:
        return f"{out}: cannot write the timeline: {why}"
    from ..analysis.collect import items_of

    try:
        items, _, _ = items_of(path, iteration)
    except TraceError:
        return None                        # the analysis says what is wrong with `path`
    alone = [os.path.basename(i.summary) for i in items if i.trace is None]
    return f"{path}: {_only_summaries(alone)}" if alone else None


def traces_of(job, out: str) -> dict:
    """rank -> its trace file; TraceError when a rank was read from a summary alone."""
    found, summaries = {}, []
    for s in job.ranks:
        if str(s.path).endswith(SUFFIX) or not os.path.isfile(s.path):
            summaries.append(os.path.basename(str(s.path)))
        elif os.path.exists(out) and os.path.samefile(out, s.path):
            raise TraceError(out, "is one of the traces read: the timeline would overwrite it")
        else:
            found[int(s.rank)] = s.path
    if summaries:
        raise TraceError(job.source, _only_summaries(summaries))
    return found


def flow_plan(comms: list, stride: int) -> dict:
    """rank -> {(start_ns, dur_ns) of a matched instance: [(ph, flow id), ...]}: a flow from the
    member that arrived last (shortest instance; ties: lowest rank) to each other member."""
    cols = {k: [] for k in ("mid", "rank", "start", "dur")}
    for rc in comms:
        sel = np.flatnonzero(rc.match_id >= 0) if rc.match_id.size == len(rc) else np.zeros(0, np.int64)
        cols["mid"].append(rc.match_id[sel])
        cols["rank"].append(np.full(sel.size, rc.rank, np.int64))
        cols["start"].append(rc.start_ns[sel])
        cols["dur"].append(rc.dur_ns[sel])
    plan: dict = {rc.rank: {} for rc in comms}
    if not comms or not sum(c.size for c in cols["mid"]):
        return plan
    mid, rank, start, dur = (np.concatenate(cols[k]) for k in ("mid", "rank", "start", "dur"))
    order = np.lexsort((rank, dur, mid))
    mid, rank, start, dur = mid[order], rank[order], start[order], dur[order]
    first = np.r_[True, mid[1:] != mid[:-1]]
    source = np.flatnonzero(first)[np.cumsum(first) - 1]
    for j, i in enumerate(np.flatnonzero(~first).tolist()):
        fid, s = j * stride + stride - 1, int(source[i])
        plan[int(rank[s])].setdefault((int(start[s]), int(dur[s])), []).append(("s", fid))
        plan[int(rank[i])].setdefault((int(start[i]), int(dur[i])), []).append(("f", fid))
    return plan


def _flows_at(rank: int, clock0_us: float, want: dict) -> Callable[[float, dict], list[dict]]:
    """The flow events of the rank's matched instance an event is, found by its time as the
    analysis read it (trace.build: ns from clock0, rounded)."""
    def at(ts: float, e: dict) -> list[dict]:
        if e.get("ph") != "X" or not want:
            return []
        dur = e.get("dur", 0)
        got = want.pop((round((ts - clock0_us) * 1000.0), round(dur * 1000.0)), None)
        if not got:
            return []
        return [{"ph": ph, "id": fid, "cat": FLOW_CAT, "name": "matched collective", "pid": rank, "tid": e["tid"],
                 "ts": e["ts"], **({"bp": "e"} if ph == "f" else {})} for ph, fid in got]
    return at


def _offsets(d: Diagnosis, ranks: list[int]) -> tuple[dict, bool, str]:
    clock = d.comm.clock if d.comm else None
    got = {s.rank: s.offset_ns for s in (clock.shifts if clock else []) if s.offset_ns is not None}
    offsets = {r: got.get(r, 0) for r in ranks}
    if clock is None or clock.reference is None:
        why = clock.unknown if clock else "the traces have no communication to align the ranks' clocks on"
        return offsets, False, f"clocks not aligned ({why}): each rank keeps its own trace clock"
    note = f"clocks aligned on the ends of matched collectives, onto rank {clock.reference}'s: offsets " + \
        ", ".join(f"rank {r} {offsets[r] / 1e3:+,.1f} us" for r in ranks if r in got)
    spread = [sh for sh in clock.shifts if sh.spread_ns is not None]
    if spread:           # how far single instances stray from the median: how much to trust the shift
        worst = max(spread, key=lambda sh: sh.spread_ns)
        note += (f"; single collectives' ends stray from them by {worst.spread_ns / 1e3:,.1f} us (median "
                 f"deviation) at most: rank {worst.rank} against rank {worst.via}, over {worst.instances} collectives")
    return offsets, True, note + (f"; {clock.unknown}" if clock.unknown else "")


def _header(d: Diagnosis, ranks: list[int]) -> list[dict]:
    out = []
    for r in ranks:
        out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": rank_name(r, d.layout_dims)}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
    return out


@contextlib.contextmanager
def _opened(out: str):
    """The file to write (safeio.atomic_open), gzip-compressed when `out` ends in .gz (Perfetto
    and chrome://tracing open both; a job's timeline is about as big as its traces)."""
    with atomic_open(out, buffering=1 << 20) as raw:
        if not out.endswith(".gz"):
            yield raw
            return
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) as z:
            yield z


def write_timeline(out: str, d: Diagnosis, job, progress: Optional[Callable[[str], None]] = None) -> Written:
    """Write the job's timeline to `out` (safeio.atomic_open: through a new temporary file beside
    it, then renamed, so a failed write leaves no half file; a device or a FIFO in place). Raises TraceError for a rank without its trace, OSError when `out` cannot
    be written."""
    traces = traces_of(job, out)
    ranks = sorted(traces)
    comms_of = {int(s.rank): s.comms for s in job.ranks}
    stride = (max(ranks) if ranks else 0) + 2              # ids: Kineto's id*stride+rank, ours ...+stride-1
    offsets, aligned, note = _offsets(d, ranks)
    shift = lambda r: offsets.get(r, 0) / 1000.0           # noqa: E731 - us to add to rank r's times
    plan = flow_plan([comms_of[r] for r in ranks], stride)
    marks = findings_marks(d, comms_of, stride - 1, shift)
    w = Written(path=out, offsets_ns=offsets, aligned=aligned, marks=len(marks.events), note=note)
    with _opened(out) as f:
        first = [True]

        def write(b: bytes) -> None:
            f.write(b if first[0] else b",\n" + b)
            first[0] = False
        f.write(b'{"displayTimeUnit":"ms","traceEvents":[\n')
        for e in _header(d, ranks) + marks.metadata() + marks.events:
            write(json.dumps(e).encode())
        for k, r in enumerate(ranks):
            copied, meta = copy_rank(traces[r], r, shift(r), stride, write,
                                     _flows_at(r, comms_of[r].clock0_us, plan.get(r, {})))
            for e in thread_metadata(r, copied, meta):
                write(json.dumps(e).encode())
            w.ranks[r], w.not_found[r] = copied, len(plan.get(r, {}))   # the plan's entries are popped when found
            if progress:
                missed = f" ({w.not_found[r]} not found in the file)" if w.not_found[r] else ""
                progress(f"timeline: rank {r} ({k + 1}/{len(ranks)}): {copied.events:,} events, "
                         f"{copied.flows_placed:,} collectives linked{missed}")
        f.write(b"\n],\n" + json.dumps({"diag": _metadata(d, w, marks, traces)}).encode()[1:] + b"\n")
    return w


def _metadata(d: Diagnosis, w: Written, marks, traces: dict) -> dict:
    clock = d.comm.clock if d.comm else None
    return {"source": d.source, "layout": d.layout, "tool": d.tool, "schema_version": d.schema_version,
            "clock": {"aligned": w.aligned, "note": w.note, "offsets_ns": {str(r): o for r, o in w.offsets_ns.items()},
                      **({"reference": clock.reference, "basis": clock.basis,
                          "shifts": [asdict(s) for s in clock.shifts]} if clock else {})},
            "ranks": {str(r): {"file": os.path.basename(traces[r]), "events": c.events, "dropped": c.dropped,
                               "collectives_linked": c.flows_placed, "collectives_not_found": w.not_found[r]}
                      for r, c in w.ranks.items()},
            "marks": {"count": w.marks, "left_out": marks.left_out},
            "problems": [asdict(p) for p in d.problems]}
