"""`diag recommend`, `diag compare`, `diag tune`: thin click commands over diag.advise.

Parse, call, render, exit code: 0 on success, 2 on bad input (one line naming the path and
the problem), 1 when the trainer fails under `tune`.
"""
from __future__ import annotations

import sys

import click

from ..report.advice import ADVICE_FORMATS
from ..runinputs import run_options


def _fail(msg: str, code: int = 2) -> None:
    click.echo(f"diag: error: {msg}", err=True)
    sys.exit(code)


def _diagnose(path: str, inputs=None):
    from ..cli import diagnose_or_exit
    from ..runinputs import RunInputs

    return diagnose_or_exit(path, inputs or RunInputs())


FORMAT = click.option("--format", "fmt", type=click.Choice(ADVICE_FORMATS), default="text", show_default=True)
OUTPUT = click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write to FILE instead of stdout.")
FORCE = click.option("--force", is_flag=True, help="Write -o FILE even over an input or inside an analysed directory.")


@click.command()
@click.argument("path", type=click.Path())
@FORMAT
@OUTPUT
@FORCE
@run_options
def recommend(path: str, fmt: str, output, force: bool, inputs) -> None:
    """Recommend the next configuration to try for the run at PATH, with predicted gains."""
    from ..cli import emit, refuse_or_exit, run_files
    from ..report.advice import render_advice
    from ..advise.results import Advice

    refuse_or_exit(output, lambda: run_files(path, inputs), force)
    emit(render_advice(Advice.of(_diagnose(path, inputs)), fmt), output)


@click.command()
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@FORMAT
@OUTPUT
@FORCE
def compare(a: str, b: str, fmt: str, output, force: bool) -> None:
    """Two runs side by side: step time, breakdown, bubble, busbw per axis, throughput."""
    from ..cli import emit, refuse_or_exit, run_files
    from ..report.advice import render_comparison
    from ..advise.compare import compare as cmp

    refuse_or_exit(output, lambda: run_files(a) + run_files(b), force)
    emit(render_comparison(cmp(_diagnose(a), _diagnose(b)), fmt), output)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/tune", show_default=True,
              help="Directory for the runs (before/, after/, repeats).")
@click.option("--repeats", type=click.IntRange(1, 10), default=2, show_default=True,
              help="Runs of each configuration, alternating in pairs, each profiled; the measured change is the "
                   "median over the pairs, the predicted one the median of each 'before' run's price of it "
                   "(3 or more: one disturbed run or pair does not set them).")
@click.option("--max-repeats", type=click.IntRange(1, 20), default=None,
              help="After --repeats pairs, more pairs, one at a time, until the measured change settles (the "
                   "median's distribution-free interval over the pairs, 75% or more, 10 points wide or less and "
                   "within a quarter of the median either side) or "
                   "there are this many; default: --repeats (no more).")
@click.option("--max-minutes", type=click.FloatRange(0, min_open=True), default=None,
              help="With --max-repeats: no pair past --repeats that would take the pairs (timed from the first "
                   "'after' run) past this many minutes; default: no limit but --max-repeats.")
@click.option("--timeout", type=click.FloatRange(1), default=600, show_default=True, help="Seconds per trainer run.")
@click.option("--rule", default=None, help="Apply this rule's recommendation (e.g. micro_batch), not the top one.")
@click.option("--memory-per-gpu", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Device memory in GiB the recommendations must fit (on CPU runs there is none to read).")
@click.option("--bench", "bench_path", type=click.Path(dir_okay=False), default=None,
              help="A `diag bench` result every run's collectives are set against (the DP bucket rule, "
                   "dp_bucket_curve, needs one).")
@click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED)
def tune(out_dir: str, repeats: int, max_repeats, max_minutes, timeout: float, rule, memory_per_gpu,
         bench_path, trainer_args) -> None:
    """Run the trainer with TRAINER_ARGS, apply the top recommendation, re-run, print predicted vs measured.

    Example: diag tune --out runs/tune -- --nproc 2 --pipeline-model-parallel-size 2
    --micro-batch-size 8 --global-batch-size 8 --train-iters 16
    """
    import shlex

    from ..report.advice import render_tune
    from ..advise.tune import TuneError, tune as run_tune
    from ..analysis.benchcurve import load_bench
    from ..trace.errors import TraceError

    if not trainer_args:
        _fail("tune: give the trainer's flags after --, e.g. diag tune -- --nproc 2 --pipeline-model-parallel-size 2")
    if "--out" in trainer_args:
        _fail("tune: set the output directory with diag tune --out, not in the trainer's flags")
    if max_repeats is not None and max_repeats < repeats:
        _fail(f"tune: --max-repeats {max_repeats} is under --repeats {repeats}")
    command = shlex.join(["python", "-m", "instrumented_trainer", *trainer_args])
    try:
        bench = load_bench(bench_path) if bench_path else None
    except TraceError as e:
        _fail(f"tune: --bench {e}")
    try:
        res = run_tune(command, out_dir, timeout=timeout, repeats=repeats, rule=rule, max_repeats=max_repeats,
                       max_minutes=max_minutes, say=lambda m: click.echo(f"diag tune: {m}", err=True),
                       memory_per_gpu=memory_per_gpu * (1 << 30) if memory_per_gpu else None, bench=bench)
    except TuneError as e:
        _fail(str(e), 1)
    click.echo(render_tune(res), nl=False)
