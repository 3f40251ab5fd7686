"""A job: the per-rank traces of one run, loaded from a file or a directory.

Policy for bad input (explicit, per STYLE.md): a file that cannot be read is recorded
as a problem with its reason and the other ranks are still loaded; `strict=True`
raises on the first one instead. Files from a different run found in the same
directory (another world size, a start time far apart, or a rank seen twice) are set
aside and reported, never mixed into the analysis.
"""
from __future__ import annotations

import os
from dataclasses import field
from typing import Callable, Optional


from .. import runmeta
from ..runmeta import RunFacts, RunMetaError
from .build import build_rank
from .discover import NOT_TRACES, SUMMARY_SUFFIX, TRACE_SUFFIXES, find, trace_files  # noqa: F401 (re-exported)
from .errors import TraceError
from .read import decode_trace, file_size, in_one_process, read_bytes, splits, workers
from .safeio import read_regular
from .table import RankTrace
from ..record import record

RUN_METADATA = "diag_run.json"
MAX_RUN_METADATA_BYTES = 1 << 20
# Ranks of one run start their profilers within seconds of each other (same schedule);
# two runs in one folder are minutes apart. Clocks of different hosts may differ too.
SAME_RUN_WINDOW_S = 300.0
MISSING_LISTED = 4096              # missing ranks listed by number (Job.missing_count counts them all)


@record
class FileProblem:
    """A file of the job that could not be read, and why."""

    path: str
    problem: str


@record
class Job:
    """The ranks of one run, as loaded, and the files that could not be."""

    source: str
    ranks: list[RankTrace]
    problems: list[FileProblem] = field(default_factory=list)
    other_runs: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    run_meta: Optional[RunFacts] = None

    @property
    def world_size(self) -> Optional[int]:
        sizes = {r.world_size for r in self.ranks if r.world_size}
        return max(sizes) if sizes else None

    @property
    def missing_count(self) -> int:
        """Ranks of the world without a trace here (counted, not listed: the world size is a claim)."""
        ws = self.world_size
        return ws - len({r.rank for r in self.ranks if r.rank is not None and 0 <= r.rank < ws}) if ws else 0

    @property
    def missing_ranks(self) -> list[int]:
        """The first MISSING_LISTED of them by number: the loop ends after at most that many plus
        the ranks present, whatever world size a file claims (2^24 used to take minutes and GBs)."""
        ws, have, out = self.world_size or 0, {r.rank for r in self.ranks}, []
        r = 0
        while r < ws and len(out) < MISSING_LISTED:
            if r not in have:
                out.append(r)
            r += 1
        return out


def load_rank(path: str) -> RankTrace:
    """Load one trace file; raises TraceError naming the file and the problem."""
    data = read_bytes(path)
    try:
        return build_rank(path, decode_trace(path, data))
    except TraceError:
        if not splits(data):
            raise
        # The top level was split around the events without reading them (a big file): if
        # that went wrong, the whole document decoded at once is right, or says what is wrong.
        return build_rank(path, decode_trace(path, data, split=False))


def _try_load(path: str):
    try:
        return path, load_rank(path), None
    except TraceError as e:
        return e.path, None, e.problem


def _one_process_each() -> None:
    os.environ["DIAG_WORKERS"] = "1"        # a rank's own chunks stay in its worker: no nested pools


def each_file(fn: Callable, items: list, sizes: list[int]):
    """fn(item) for each item, in order, spread over the cores when the job is big enough.

    Each worker holds one file at a time and sends back fn's (compact) result, so memory grows
    with the workers, not the ranks. sizes: bytes on disk per item.
    """
    if in_one_process(sizes):
        yield from map(fn, items)
        return
    import multiprocessing            # here: ~7 ms to import, and a single trace never needs it

    n = min(workers(), len(items))
    with multiprocessing.get_context("fork").Pool(n, initializer=_one_process_each) as pool:
        yield from pool.imap(fn, items)


def _load_each(files: list[str]):
    """(path, RankTrace or None, problem) per file, in order."""
    yield from each_file(_try_load, files, [file_size(f) for f in files])


