"""Terminal report: aligned tables with units, readable in 80 columns."""
from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table
from rich import box

from ..analysis.results import Diagnosis
from .fmt import RANK_HEADER, RANK_LEGEND, headline, ms, rank_row, short_kernel


def _table(title: str, header: list[str]) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              title_style="bold", padding=(0, 1), collapse_padding=True)
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
    return t


def render_text(d: Diagnosis, width: int = 80) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None, highlight=False)
    for line in headline(d):
        con.print(line)
    # Problems and notes are not wrapped, so each stays one greppable line.
    for p in d.problems:
        con.print(f"problem: {p.file}: {p.problem}", soft_wrap=True, markup=False)
    for n in d.notes:
        con.print(f"note: {n}", soft_wrap=True, markup=False)
    con.print()

    timeline = d.ranks[0].breakdown.timeline if d.ranks else "gpu"
    title = ("Temporal breakdown, GPU timeline (all streams merged)" if timeline == "gpu"
             else "Temporal breakdown, host timeline (CPU-only trace)")
    t = _table(title, RANK_HEADER)
    for r in d.ranks:
        t.add_row(*rank_row(r))
    con.print(t)
    con.print(RANK_LEGEND, style="dim")
    window = {r.breakdown.window for r in d.ranks}
    con.print("Window: " + "; ".join(sorted(window)))

    for r in d.ranks[:1] if len(d.ranks) > 1 else d.ranks:
        if not r.top_kernels:
            continue
        con.print()
        kt = _table(f"Top kernels, rank {r.rank}" + (" (others: --format json)" if len(d.ranks) > 1 else ""),
                    ["kernel", "kind", "count", "ms", "%"])
        for k in r.top_kernels:
            kt.add_row(short_kernel(k.name), k.kind, str(k.count), ms(k.total_s, 2), f"{100 * k.share:.1f}")
        con.print(kt)
    rank_notes = [(r.rank, n) for r in d.ranks for n in r.notes]
    if rank_notes:
        con.print()
        for rank, n in rank_notes[:12]:
            con.print(f"rank {rank}: {n}", style="dim")
        if len(rank_notes) > 12:
            con.print(f"... {len(rank_notes) - 12} more notes in --format json", style="dim")
    return buf.getvalue()
