"""`diag`: a thin command line over the library (parse, call, render, exit code).

Exit codes: 0 success; 2 bad input or usage (the message names the file and the problem).
"""
from __future__ import annotations

import os
import sys

import click

from .trace.errors import TraceError

FORMATS = ("text", "json", "markdown")


def _progress():
    """A progress bar on stderr when it is a terminal; nothing when piped."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    con = Console(stderr=True)
    if not con.is_terminal:
        return None, None
    bar = Progress(TextColumn("loading traces"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.description}"), console=con, transient=True)
    task = bar.add_task("", total=None)

    def update(path: str, done: int, total: int) -> None:
        bar.update(task, completed=done, total=total, description=os.path.basename(path))

    return bar, update


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
def analyze(path: str, fmt: str, output: str | None, strict: bool, top: int) -> None:
    """Analyse a trace file or a directory of per-rank traces (.json or .json.gz)."""
    from .analysis import diagnose
    from .report import RENDERERS
    from .trace import load_job

    bar, update = _progress()
    try:
        if bar:
            with bar:
                job = load_job(path, strict=strict, progress=update)
        else:
            job = load_job(path, strict=strict)
    except TraceError as e:
        click.echo(f"diag: error: {e}", err=True)
        sys.exit(2)
    report = RENDERERS[fmt](diagnose(job, top_n=top))
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
