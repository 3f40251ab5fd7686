"""Where a job's rank traces are under the folder a user points `diag analyze` at.

Jobs lay their traces out in their own ways: torchtitan writes
`<dump>/profile_traces/iteration_<N>/rank<R>_trace.json` once per profiled iteration, PyTorch's
`tensorboard_trace_handler` writes `<host>_<pid>.<ts>.pt.trace.json` files into a log folder,
and people point at the job's root. A folder that holds trace files (or `*.diagsum` summaries)
itself is the job, as it always was. Otherwise the folders below it are searched, breadth first,
to MAX_DEPTH levels and at most MAX_FOLDERS folders; hidden folders, virtual environments and
symbolic links leaving the root are not entered. Files there count as traces only when their
first bytes look like a profiler trace, since a job's root also holds configs, tokenizers and
metric logs in *.json.

When several folders hold traces, one is picked, deterministically, and a note says which and
why: among torchtitan's `iteration_<N>` folders of one run the latest complete one (or the one
`iteration` names); among other folders (several runs) the newest complete set of ranks, where
"complete" means as many rank files as the world size in their `distributedInfo`.
"""
from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import field
from typing import Optional

from .errors import TraceError
from .read import GZIP_MAGIC
from .safeio import open_regular
from ..record import record

TRACE_SUFFIXES = (".json", ".json.gz", ".trace.gz")
NOT_TRACES = {"diag_run.json", "hta_reference.json", "diag_bench.json"}
SUMMARY_SUFFIX = ".diagsum"           # a rank's summary (analysis.summary_file), not a trace
MAX_DEPTH = 4                         # root/runs/<run>/profile_traces/iteration_<N> is 4 deep
MAX_FOLDERS = 5000
SKIP_FOLDERS = {"node_modules", "__pycache__", "site-packages"}
ITERATION = re.compile(r"iteration_(\d+)")
PEEK_BYTES = 4096                     # enough for a trace's first keys
HEAD_BYTES = 64 << 10                 # distributedInfo precedes the events; pg_config can be long
PARTIAL_SHARE = 0.2                   # an iteration under a fifth of the bytes of the run's others: cut short
MAX_NON_TRACES = 64                   # a folder whose first 64 *.json are no traces holds data, not ranks
# Keys a Kineto / Chrome trace opens with; a config or a metrics log has none of them.
_TRACE_KEYS = re.compile(rb'"(?:schemaVersion|traceEvents|deviceProperties|distributedInfo)"\s*:|"ph"\s*:')
_DIST_INFO = re.compile(rb'"distributedInfo"\s*:\s*\{')
_WORLD = re.compile(rb'"world_size"\s*:\s*(\d+)')


@record
class Found:
    """The folder to analyse, its trace and summary files, and what was picked and why."""

    directory: str
    traces: list[str]
    summaries: list[str]
    notes: list[str] = field(default_factory=list)

    def ranks(self) -> list[tuple[Optional[str], Optional[str]]]:
        """(trace, its summary or None) per rank, in the order the loader reads them: the traces,
        then the summaries that have no trace beside them, as (None, summary)."""
        sums = set(self.summaries)
        out = [(t, t + SUMMARY_SUFFIX if t + SUMMARY_SUFFIX in sums else None) for t in self.traces]
        return out + [(None, s) for s in sorted(sums - {t + SUMMARY_SUFFIX for t in self.traces})]


@record
class _Candidate:
    """A folder under the path given that holds rank traces or summaries."""

    directory: str
    rel: str
    traces: list[str]
    summaries: list[str]
    world: Optional[int]
    mtime: float

    @property
    def ranks(self) -> int:
        """Rank files: traces, plus summaries whose trace is not beside them."""
        return len(self.traces) + len({s[:-len(SUMMARY_SUFFIX)] for s in self.summaries} - set(self.traces))

    @property
    def complete(self) -> bool:
        return self.world is not None and self.ranks >= self.world

    @property
    def iteration(self) -> Optional[int]:
        m = ITERATION.fullmatch(os.path.basename(self.directory))
        return int(m.group(1)) if m else None

    @property
    def run(self) -> str:
        """The run this folder belongs to: an iteration folder's parent, else the folder."""
        return os.path.dirname(self.rel) if self.iteration is not None else self.rel


def trace_files(directory: str) -> list[str]:
    """The trace files directly in `directory`, by name (a folder the user named is trusted). A name
    that is not a regular file (a FIFO, a device, a link to one) is kept, so that reading it reports
    it as a problem instead of passing over it; folders and dangling links are not files."""
    out = []
    for n in sorted(os.listdir(directory)):
        p = os.path.join(directory, n)
        if not n.endswith(TRACE_SUFFIXES) or n in NOT_TRACES or os.path.isdir(p) or not os.path.exists(p):
            continue
        if not os.path.isfile(p) or not _is_dump(p):
            out.append(p)
    return out


