"""`diag`: a thin command line over the library (parse, call, render, exit code).

Exit codes: 0 success; 2 bad input or usage (the message names the file and the problem).
"""
from __future__ import annotations

import importlib
import os
import sys

import click

from .report import FORMATS
from .trace.errors import TraceError



def _progress(what: str = "loading traces"):
    """A progress bar on stderr when it is a terminal; nothing when piped."""
    if not sys.stderr.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    con = Console(stderr=True)
    if not con.is_terminal:
        return None, None
    bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.description}"), console=con, transient=True)
    task = bar.add_task("", total=None)

    def update(path: str, done: int, total: int) -> None:
        bar.update(task, completed=done, total=total, description=os.path.basename(path))

    return bar, update


# Subcommands defined in their own modules, imported only when invoked, so `diag analyze`
# never pays for the dashboard's or the recommender's imports. One line per command.
LAZY_COMMANDS: dict[str, str] = {
    "export": "diag.export.commands:export",
    "recommend": "diag.advise.commands:recommend",
    "compare": "diag.advise.commands:compare",
    "tune": "diag.advise.commands:tune",
    "dashboard": "diag.dashboard_cmd:dashboard",
    "bench": "diag.bench_cmd:bench",
    "summarize": "diag.summarize_cmd:summarize",
}


class LazyGroup(click.Group):
    """A click group whose LAZY_COMMANDS are imported on use (click docs: lazy subcommands)."""

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            module, attr = LAZY_COMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


BENCH_NEXT_TO_TRACES = "diag_bench.json"


def _bench_for(path: str, given: str | None):
    """The busbw curve given with --bench, or the diag_bench.json found next to the traces."""
    from .analysis.benchcurve import load_bench

    if given:
        return load_bench(given)
    beside = os.path.join(path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)),
                          BENCH_NEXT_TO_TRACES)
    return load_bench(beside) if os.path.isfile(beside) else None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="diag")
def main() -> None:
    """Diagnose 3D-parallel PyTorch training from profiler traces."""


@main.command()
@click.argument("path", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="Report format.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True),
              help="Write the report to FILE instead of stdout.")
@click.option("--strict", is_flag=True, help="Fail on the first unreadable rank file instead of reporting it.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(1, 1000),
              help="Kernels to list per rank.")
@click.option("--tp", "--tensor-model-parallel-size", "tp", type=click.IntRange(1), default=None,
              help="TP size, to attribute process groups to axes (default: from diag_run.json).")
@click.option("--pp", "--pipeline-model-parallel-size", "pp", type=click.IntRange(1), default=None,
              help="PP size (default: from diag_run.json). DP = world / (TP x PP).")
@click.option("--link-gbps", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Link peak in GB/s for busbw efficiency (default: from the device's NVLink/PCIe table).")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Peak dense TFLOP/s per device for MFU (default: diag_run.json or the device table).")
@click.option("--global-batch-size", type=click.IntRange(1), default=None, help="Sequences per step (for tokens/s, MFU).")
@click.option("--seq-length", type=click.IntRange(1), default=None, help="Tokens per sequence.")
@click.option("--num-layers", type=click.IntRange(1), default=None, help="Transformer layers (for model FLOPs).")
@click.option("--hidden-size", type=click.IntRange(1), default=None, help="Hidden size (for model FLOPs).")
@click.option("--vocab-size", type=click.IntRange(1), default=None, help="Vocabulary size (for model FLOPs).")
@click.option("--num-micro-batches", type=click.IntRange(1), default=None, help="Micro-batches per step (for the ideal bubble).")
@click.option("--bench", "bench_path", type=click.Path(dir_okay=False), default=None,
              help="A `diag bench` result: set each collective against the busbw measured on its axis at its "
                   "size (default: diag_bench.json next to the traces, if there is one).")
@click.option("--no-summaries", is_flag=True,
              help="Analyse every trace even where `diag summarize` left a summary (*.diagsum) of it.")
def analyze(path: str, fmt: str, output: str | None, strict: bool, top: int, tp, pp, link_gbps, peak_tflops,
            bench_path, no_summaries: bool, **shape) -> None:
    """Analyse a trace file or a directory of per-rank traces (.json or .json.gz).

    Where a rank's summary (`diag summarize`, or the trainer's own) sits next to its trace and
    was made from it, the summary is used instead of parsing the trace again; a directory of
    summaries alone (the traces left on the cluster) is analysed too. Run facts (sizes, batch,
    model shape) come from the trainer's diag_run.json next to the traces; the flags override
    them, and what neither gives is reported as unknown.
    """
    from .analysis import diagnose
    from .analysis.collect import load_summaries
    from .report import render

    bar, update = _progress()
    kw = dict(strict=strict, top_n=top, use_summaries=not no_summaries)
    try:
        if bar:
            with bar:
                job = load_summaries(path, progress=update, **kw)
        else:
            job = load_summaries(path, **kw)
    except TraceError as e:
        click.echo(f"diag: error: {e}", err=True)
        sys.exit(2)
    try:
        bench = _bench_for(path, bench_path)
        diagnosis = diagnose(job, top_n=top, tp=tp, pp=pp, link_gbps=link_gbps, peak_tflops=peak_tflops,
                             shape=shape, bench=bench)
    except TraceError as e:          # an unreadable --bench file
        click.echo(f"diag: error: {e}", err=True)
        sys.exit(2)
    except ValueError as e:          # e.g. --tp/--pp that do not divide the world size
        click.echo(f"diag: error: {path}: {e}", err=True)
        sys.exit(2)
    report = render(diagnosis, fmt)
    if output:
        try:
            with open(output, "w", encoding="utf-8") as f:
                f.write(report)
        except OSError as e:
            click.echo(f"diag: error: {output}: cannot write: {e.strerror or e}", err=True)
            sys.exit(2)
    else:
        click.echo(report, nl=False)


if __name__ == "__main__":
    main()
