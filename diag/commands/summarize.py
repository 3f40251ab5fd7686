"""`diag summarize PATH...`: each rank's per-rank pass, written next to its trace (`*.diagsum`).

Made to run where the traces are written, under the job's own launcher, one task per node:

    srun --ntasks-per-node=1 diag summarize /scratch/run42/traces
    torchrun --nnodes=$N --nproc-per-node=1 --no-python diag summarize /scratch/run42/traces

Every task lists the same files (sorted) and takes its share, file i going to task i mod n, n
and its own index read from the launcher's environment (SLURM_NTASKS / SLURM_PROCID under srun,
WORLD_SIZE / RANK under torchrun) or given with --shard I/N. Within a task the files are spread
over the cores. `diag analyze DIR` then reads the summaries instead of the traces, so the merge
of a 1,024-rank job takes seconds on a laptop; copy the `*.diagsum` files (and diag_run.json, and
the Flight Recorder's dumps; `-o DIR` takes them along) to analyse without the traces. With --dask ADDRESS (or `--dask local`) the files are summarised
on a Dask cluster instead (the `cluster` extra).

Exit codes: 0 every file of this task summarised (or already up to date); 1 some traces could not
be read (each named on stderr; its summary records the problem, so `diag analyze` reports it);
2 bad usage or nothing to do.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Optional

import click

from ..analysis import summary_file
from ..analysis.collect import summarize_file
from ..analysis.rankpass import KEEP_KERNELS
from ..trace.errors import TraceError
from ..trace.flightrec import DUMP_FOLDERS, dump_files
from ..trace import discover
from ..trace.job import each_file
from ..trace.read import file_size
from ..trace.safeio import atomic_write, read_regular

_LAUNCHERS = (("SLURM_PROCID", "SLURM_NTASKS", "srun"), ("RANK", "WORLD_SIZE", "torchrun"))


def shard_of(given: Optional[str], env=os.environ) -> tuple[int, int, str]:
    """(index, count, where from): --shard I/N, else the launcher's environment, else 0/1."""
    if given and given != "auto":
        try:
            i, n = (int(x) for x in given.split("/"))
        except ValueError:
            raise click.BadParameter(f"{given!r}: expected I/N, e.g. 0/4") from None
        if not (n >= 1 and 0 <= i < n):
            raise click.BadParameter(f"{given!r}: need 0 <= I < N")
        return i, n, "--shard"
    for idx, count, name in _LAUNCHERS:
        if env.get(idx, "").isdigit() and env.get(count, "").isdigit() and int(env[idx]) < int(env[count]):
            return int(env[idx]), int(env[count]), f"{name} ({idx}/{count})"
    return 0, 1, "one task"


def files_of(paths: tuple[str, ...]) -> list[str]:
    out = []
    for p in paths:
        if os.path.isdir(p):             # the job's own layout too: subfolders, the latest iteration_N
            try:
                out += discover.find(p).traces
            except TraceError:
                pass                     # no traces: said once for all the paths below

        elif os.path.isfile(p):
            out.append(p)
        else:
            raise TraceError(p, "no such file or directory")
    return sorted(dict.fromkeys(os.path.abspath(f) for f in out))


def up_to_date(trace: str, out_dir: Optional[str]) -> bool:
    path = summary_file.summary_path(trace, out_dir)
    if not os.path.exists(path):
        return False
    try:
        return summary_file.matches(summary_file.read(path), trace)
    except TraceError:
        return False


RUN_FILES = ("diag_run.json", "diag_bench.json")


def _copy_run_files(paths, out_dir: str) -> None:
    """The run's metadata and its Flight Recorder dumps (small: one ring buffer per rank) go with
    the summaries, so the out dir can be analysed on its own."""
    for p in paths:
        d = p if os.path.isdir(p) else os.path.dirname(os.path.abspath(p))
        todo = [(os.path.join(d, name), os.path.join(out_dir, name)) for name in RUN_FILES]
        todo += [(src, os.path.join(out_dir, DUMP_FOLDERS[0], os.path.basename(src))) for src in dump_files(d)]
        for src, dst in todo:
            if os.path.isfile(src) and not os.path.lexists(dst):      # a planted link is not followed
                try:
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                    atomic_write(dst, read_regular(src))
                except (TraceError, OSError) as e:
                    click.echo(f"diag: {e}", err=True)


