"""A job's per-rank summaries: read where `diag summarize` (or the trainer) left them, made from
the trace where not. What `diag analyze` loads; the merge (diagnose) takes it from there.

Per file, in worker processes when the job is big (trace.job.each_file): a trace with a
summary next to it that was made from this very trace (size and fingerprint) is not parsed
again; any other trace is loaded and summarised (the per-rank pass, rankpass.summarize) in the
worker, which sends back only the summary. So the main process holds summaries, never every
rank's events, and its memory grows with the workers, not with the ranks. A summary whose
trace is not there (the traces stayed on the cluster, the summaries were copied) is used as it
is; a summary of a trace that could not be read is reported as that trace's problem.
"""
from __future__ import annotations

import os
from dataclasses import field
from typing import Callable, Optional

from ..trace.errors import TraceError
from ..trace.discover import SUMMARY_SUFFIX as SUFFIX, find
from ..trace.job import FileProblem, Job, assemble, each_file, load_rank
from ..trace.read import file_size
from .rankpass import KEEP_KERNELS, RankSummary, summarize
from ..record import record


@record
class Item:
    """One rank's files: its trace, its summary, or both."""

    trace: Optional[str]              # the trace file, when present
    summary: Optional[str]            # its summary file, when present


@record
class Got:
    """One rank as read: its summary, or the problem, and from where."""

    path: str
    summary: Optional[RankSummary] = None
    problem: Optional[str] = None
    how: str = "trace"                # "trace" | "summary" | "stale"
    notes: list = field(default_factory=list)


def items_of(path: str, iteration: Optional[int] = None) -> tuple[list[Item], str, list[str]]:
    """(files to analyse, the directory holding diag_run.json, notes on which folder was picked
    when the traces are in subfolders: trace.discover)."""
    if os.path.isdir(path):
        found = find(path, iteration)
        return [Item(t, s) for t, s in found.ranks()], found.directory, found.notes
    if not os.path.exists(path):
        raise TraceError(path, "no such file or directory")
    where = os.path.dirname(os.path.abspath(path))
    if path.endswith(SUFFIX):
        return [Item(None, path)], where, []
    return [Item(path, path + SUFFIX if os.path.exists(path + SUFFIX) else None)], where, []


def _from_trace(trace: str, top_n: int) -> RankSummary:
    return summarize(load_rank(trace), top_n)


def get(item: Item, top_n: int = 10, use_summaries: bool = True) -> Got:
    """One rank: from its summary when that is usable, else from its trace. Never raises for
    bad input: the problem is returned, naming the file."""
    notes = []
    try:
        if item.summary and (use_summaries or item.trace is None):
            from . import summary_file         # only where there are summaries: ~2 ms of imports otherwise
            try:
                sf = summary_file.read(item.summary)
            except TraceError as e:
                if item.trace is None:
                    raise
                sf = None
                notes.append(f"{os.path.basename(item.summary)}: {e.problem}; analysed the trace instead")
            if sf is not None:
                if item.trace is None:
                    if sf.problem:
                        return Got(sf.trace, problem=sf.problem, how="summary")
                    return Got(item.summary, sf.summary, how="summary")
                if summary_file.matches(sf, item.trace) and (sf.summary is None or sf.summary.top_n >= top_n):
                    if sf.problem:
                        return Got(item.trace, problem=sf.problem, how="summary")
                    s = sf.summary
                    s.path = s.result.file = item.trace              # where the trace is now
                    return Got(item.trace, s, how="summary")
                if not summary_file.matches(sf, item.trace):
                    notes.append(f"{os.path.basename(item.summary)} was made from another version of "
                                 f"{os.path.basename(item.trace)}; analysed the trace instead")
        return Got(item.trace, _from_trace(item.trace, top_n), how="stale" if notes else "trace", notes=notes)
    except TraceError as e:
        return Got(e.path, problem=e.problem, notes=notes)


class _Getter:
    """get() with fixed options, as a picklable callable for the worker pool."""

    def __init__(self, top_n: int, use_summaries: bool) -> None:
        self.top_n, self.use_summaries = top_n, use_summaries

    def __call__(self, item: Item) -> Got:
        return get(item, self.top_n, self.use_summaries)


def load_summaries(path: str, strict: bool = False, top_n: int = 10, use_summaries: bool = True,
                   progress: Optional[Callable[[str, int, int], None]] = None,
                   iteration: Optional[int] = None) -> Job:
    """A Job whose ranks are RankSummary: what `diagnose` needs, without any rank's events.
    `iteration`: which of torchtitan's profile_traces/iteration_<N> folders (default the latest).

    Raises TraceError when nothing at all can be analysed (or, with strict, on any bad file).
    """
    items, meta_dir, picked = items_of(path, iteration)
    sizes = [file_size(i.trace) if i.trace else 0 for i in items]
    loaded, problems, notes, how = [], [], [], {"trace": 0, "summary": 0, "stale": 0}
    for k, got in enumerate(each_file(_Getter(top_n, use_summaries), items, sizes)):
        if progress:
            progress(got.path, k + 1, len(items))
        notes += got.notes
        if got.summary is not None:
            loaded.append(got.summary)
            how[got.how] += 1
        elif strict:
            raise TraceError(got.path, got.problem)
        else:
            problems.append(FileProblem(got.path, got.problem))
    if not loaded:
        if len(problems) == 1:
            raise TraceError(problems[0].path, problems[0].problem)
        raise TraceError(path, f"none of the {len(items)} files could be read "
                               f"(first: {os.path.basename(problems[0].path)}: {problems[0].problem})")
    job = assemble(path, loaded, problems, meta_dir, strict)
    job.notes[:0] = picked
    if how["summary"]:
        job.notes.append(f"{how['summary']} of {len(loaded)} ranks read from their summaries (*{SUFFIX}, "
                         f"`diag summarize`); use --no-summaries to analyse every trace")
    job.notes += notes
    return job


def summarize_file(trace: str, out_dir: Optional[str] = None, top_n: int = KEEP_KERNELS) -> tuple[str, Optional[str]]:
    """Write `trace`'s summary (or the reason it cannot be read); (summary path, problem or None)."""
    from . import summary_file
    out = summary_file.summary_path(trace, out_dir)
    try:
        sf = summary_file.make(trace, _from_trace(trace, top_n))
        problem = None
    except TraceError as e:
        sf, problem = summary_file.make(trace, None, e.problem), e.problem
    summary_file.write(out, sf)
    return out, problem
