"""`diag`: a thin command line over the library (parse, call, render, exit code).

Exit codes: 0 success; 2 bad input or usage (the message names the file and the problem).
"""
from __future__ import annotations

import atexit
import dataclasses
import gc
import importlib
import os
import sys
from typing import Callable, Optional

import click

from .entry import one_blas_thread, run  # noqa: F401 (run: the console script of installs before diag.entry)
from .report import FORMATS
from .runinputs import RunInputs, open_run, open_run_job, run_options
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
    "export": "diag.commands.export:export",
    "recommend": "diag.commands.advise:recommend",
    "compare": "diag.commands.advise:compare",
    "tune": "diag.commands.advise:tune",
    "dashboard": "diag.commands.dashboard:dashboard",
    "bench": "diag.commands.bench:bench",
    "summarize": "diag.commands.summarize:summarize",
}
# Their one-line help for `diag --help`, which would otherwise import every command to ask it
# (numpy, the analysis, the recommender); tests/test_imports.py checks each against its docstring.
LAZY_HELP: dict[str, str] = {
    "export": "Export the diagnosis of PATH's traces as Prometheus metrics.",
    "recommend": "Recommend the next configuration to try for the run at PATH, with predicted gains.",
    "compare": "Two runs side by side: step time, breakdown, bubble, busbw per axis, throughput.",
    "tune": "Run the trainer with TRAINER_ARGS, apply the top recommendation, re-run, print predicted vs measured.",
    "dashboard": "Browse runs in a Streamlit app: one run's story, or two runs side by side.",
    "bench": "Time collectives on the TP/PP/DP groups (nccl-tests algbw/busbw) and write JSON.",
    "summarize": "Summarise per-rank traces where they are written, for a fast `diag analyze`.",
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

    def format_commands(self, ctx, formatter) -> None:
        """click's listing, with the lazy commands' help from LAZY_HELP (nothing imported)."""
        limit = formatter.width - 6 - max(map(len, self.list_commands(ctx)))
        own = super().get_command
        rows = [(name, click.utils.make_default_short_help(LAZY_HELP[name], limit) if name in LAZY_HELP
                 else own(ctx, name).get_short_help_str(limit)) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="diag")
def main() -> None:
    """Diagnose 3D-parallel PyTorch training from profiler traces."""
    one_blas_thread()


@main.command()
@click.argument("path", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="Report format.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True),
              help="Write the report to FILE instead of stdout.")
@click.option("--force", is_flag=True, help="Write -o FILE even over an input or inside the analysed directory.")
@click.option("--timeline", type=click.Path(), default=None, metavar="OUT.json",
              help="Also write every rank's events on one timeline (clocks aligned, matched collectives "
                   "linked, findings marked) for ui.perfetto.dev or chrome://tracing. Reads the traces, "
                   "never their summaries.")
@run_options
def analyze(path: str, fmt: str, output: str | None, force: bool, timeline: str | None, inputs: RunInputs) -> None:
    """Analyse a trace file or a directory of per-rank traces (.json or .json.gz).

    A directory may be a job's own layout: rank traces in subfolders, or torchtitan's
    profile_traces/iteration_N (the latest is taken; --iteration N for another). Where a rank's
    summary (`diag summarize`, or the trainer's own) sits next to its trace and was made from it,
    the summary is used instead of parsing the trace again; a directory of summaries alone is
    analysed too. The layout comes from the traces' process-group names, else from the sizes
    given (flags, --config, or the trainer's diag_run.json); run facts (batch, model shape) from
    diag_run.json, --config or the flags; what none gives is reported as unknown.
    """
    from .report import renderer
    from .runinputs import prefetch_trace

    prefetch_trace(path, inputs)          # first: listing what the run reads imports the analysis
    # The renderer's imports (rich, for text) now, while forked workers decode the trace, not after
    draw = renderer(fmt)
    # At exit the interpreter collects and frees every object left (~0.03 s of a 0.4 s run);
    # frozen, they are left to the end of the process. Once per process, however often it analyses.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    read = run_files(path, inputs) if output or timeline else []
    refuse_or_exit(output, lambda: read, force)
    refuse_or_exit(timeline, lambda: read + ([output] if output and output != "-" else []), force)
    if timeline:
        from .report.timeline import refused
        why = refused(timeline, path, inputs.iteration)
        if why:
            click.echo(f"diag: error: {why}", err=True)
            sys.exit(2)
        inputs = dataclasses.replace(inputs, use_summaries=False)
    diagnosis, job = diagnose_or_exit(path, inputs, with_job=True)
    if timeline:
        timeline_or_exit(timeline, diagnosis, job)
    emit(draw(diagnosis), output)


def run_files(path: str, inputs: Optional[RunInputs] = None) -> list[str]:
    """What a command reads for the run at `path` (runinputs.files_read): a report must never be
    written over them."""
    from .runinputs import files_read

    return files_read(path, inputs)


def refuse_or_exit(output: Optional[str], inputs: Callable[[], list[str]], force: bool) -> None:
    """Exit 2, before any work, when `output` would overwrite an input (safeio.refuse_overwrite);
    inputs() lists them (run_files), only when there is an output to check."""
    from .trace.safeio import refuse_overwrite

    why = None if force or not output or output == "-" else refuse_overwrite(output, inputs())
    if why:
        click.echo(f"diag: error: {why}", err=True)
        sys.exit(2)


def emit(text: str, output: Optional[str]) -> None:
    """The report on stdout, or written atomically to `output` (exit 2 naming it if it cannot be)."""
    from .trace.safeio import atomic_write

    if not output or output == "-":
        click.echo(text, nl=False)
        return
    try:
        atomic_write(output, text)
    except OSError as e:
        click.echo(f"diag: error: {output}: cannot write: {e.strerror or e}", err=True)
        sys.exit(2)


def diagnose_or_exit(path: str, inputs: RunInputs, with_job: bool = False):
    """open_run with a progress bar on a terminal; exit 2 with one line on bad input.
    with_job: (Diagnosis, Job), as open_run_job."""
    bar, update = _progress()
    opener = open_run_job if with_job else open_run
    try:
        if bar:
            with bar:
                return opener(path, inputs, progress=update)
        return opener(path, inputs)
    except TraceError as e:
        click.echo(f"diag: error: {e}", err=True)
    except ValueError as e:          # e.g. sizes that do not divide the world size
        click.echo(f"diag: error: {path}: {e}", err=True)
    sys.exit(2)


def timeline_or_exit(out: str, diagnosis, job) -> None:
    """Write the job's timeline (report.timeline), saying on stderr where and how; exit 2 on failure."""
    from .report.timeline import write_timeline

    say = lambda line: click.echo(f"diag: {line}", err=True)      # noqa: E731
    try:
        w = write_timeline(out, diagnosis, job, progress=say)
    except TraceError as e:
        click.echo(f"diag: error: {e}", err=True)
        sys.exit(2)
    except OSError as e:
        click.echo(f"diag: error: {out}: cannot write the timeline: {e.strerror or e}", err=True)
        sys.exit(2)
    say(w.note)
    say(f"timeline of {len(w.ranks)} ranks, {sum(c.events for c in w.ranks.values()):,} events and {w.marks} "
        f"finding marks written to {out}: open it in ui.perfetto.dev or chrome://tracing")


if __name__ == "__main__":
    run()