class _Task:
    """Summarise one trace (picklable, for the worker pool): (trace, summary path, problem)."""

    def __init__(self, out_dir: Optional[str], top_n: int) -> None:
        self.out_dir, self.top_n = out_dir, top_n

    def __call__(self, trace: str):
        try:
            out, problem = summarize_file(trace, self.out_dir, self.top_n)
        except OSError as e:          # the summary itself cannot be written (disk full, read-only)
            return trace, None, f"cannot write its summary: {e.strerror or e}"
        return trace, out, problem


def _on_dask(address: str, todo: list[str], task: _Task):
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise click.UsageError("--dask needs dask.distributed: pip install 'diag[cluster]'") from None
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) \
        if address == "local" else None
    with Client(cluster if cluster else address) as client:
        futures = client.map(task, todo, pure=False)
        for f in as_completed(futures):
            yield f.result()
    if cluster:
        cluster.close()


def lower_priority(niceness: int, idle: bool) -> None:
    """Best effort: this process (and the workers it forks) yield the CPU to training.
    SCHED_IDLE runs only when a core has nothing else to run; nice only lowers the share."""
    try:
        if idle and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        elif niceness:
            os.nice(niceness)
    except OSError:
        pass


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--out-dir", "-o", type=click.Path(file_okay=False), default=None,
              help="Write the summaries here instead of next to each trace.")
@click.option("--shard", default="auto", show_default=True,
              help="I/N: summarise files i with i mod N == I. auto: from srun's or torchrun's environment.")
@click.option("--force", is_flag=True, help="Summarise again even where an up-to-date summary exists.")
@click.option("--top", default=KEEP_KERNELS, show_default=True, type=click.IntRange(1, 1000),
              help="Kernels kept per rank (`diag analyze --top` up to this can use the summary).")
@click.option("--dask", "dask_address", default=None, metavar="ADDRESS",
              help="Run on this Dask scheduler (tcp://host:8786), or 'local' for a local cluster.")
@click.option("--nice", "niceness", type=click.IntRange(0, 19), default=0, show_default=True,
              help="Lower this process's priority by N (on a node that is still training).")
@click.option("--idle", is_flag=True,
              help="Run only on CPU time nothing else wants (Linux SCHED_IDLE; elsewhere --nice 19): "
                   "what the trainer uses while it is still training.")
@click.option("--quiet", "-q", is_flag=True, help="Print problems only.")
def summarize(paths, out_dir, shard, force, top, dask_address, niceness, idle, quiet) -> None:
    """Summarise per-rank traces where they are written, for a fast `diag analyze`.

    Each trace's summary (the per-rank pass of the analysis) goes next to it as
    <trace>.diagsum. Under srun or torchrun each task takes its share of the files.
    """
    t0 = time.monotonic()
    lower_priority(19 if idle else niceness, idle)
    try:
        files = files_of(paths)
    except TraceError as e:
        click.echo(f"diag: error: {e}", err=True)
        sys.exit(2)
    if not files:
        click.echo(f"diag: error: no trace files (*.json, *.json.gz) in {', '.join(paths)}", err=True)
        sys.exit(2)
    index, count, source = shard_of(shard)
    mine = files[index::count]
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        _copy_run_files(paths, out_dir)
    todo = mine if force else [f for f in mine if not up_to_date(f, out_dir)]
    task = _Task(out_dir, top)
    from ..cli import _progress

    bar, update = _progress("summarising")
    results = _on_dask(dask_address, todo, task) if dask_address else \
        each_file(task, todo, [file_size(f) for f in todo])
    problems = []
    with bar or contextlib.nullcontext():
        for k, (trace, out, problem) in enumerate(results):
            if update:
                update(trace, k + 1, len(todo))
            if problem:
                problems.append(trace)
                click.echo(f"diag: {trace}: {problem}", err=True)
    if not quiet:
        where = f"task {index} of {count}, from {source}" if count > 1 else source
        click.echo(f"diag summarize: {len(todo) - len(problems)} of {len(mine)} traces summarised, "
                   f"{len(mine) - len(todo)} already up to date, {len(problems)} unreadable "
                   f"({where}; {len(files)} in all) in {time.monotonic() - t0:.1f} s", err=True)
    sys.exit(1 if problems else 0)