def load_job(path: str, strict: bool = False,
             progress: Optional[Callable[[str, int, int], None]] = None, iteration: Optional[int] = None) -> Job:
    """Load a trace file or a directory of per-rank traces (the directory's own, or those found
    in its subfolders as jobs lay them out: see discover; `iteration` picks torchtitan's
    profile_traces/iteration_<N>).

    Raises TraceError when nothing at all can be analysed (or, with strict, on any bad file).
    """
    notes = []
    if os.path.isdir(path):
        found = find(path, iteration)
        files, meta_dir, notes = found.traces, found.directory, found.notes
        if not files:
            raise TraceError(found.directory, "no trace files (*.json, *.json.gz) in this directory")
    elif os.path.exists(path):
        files, meta_dir = [path], os.path.dirname(os.path.abspath(path))
    else:
        raise TraceError(path, "no such file or directory")

    loaded, problems = [], []
    for i, (f, rt, problem) in enumerate(_load_each(files)):
        if progress:
            progress(f, i + 1, len(files))
        if rt is not None:
            loaded.append(rt)
        elif strict:
            raise TraceError(f, problem)
        else:
            problems.append(FileProblem(f, problem))
    if not loaded:
        if len(problems) == 1:
            raise TraceError(problems[0].path, problems[0].problem)
        raise TraceError(path, f"none of the {len(files)} trace files could be read "
                               f"(first: {os.path.basename(problems[0].path)}: {problems[0].problem})")
    job = assemble(path, loaded, problems, meta_dir, strict)
    job.notes[:0] = notes
    return job


def assemble(path: str, loaded: list, problems: list[FileProblem], meta_dir: str, strict: bool) -> Job:
    """A Job of the ranks loaded (RankTrace, or anything with the same path, rank, world_size
    and start_epoch_us: analysis.rankpass.RankSummary): runs told apart, run metadata read."""
    job = Job(source=str(path), ranks=[], problems=problems)
    _assign_runs(job, loaded)
    job.run_meta = _read_run_meta(meta_dir, job, strict)
    return job


def _assign_runs(job: Job, loaded: list[RankTrace]) -> None:
    """Split files into runs; analyse the largest, report the others."""
    runs: list[list[RankTrace]] = []
    for rt in sorted(loaded, key=lambda r: (r.world_size or 0, r.start_epoch_us or 0.0, r.path)):
        for run in runs:
            first = run[0]
            if (first.world_size == rt.world_size
                    and abs((rt.start_epoch_us or 0) - (first.start_epoch_us or 0)) <= SAME_RUN_WINDOW_S * 1e6):
                twin = next((r for r in run if rt.rank is not None and r.rank == rt.rank), None)
                if twin is None:
                    run.append(rt)
                else:                 # same run, same rank: a copy, not another run
                    job.problems.append(FileProblem(rt.path, f"a duplicate of rank {rt.rank}: {twin.path} claims "
                                                             "the same rank in the same run; set aside"))
                break
        else:
            runs.append([rt])
    runs.sort(key=lambda run: (len(run), max(r.start_epoch_us or 0 for r in run)), reverse=True)
    main = runs[0]
    for other in runs[1:]:
        job.other_runs.append(sorted(r.path for r in other))
        job.notes.append(
            f"{len(other)} file(s) belong to another run (world size {other[0].world_size}, "
            f"ranks {sorted(r.rank for r in other if r.rank is not None)}) and were not mixed in: "
            + ", ".join(os.path.basename(r.path) for r in other))
    unranked = sorted((r for r in main if r.rank is None), key=lambda r: r.path)
    used = {r.rank for r in main if r.rank is not None}
    free = (i for i in range(len(main) + len(used) + 1) if i not in used)
    for r in unranked:
        if hasattr(r, "set_rank"):
            r.set_rank(next(free))
        else:
            r.rank = next(free)
        job.notes.append(f"{os.path.basename(r.path)}: no usable rank in distributedInfo (none, or implausible); shown as rank {r.rank}")
    job.ranks = sorted(main, key=lambda r: r.rank)


def _read_run_meta(directory: str, job: Job, strict: bool) -> Optional[RunFacts]:
    """The run's diag_run.json, validated (diag.runmeta); a bad one is a problem, not a crash."""
    p = os.path.join(directory, RUN_METADATA)
    if not os.path.exists(p):
        return None
    try:
        data = read_regular(p, MAX_RUN_METADATA_BYTES)    # a regular file only: no FIFO, no device
        return runmeta.decode(data)
    except (TraceError, RunMetaError) as e:
        why = e.problem if isinstance(e, TraceError) else e
        reason = f"unusable run metadata, ignored: {why}"
        if strict:
            raise TraceError(p, reason) from None
        job.problems.append(FileProblem(p, reason))
        return None