def _is_dump(path: str) -> bool:
    """A Flight Recorder dump (JSON) beside the traces: no trace. Imported here, not with this module,
    which `diag analyze FILE` imports before its reading starts (entry.read_ahead)."""
    from .flightrec import is_dump

    return is_dump(path)


def summary_files(directory: str) -> list[str]:
    return [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if n.endswith(SUMMARY_SUFFIX)]


def find(root: str, iteration: Optional[int] = None) -> Found:
    """The job's files under `root` (a directory); raises TraceError when there are none, or
    when `iteration` names an iteration that is not there."""
    traces, summaries = trace_files(root), summary_files(root)
    if summaries or any(_is_trace(t) for t in traces):
        notes = [f"--iteration {iteration} ignored: {root} holds trace files itself"] if iteration is not None else []
        return Found(root, traces, summaries, notes)
    candidates = _search(root)
    if candidates:
        picked, why = _pick(root, candidates, iteration)
        return Found(picked.directory, picked.traces, picked.summaries, [f"picked {picked.rel} ({why})"])
    if traces:           # damaged traces, as it seems: load them, so that each problem is reported
        return Found(root, traces, summaries)
    raise TraceError(root, f"no trace files (*.json, *.json.gz) or summaries (*{SUMMARY_SUFFIX}) in this "
                           f"directory or its subfolders (to {MAX_DEPTH} levels)")


# --- searching --------------------------------------------------------------------------------
def _search(root: str) -> list[_Candidate]:
    """Folders below root (not root itself) that hold traces or summaries, breadth first."""
    real_root = os.path.realpath(root)
    found, queue, seen = [], deque([(root, 0)]), 0
    while queue and seen < MAX_FOLDERS:
        folder, depth = queue.popleft()
        seen += 1
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue                     # unreadable: nothing to analyse there
        if depth:
            cand = _candidate(root, folder, entries, real_root)
            if cand is not None:
                found.append(cand)
        if depth < MAX_DEPTH:
            queue.extend((e.path, depth + 1) for e in entries if _enter(e))
    return found


def _enter(entry: os.DirEntry) -> bool:
    """A subfolder worth searching: a real directory (a link could lead out of the root or
    round in a loop), not hidden, not a virtual environment or package cache."""
    if entry.is_symlink() or not entry.is_dir() or entry.name.startswith(".") or entry.name in SKIP_FOLDERS:
        return False
    return not os.path.exists(os.path.join(entry.path, "pyvenv.cfg"))


def _inside(path: str, real_root: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), real_root]) == real_root


def _candidate(root: str, folder: str, entries: list, real_root: str) -> Optional[_Candidate]:
    files = [e for e in entries if e.is_file() and _inside(e.path, real_root)]
    summaries = [e.path for e in files if e.name.endswith(SUMMARY_SUFFIX)]
    traces, others = [], 0
    for e in files:
        if e.name.endswith(TRACE_SUFFIXES) and e.name not in NOT_TRACES:
            if _is_trace(e.path):
                traces.append(e.path)
            else:
                others += 1
                if others >= MAX_NON_TRACES and not traces:
                    break
    if not traces and not summaries:
        return None
    world = _world_size(_head(traces[0], HEAD_BYTES)) if traces else None
    mtime = max(os.path.getmtime(p) for p in traces + summaries)
    return _Candidate(folder, os.path.relpath(folder, root), traces, summaries, world, mtime)


def _head(path: str, size: int = PEEK_BYTES) -> Optional[bytes]:
    """The first `size` bytes of the file's JSON (inflated when gzip), or None if unreadable."""
    try:
        with open_regular(path) as f:          # a FIFO or device named like a trace: not waited on
            raw = f.read(size)
            if raw[:2] != GZIP_MAGIC:
                return raw
            f.seek(0)
            import gzip

            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                return g.read(size)
    except (OSError, EOFError, ValueError, TraceError):
        return None


def _looks_like_trace(head: Optional[bytes]) -> bool:
    return head is not None and _TRACE_KEYS.search(head) is not None


def _is_trace(path: str) -> bool:
    return _looks_like_trace(_head(path))


def _world_size(head: Optional[bytes]) -> Optional[int]:
    info = _DIST_INFO.search(head) if head else None
    world = _WORLD.search(head, info.end()) if info else None
    return int(world.group(1)) if world and int(world.group(1)) > 0 else None


