"""Rendering of recommendations, comparisons and tune results: text, Markdown and JSON.

Only presentation: the numbers come from diag.advise. Each recommendation is shown with its
evidence (metric, value, threshold), the flags, the exact re-run command and the predicted
step time and tokens/s before and after, so it can be traced to the report's own numbers.
Strings from the run (its command, titles naming its ranks and files) are data: escaped for
Markdown (escape.md_text / md_code) and for the terminal (escape.terminal).
"""
from __future__ import annotations

import dataclasses

import msgspec

from ..advise.memory import human
from ..advise.results import amount
from .escape import md_code, md_text, terminal
from .fmt import ms

ADVICE_FORMATS = ("text", "markdown", "json")


def _tokens(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def rec_lines(i: int, r, md: bool = False) -> list[str]:
    """One recommendation as lines (Markdown when md)."""
    gain = r.gain
    text, code = (md_text, md_code) if md else (str, str)
    head = f"{i}. {text(r.title)}"
    pred = (f"predicted step {ms(r.step_s_before)} -> {ms(r.step_s_after)} ms"
            + (f" ({-100 * gain:+.1f}%)" if gain is not None else "")
            + (f", tokens/s {_tokens(r.tokens_per_s_before)} -> {_tokens(r.tokens_per_s_after)}"
               if r.tokens_per_s_before is not None or r.tokens_per_s_after is not None else "")
            + f"; confidence {r.confidence}")
    lines = [f"**{head}**" if md else head, f"   {pred}"] + _memory_lines(r)
    for e in r.evidence:
        lines.append(f"   evidence: {text(e.metric)} = {amount(e.value, e.unit)} (threshold {amount(e.threshold, e.unit)})"
                     + (f" {text(f'[{e.source}]')}" if e.source else ""))
    if r.flags:
        lines.append(f"   flags: {code(r.flag_words)}" + ("" if r.runnable else "  (Megatron-LM; not in the instrumented trainer)"))
    if r.command:
        lines.append(f"   re-run: {code(r.command)}")
    if r.why:
        lines.append(f"   why: {text(r.why)}")
    lines += [f"   check: {text(c)}" for c in r.checks]
    lines += [f"   assumes: {text(a)}" for a in r.assumptions]
    return [("- " + x.strip()) if md and x.startswith("   ") else x for x in lines]


def _memory_lines(r) -> list[str]:
    """Modelled peak memory per rank before and after, next to the device's capacity."""
    if r.memory_after_bytes is None:
        return []
    cap = r.memory_capacity_bytes
    fits = (f" of {human(cap)}: fits" if r.memory_after_bytes <= cap else f": over the {human(cap)} device") if cap \
        else " (device memory unknown: --memory-per-gpu)"
    return [f"   peak memory per rank {human(r.memory_before_bytes)} -> {human(r.memory_after_bytes)}{fits}"] + \
        [f"   memory: {m}" for m in r.memory]


def nothing_line(d) -> str:
    """Where the recommender failed (advise.recommend.with_advice: a basis with no calibration, only
    why), its words, so the report does not read "nothing worth changing"; else "" (the default)."""
    b = d.advice_basis
    return (b.nothing or "") if b is not None and not b.calibration else ""


def recommendation_lines(recs: list, md: bool = False, nothing: str = "") -> list[str]:
    if not recs:
        return [nothing or "Nothing worth changing: no measured loss crossed a rule's threshold."]
    out = []
    for i, r in enumerate(recs, 1):
        out += rec_lines(i, r, md) + [""]
    return out


def render_advice(advice, fmt: str) -> str:
    if fmt == "json":
        return msgspec.json.format(msgspec.json.encode(advice), indent=2).decode() + "\n"
    md = fmt == "markdown"
    lines = (["# Recommendations", ""] if md else ["Recommendations, biggest predicted gain first", ""])
    lines += recommendation_lines(advice.recommendations, md, advice.nothing or "")
    lines += ["## Model calibration" if md else "Model calibration (what the predictions start from)", ""]
    lines += [("- " + md_text(n)) if md else ("  " + n) for n in advice.calibration]
    return terminal("\n".join(lines).rstrip() + "\n")


def _fmt(x, unit: str) -> str:
    if x is None:
        return "-"
    return f"{x:,.1f}" if unit != "GB/s" else f"{x:,.3g}"


def comparison_rows(c) -> list[list[str]]:
    rows = []
    for r in c.rows:
        ch = r.change
        mark = "" if ch is None or abs(ch) < 0.02 else (" better" if (ch < 0) == (r.better == "lower") else " worse")
        rows.append([r.metric, r.unit, _fmt(r.a, r.unit), _fmt(r.b, r.unit),
                     "-" if ch is None else f"{100 * ch:+.1f}%{mark}"])
    return rows


def render_comparison(c, fmt: str) -> str:
    if fmt == "json":
        return msgspec.json.format(msgspec.json.encode(dataclasses.asdict(c)), indent=2).decode() + "\n"
    header = ["metric", "unit", "A", "B", "B vs A"]
    rows = comparison_rows(c)
    cfg = [[str(k), str(a), str(b)] for k, a, b in c.config]
    if fmt == "markdown":
        cells = lambda r: "| " + " | ".join(map(md_text, r)) + " |"      # noqa: E731
        t = ["| " + " | ".join(header) + " |", "|---|---|---:|---:|---:|"] + [cells(r) for r in rows]
        out = ["# diag compare", "", f"- A: {md_code(c.a)}", f"- B: {md_code(c.b)}", ""] + t
        if cfg:
            out += ["", "| setting | A | B |", "|---|---:|---:|"] + [cells(r) for r in cfg]
        return "\n".join(out + [f"- note: {md_text(n)}" for n in c.notes]) + "\n"
    w = [max(len(x[i]) for x in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(v.ljust(w[i]) if i < 2 else v.rjust(w[i]) for i, v in enumerate(r)).rstrip()
    out = [f"A: {c.a}", f"B: {c.b}", "", line(header), "-" * len(line(header))] + [line(r) for r in rows]
    if cfg:
        out += ["", "Configuration that differs:"] + [f"  {k}: {a} -> {b}" for k, a, b in cfg]
    return terminal("\n".join(out + [f"note: {n}" for n in c.notes]) + "\n")


def change_parts(values: list, sep: str = ", ") -> str:
    """The parts of a median change (tune's per run or per pair) in points: '-16.4, -15.8, n/a'."""
    return sep.join("n/a" if v is None else f"{100 * v:+.1f}" for v in values)


def _each(values: list, what: str) -> str:
    """' (median of 2, per before run: -16.4, -15.8, n/a)' where there is more than one value."""
    if len(values) < 2:
        return ""
    return f" (median of {sum(v is not None for v in values)}, per {what}: {change_parts(values)})"


def interval_words(iv) -> str:
    """'; 78% interval -16.1..-9.4%': the measured change's interval over the pairs (tune.median_interval)."""
    return "" if iv is None else f"; {100 * iv[2]:.0f}% interval {100 * iv[0]:+.1f}..{100 * iv[1]:+.1f}%"


def render_tune(res) -> str:
    b, a, r = res.before, res.after, res.applied
    out = [f"before: {b.out}: median step {ms(b.trace_step_s)} ms profiled, {ms(b.step_s)} ms over {b.steps} "
           f"unprofiled steps ({b.runs} runs)"]
    if r is None:
        return "\n".join(out + [res.message]) + "\n"
    out += [f"applied: {r.title} [{r.rule}]", f"  {r.flag_words}",
            f"after:  {a.out}: median step {ms(a.trace_step_s)} ms profiled, {ms(a.step_s)} ms over {a.steps} "
            f"unprofiled steps ({a.runs} runs)",
            f"predicted change {100 * res.predicted_change:+.1f}%{_each(res.predicted_changes, 'before run')}; "
            f"measured {100 * res.measured_change:+.1f}%{_each(res.measured_changes, 'pair of runs')} "
            f"(unprofiled steps{interval_words(res.measured_interval)}), "
            + (f"{100 * res.trace_change:+.1f}%" if res.trace_change is not None else "-")
            + " on the profiled steps"
            + (f"; prediction off by {100 * res.error:.0f}% of the measured change" if res.error is not None else "")
            + _unsettled(res)]
    return "\n".join(out) + "\n"


def _unsettled(res) -> str:
    """Said where the pairs leave the measured change loose (TuneResult.settled): the error above
    is then not yet readable, and whether the prediction lies inside the measured interval."""
    if res.settled or not res.measured_changes:
        return ""
    from ..advise.tune import SETTLE, SETTLE_SHARE  # noqa: PLC0415 - tune's imports stay out of every command's start
    iv, p = res.measured_interval, res.predicted_change
    inside = iv is not None and p is not None and iv[0] <= p <= iv[1]
    n = len(res.measured_changes)
    more = {"max_minutes": "a longer --max-minutes adds pairs until it is",
            "max_repeats": "a larger --max-repeats adds pairs until it is"}.get(res.stopped,
                                                                             "--max-repeats N adds pairs until it is")
    return (f"; not settled over {n} pair{'s' * (n > 1)} (that takes 3 pairs or more and an interval "
            f"{100 * SETTLE:.0f} points wide or less, within {100 * SETTLE_SHARE:.0f}% of the median either side"
            f"{'; the prediction lies inside this one' if inside else ''}): {more}")
