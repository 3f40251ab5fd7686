"""Terminal report: aligned tables with units, readable in 80 columns, biggest loss first.

Trace text is data (escape.py): the console interprets no rich markup or emoji codes anywhere
(a `[/bold]` in a kernel name is printed as it is), and control characters in the finished
report are made visible, so a name cannot drive the terminal."""
from __future__ import annotations

import io
import textwrap

from rich import box
from rich.console import Console
from rich.table import Table

from ..analysis.results import Diagnosis
from .advice import nothing_line, recommendation_lines
from .escape import terminal
from .memfmt import MEMORY_HEADER, memory_caption, memory_lines, memory_rows
from .frfmt import FR_TIMING_HEADER, fr_lines, fr_timing_legend, fr_timing_rows
from .fmt import (AXIS_HEADER, FINDING_HEADER, FINDING_LEGEND, KERNEL_HEADER, OPS_HEADER, PIPE_HEADER,
                  RANK_HEADER, RANK_LEGEND, axis_rows, finding_rows, grouped_rank_notes, headline,
                  kernel_rows, op_rows, ops_legend, per, pipeline_caption, pipeline_rows, rank_row,
                  straggler_lines, throughput_lines)


def _table(title: str, header: list[str]) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              title_style="bold", padding=(0, 1), collapse_padding=True,
              min_width=len(title))     # a narrow table does not wrap its title
    for i, h in enumerate(header):      # at the width, the names wrap, never a number is cut
        t.add_column(h, justify="left" if i == 0 else "right", no_wrap=i > 0, overflow="fold" if i == 0 else "ellipsis")
    return t


def _print_table(con: Console, title: str, header: list[str], rows: list[list[str]], legend: str = "") -> None:
    if not rows:
        return
    t = _table(title, header)
    for r in rows:
        t.add_row(*r)
    con.print(t)
    if legend:
        con.print(legend, style="dim")
    con.print()


def _print_flight_recorder(con: Console, fr) -> None:
    for line in fr_lines(fr):
        con.print(line, soft_wrap=True, markup=False)
    con.print()
    _print_table(con, "Collectives over the Flight Recorder buffer, by axis and op", FR_TIMING_HEADER,
                 fr_timing_rows(fr), fr_timing_legend(fr))


def render_text(d: Diagnosis, width: int = 80) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None, highlight=False,
                  markup=False, emoji=False)
    for line in headline(d):
        con.print(line)
    # Problems and notes are not wrapped, so each stays one greppable line.
    for p in d.problems:
        con.print(f"problem: {p.file}: {p.problem}", soft_wrap=True, markup=False)
    for n in d.notes:
        con.print(f"note: {n}", soft_wrap=True, markup=False)
    if d.flight_recorder is not None:      # a hang is the first thing to know
        _print_flight_recorder(con, d.flight_recorder)
        if not d.ranks:
            return buf.getvalue()
    for line in throughput_lines(d):
        con.print(line, markup=False)
    con.print()
    _print_table(con, "Where the time goes, biggest loss first", per(d, FINDING_HEADER), finding_rows(d),
                 per(d, FINDING_LEGEND))
    timeline = d.ranks[0].breakdown.timeline if d.ranks else "gpu"
    title = ("Temporal breakdown, GPU timeline (all streams merged)" if timeline == "gpu"
             else "Temporal breakdown, host timeline (CPU-only trace)")
    _print_table(con, title, RANK_HEADER, [rank_row(r) for r in d.ranks],
                 per(d, RANK_LEGEND) + "\nWindow: " + "; ".join(sorted({r.breakdown.window for r in d.ranks})))
    if d.pipeline:
        _print_table(con, "Pipeline bubble per stage", per(d, PIPE_HEADER), pipeline_rows(d), pipeline_caption(d))
    if d.memory is not None:
        _print_table(con, "Measured peak memory", MEMORY_HEADER, memory_rows(d), memory_caption(d.memory))
        for line in memory_lines(d):
            con.print(line, markup=False)
        con.print()
    if d.comm:
        _print_table(con, "Communication by parallel axis", per(d, AXIS_HEADER), axis_rows(d))
        _print_table(con, "Collectives by axis, op and message size", OPS_HEADER, op_rows(d), ops_legend(d))
        told = straggler_lines(d)
        for line in told:
            con.print(line, markup=False)
        for n in d.comm.notes:
            con.print(f"note: {n}", style="dim", markup=False)
        if told or d.comm.notes:
            con.print()
    for r in d.ranks[:1]:
        title = f"Top kernels, rank {r.rank}" + (" (others: --format json)" if len(d.ranks) > 1 else "")
        _print_table(con, title, KERNEL_HEADER, kernel_rows(r))
    con.print("Recommendations, biggest predicted gain first", style="bold")
    for line in recommendation_lines(d.recommendations, nothing=nothing_line(d)):
        # wrapped at the console width under its own label; `diag recommend` prints commands unwrapped
        indent = " " * (len(line) - len(line.lstrip()) + (line.lstrip().find(": ") + 2 if ": " in line else 3))
        for part in textwrap.wrap(line, width=width, subsequent_indent=indent[:24], break_on_hyphens=False,
                                  break_long_words=True) or [""]:
            con.print(part, markup=False, soft_wrap=True)
    grouped = grouped_rank_notes(d)
    for ranks, n in grouped[:8]:
        con.print(f"{ranks}: {n}", style="dim", markup=False)
    if len(grouped) > 8:
        con.print(f"... {len(grouped) - 8} more notes in --format json", style="dim")
    return terminal(buf.getvalue())