# --- picking ----------------------------------------------------------------------------------
def _pick(root: str, candidates: list[_Candidate], iteration: Optional[int]) -> tuple[_Candidate, str]:
    """The folder to analyse, and a note's reason for it."""
    if iteration is not None:
        return _named_iteration(root, candidates, iteration)
    runs: dict[str, list[_Candidate]] = {}
    for c in candidates:
        runs.setdefault(c.run, []).append(c)
    short = {run: _cut_short(members) for run, members in runs.items()}   # each file's size read once
    best = {run: _latest(members, short[run]) for run, members in runs.items()}
    run = max(best, key=lambda r: (best[r].complete, best[r].mtime, best[r].ranks, r))
    picked, members = best[run], runs[run]
    why = (_iteration_reason(picked, members, short[run]) if picked.iteration is not None
           else _completeness(picked))
    if len(runs) > 1:
        others = ", ".join(sorted(r or "." for r in runs if r != run))
        why += (f"; the newest{' complete' if picked.complete else ''} of {len(runs)} folders with rank traces, "
                f"also: {others}; point diag at one of them for another")
    return picked, why


def _bytes(c: _Candidate) -> int:
    total = 0
    for p in c.traces or c.summaries:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    return total


def _cut_short(members: list[_Candidate]) -> dict[int, tuple[int, float]]:
    """{id(iteration folder): (its bytes, the median of the others')} of the run's iterations that
    hold under PARTIAL_SHARE of the bytes of its other complete iterations: torch.profiler stopped
    in a recording phase (the run ended mid-cycle, as torchtitan's often does) writes what it had,
    a trace of a step barely begun."""
    its = [c for c in members if c.iteration is not None and c.complete]
    if len(its) < 2:
        return {}
    size = {id(c): _bytes(c) for c in its}
    out = {}
    for c in its:
        others = sorted(size[id(o)] for o in its if o is not c)
        median = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1]
                                                                   + others[len(others) // 2]) / 2
        if size[id(c)] < PARTIAL_SHARE * median:
            out[id(c)] = (size[id(c)], median)
    return out


def _latest(members: list[_Candidate], short: dict) -> _Candidate:
    """A run's folder to analyse: its latest complete iteration (a dump cut short by a crash
    is incomplete) that is not a cycle cut short (`short`: `_cut_short(members)`), else its
    latest; a run that is one folder, that folder."""
    return max(members, key=lambda c: (c.complete, id(c) not in short, c.iteration or 0, c.mtime))


def _completeness(c: _Candidate) -> str:
    if c.world is None:
        return f"{c.ranks} rank file(s); world size not stated in them"
    return f"{c.ranks} of {c.world} ranks" if not c.complete else f"all {c.world} ranks"


def _iteration_reason(picked: _Candidate, members: list[_Candidate], short: dict) -> str:
    its = sorted(c.iteration for c in members if c.iteration is not None)
    listed = ", ".join(map(str, its))
    if len(its) == 1:
        return f"the only iteration; {_completeness(picked)}"
    later = sorted((c for c in members if c.iteration is not None and c.iteration > picked.iteration),
                   key=lambda c: c.iteration)

    def why(c: _Candidate) -> str:
        if id(c) in short:
            mine, median = short[id(c)]
            return (f"{_kb(mine)} of traces against {_kb(median)} for the others' median: a profiler cycle "
                    "cut short when the profiler stopped")
        return _completeness(c)
    skipped = "".join(f"; iteration_{c.iteration} skipped: {why(c)}" for c in later)
    return (f"latest{' complete' if later else ''} of {len(its)} iterations: {listed}{skipped}; "
            "--iteration N for another")


def _kb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} KB"


def _named_iteration(root: str, candidates: list[_Candidate], iteration: int) -> tuple[_Candidate, str]:
    its = sorted({c.iteration for c in candidates if c.iteration is not None})
    if not its:
        raise TraceError(root, f"--iteration {iteration}: no iteration_<N> folders with traces below this directory")
    hits = [c for c in candidates if c.iteration == iteration]
    if not hits:
        raise TraceError(root, f"no iteration_{iteration} folder with traces (iterations: {', '.join(map(str, its))})")
    picked = max(hits, key=lambda c: (c.complete, c.mtime, c.rel))
    also = f"; also in {', '.join(sorted(c.rel for c in hits if c is not picked))}" if len(hits) > 1 else ""
    return picked, f"--iteration {iteration} of iterations {', '.join(map(str, its))}; {_completeness(picked)}{also}"
