"""`diag bench`: measure collective bandwidth over the TP/PP/DP groups of a grid.

Runs `python -m instrumented_trainer.collbench` as a subprocess (diag itself never imports
torch), passes its nccl-tests style table through, then reads the JSON back with the
torch-free loader to confirm it and print a one-line summary.
"""
from __future__ import annotations

import subprocess
import sys

import click

from ..analysis.benchcurve import load_bench
from ..trace.errors import TraceError


def collbench_argv(nproc, tp, pp, min_bytes, max_bytes, iters, warmup, ops, cpu, out):
    """The collbench command line for these options (python executable excluded)."""
    argv = ["-m", "instrumented_trainer.collbench", "--nproc", str(nproc),
            "--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--min-bytes", min_bytes, "--max-bytes", max_bytes, "--iters", str(iters),
            "--warmup", str(warmup), "--out", out]
    if ops:
        argv += ["--ops", ops]
    if cpu:
        argv.append("--cpu")
    return argv


@click.command()
@click.option("--nproc", type=click.IntRange(1), required=True, help="Local processes to start.")
@click.option("--tp", "--tensor-model-parallel-size", "tp", type=click.IntRange(1), default=1,
              show_default=True)
@click.option("--pp", "--pipeline-model-parallel-size", "pp", type=click.IntRange(1), default=1,
              show_default=True)
@click.option("--min-bytes", default="8", show_default=True, help="Smallest message (8, 1K, 4M).")
@click.option("--max-bytes", default="64M", show_default=True, help="Largest message.")
@click.option("--iters", type=click.IntRange(1), default=20, show_default=True)
@click.option("--warmup", type=click.IntRange(0), default=5, show_default=True)
@click.option("--ops", default=None, help="Comma-separated subset of all_reduce, all_gather, "
              "reduce_scatter, broadcast, all_to_all, send_recv.")
@click.option("--cpu", is_flag=True, help="gloo on CPU even where CUDA is present.")
@click.option("--output", "-o", default="bench.json", show_default=True,
              type=click.Path(dir_okay=False), help="Where to write the JSON result.")
@click.option("--python", "python", default=sys.executable, show_default="this interpreter",
              help="Python with torch installed, to run the benchmark.")
def bench(nproc, tp, pp, min_bytes, max_bytes, iters, warmup, ops, cpu, output, python):
    """Time collectives on the TP/PP/DP groups (nccl-tests algbw/busbw) and write JSON."""
    if nproc % (tp * pp):
        raise click.UsageError(f"--nproc {nproc} is not divisible by --tp {tp} x --pp {pp}")
    argv = collbench_argv(nproc, tp, pp, min_bytes, max_bytes, iters, warmup, ops, cpu, output)
    code = subprocess.call([python, *argv])
    if code != 0:
        click.echo(f"error: the benchmark exited with code {code}", err=True)
        sys.exit(code if code > 0 else 1)
    try:
        curve = load_bench(output)
    except TraceError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    n = sum(len(p) for p in curve.points.values())
    click.echo(f"wrote {output}: {n} points over {len(curve.points)} axis x op curves "
               f"({curve.backend} on {curve.device}, {len(curve.skipped)} skipped)")
