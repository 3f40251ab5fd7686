"""Markdown report, for tickets and pull requests. Every string that comes from a trace or the
run's files goes through escape.md_text / md_code: it reads as itself, never as HTML or markup."""
from __future__ import annotations

from ..analysis.results import Diagnosis
from .advice import nothing_line, recommendation_lines
from .escape import md_code, md_text
from .memfmt import MEMORY_HEADER, memory_caption, memory_lines, memory_rows
from .frfmt import FR_TIMING_HEADER, fr_lines, fr_timing_legend, fr_timing_rows
from .fmt import (AXIS_HEADER, FINDING_HEADER, OPS_HEADER, PIPE_HEADER, RANK_HEADER, RANK_LEGEND, axis_rows,
                  finding_rows, headline, ms, op_rows, ops_legend, per, pipeline_caption, pipeline_rows,
                  rank_row, short_kernel, straggler_lines, throughput_lines)


def _table(header: list[str], rows: list[list[str]], code_first: bool = False) -> list[str]:
    """A GFM table of data cells (escaped here); code_first: the first column as code spans."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(md_code(c, table=True) if code_first and i == 0 else md_text(c)
                              for i, c in enumerate(row)) + " |" for row in rows]
    return out


def render_markdown(d: Diagnosis) -> str:
    lines = ["# diag report", ""] + [f"- {md_text(h)}" for h in headline(d)]
    lines += [f"- **problem** {md_code(p.file)}: {md_text(p.problem)}" for p in d.problems]
    lines += [f"- note: {md_text(n)}" for n in d.notes]
    if d.flight_recorder is not None:
        fr = d.flight_recorder
        lines += ["", "## Flight Recorder", ""] + [f"- {md_text(line)}" for line in fr_lines(fr)] + [""]
        lines += _table(FR_TIMING_HEADER, fr_timing_rows(fr)) + ["", f"_{md_text(fr_timing_legend(fr))}_", ""]
        if not d.ranks:
            return "\n".join(lines) + "\n"
    lines += [f"- {md_text(t)}" for t in throughput_lines(d)]
    if d.findings:
        lines += ["", "## Where the time goes, biggest loss first", ""] + _table(per(d, FINDING_HEADER), finding_rows(d))
    lines += ["", "## Temporal breakdown", ""]
    lines += _table(RANK_HEADER, [rank_row(r) for r in d.ranks])
    lines += ["", f"_{md_text(per(d, RANK_LEGEND))}_", ""]
    lines += ["Window: " + md_text("; ".join(sorted({r.breakdown.window for r in d.ranks}))), ""]
    if d.pipeline:
        lines += ["## Pipeline bubble per stage", ""] + _table(per(d, PIPE_HEADER), pipeline_rows(d))
        lines += ["", f"_{md_text(pipeline_caption(d))}_", ""]
    if d.memory is not None:
        lines += ["## Memory", ""] + [f"- {md_text(line.strip())}" for line in memory_lines(d)] + [""]
        if memory_rows(d):
            lines += _table(MEMORY_HEADER, memory_rows(d)) + ["", f"_{md_text(memory_caption(d.memory))}_", ""]
    if d.comm:
        lines += ["## Communication by parallel axis", ""] + _table(per(d, AXIS_HEADER), axis_rows(d)) + [""]
        lines += ["## Collectives by axis, op and message size", ""] + _table(OPS_HEADER, op_rows(d))
        lines += ["", f"_{md_text(ops_legend(d))}_", ""]
        lines += [f"- {md_text(line)}" for line in straggler_lines(d)]
        lines += [f"- note: {md_text(n)}" for n in d.comm.notes] + [""]
    lines += ["## Recommendations, biggest predicted gain first", ""] + recommendation_lines(
        d.recommendations, md=True, nothing=nothing_line(d))
    lines.append("")
    for r in d.ranks:
        if r.top_kernels:
            lines += [f"## Top kernels, rank {r.rank}", ""]
            lines += _table(["kernel", "kind", "count", "total ms", "share %"],
                            [[short_kernel(k.name), k.kind, str(k.count), ms(k.total_s, 2),
                              f"{100 * k.share:.1f}"] for k in r.top_kernels], code_first=True)
            lines.append("")
    return "\n".join(lines) + "\n"
