"""Formatting helpers shared by the text and Markdown renderers."""
from __future__ import annotations

import os
import re
from typing import Optional

from ..analysis.results import Diagnosis, RankResult, per_what, steps_in_window

_TEMPLATE_RE = re.compile(r"<[^<>]*>")


def short_kernel(name: str, width: int = 40) -> str:
    """'void at::native::foo<4, ...>(int, ...)' -> 'at::native::foo'."""
    s = name[5:] if name.startswith("void ") else name
    s = s.replace("(anonymous namespace)::", "")
    for _ in range(8):                       # strip nested template arguments
        t = _TEMPLATE_RE.sub("", s)
        if t == s:
            break
        s = t
    s = s.split("(", 1)[0].strip() or name
    return s if len(s) <= width else s[: width - 1] + "…"


def per(d: Diagnosis, words):
    """A header (list) or legend (str) with its per-step units said per window where the figures
    are the window's, not a step's (`analysis.results.window_is_steps`)."""
    if per_what(d.ranks) == "step":
        return words
    def say(w: str) -> str:
        return (w.replace("ms/step", "ms/window").replace("per step", "per window")
                .replace("% step: of the median step in the window", "% step: of the median step in the window, unknown ('-') where "
                         "the window is not made of ProfilerSteps (a whole trace that runs past its one step, or "
                         "no step marks)"))
    return [say(w) for w in words] if isinstance(words, list) else say(words)


def ms(seconds: Optional[float], digits: int = 1) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.{digits}f}"


def pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1f}"


def headline(d: Diagnosis) -> list[str]:
    n = len(d.ranks)
    ws = f"world size {d.world_size}" if d.world_size else "world size unknown"
    devices = sorted({r.device for r in d.ranks if r.device})
    timeline = "GPU" if any(r.timeline == "gpu" for r in d.ranks) else "host (CPU-only)"
    lines = [f"{os.path.basename(d.source.rstrip('/')) or d.source}: {n} rank trace{'s' * (n != 1)}, "
             f"{ws}, backend {d.backend or 'unknown'}",
             *([f"Timeline: {timeline}" + (f"; device: {', '.join(devices)}" if devices else "")] if n else []),
             f"Layout: {d.layout}" if d.layout else "Layout: unknown (no process-group names, sizes or config file)"]
    if d.missing_count:
        lines.append(f"Ranks without a trace here: {d.missing_count:,} of {d.world_size:,}")
    return lines


def rank_row(r: RankResult) -> list[str]:
    b = r.breakdown
    return [str(r.rank), ms(r.step_time_s), ms(b.span_s), pct(b.pct(b.compute_s)),
            pct(b.pct(b.comm_s)), pct(b.pct(b.memory_s + b.other_s)), pct(b.pct(b.idle_s)),
            pct(None if r.overlap.ratio is None else 100 * r.overlap.ratio),
            ms(r.overlap.exposed_per_step_s, 2)]


KERNEL_HEADER = ["kernel", "kind", "count", "ms", "%"]


def kernel_rows(r: RankResult) -> list[list[str]]:
    """A rank's top kernels: short name, kind, calls, total ms over the window, share of kernel time."""
    return [[short_kernel(k.name), k.kind, str(k.count), ms(k.total_s, 2), f"{100 * k.share:.1f}"]
            for k in r.top_kernels]


RANK_HEADER = ["rank", "step ms", "span ms", "comp%", "comm%", "mem%", "idle%", "ovl%", "exp ms"]
RANK_LEGEND = ("step: median ProfilerStep wall time; span: first to last activity in the window; "
               "comm: communication not hidden by compute; ovl: share of communication under compute; "
               "exp ms: exposed communication per step")


def finding_rows(d: Diagnosis) -> list[list[str]]:
    return [[f.what, ms(f.seconds_per_step, 2), "-" if f.share_of_step is None else f"{100 * f.share_of_step:.1f}"]
            for f in d.findings]


FINDING_HEADER = ["where the time goes", "ms/step", "% step"]
FINDING_LEGEND = ("ms/step: mean over ranks (a \"waiting for\" row: over the ranks that waited, what their "
                  "step would shorten by); the communication rows add up to the ranks' mean exposed "
                  "communication (exp ms per rank below); % step: of the median step in the window")
GANTT_LEGEND = ("gaps: the time of this one step with neither compute nor exposed communication on the "
                "rank's timeline; the breakdown's idle% counts only time outside every operator over the "
                "whole window, so the two differ")
AXIS_HEADER = ["axis", "comm ms/step", "exposed ms/step", "hidden %"]
OPS_HEADER = ["collective", "size", "calls", "ms/rank", "exposed", "wait", "busbw", "eff %"]
OPS_LEGEND = ("ms/rank, exposed, wait: ms per rank over the window (ms/rank: the transfers' own time; "
              "exposed also counts, on a host timeline, the calls that issued them and the waits on them, "
              "so it can exceed ms/rank); busbw: GB/s (nccl-tests bus bandwidth) "
              "from the transfer time matched across the group; * = from one rank's kernel time, "
              "which includes waiting; eff: busbw / link peak")


def axis_rows(d: Diagnosis) -> list[list[str]]:
    if not d.comm:
        return []
    steps = steps_in_window(d.ranks)
    return [[a.axis, ms(a.comm_s / steps, 2), ms(a.exposed_s / steps, 2),
             pct(None if a.hidden_ratio is None else 100 * a.hidden_ratio)] for a in d.comm.axes]


def has_bench(d: Diagnosis) -> bool:
    return bool(d.comm) and any(o.achievable_gbps for o in d.comm.ops)


def ops_legend(d: Diagnosis) -> str:
    if has_bench(d):
        return OPS_LEGEND.replace("eff: busbw / link peak",
                                  "eff: busbw / the busbw `diag bench` measured on the same axis at this size")
    return OPS_LEGEND


def op_rows(d: Diagnosis) -> list[list[str]]:
    if not d.comm:
        return []
    bench = has_bench(d)
    rows = []
    for o in d.comm.ops:
        bw = "-" if o.busbw_median_gbps is None else f"{o.busbw_median_gbps:,.2f}" + (
            "*" if o.busbw_basis != "transfer" else "")
        eff = o.bench_efficiency if bench else o.efficiency
        rows.append([f"{o.axis}:{o.op}", o.size_bucket, str(o.calls), ms(o.time_s, 2), ms(o.exposed_s, 2),
                     ms(o.wait_s, 2), bw, pct(None if eff is None else 100 * eff)])
    return rows


def straggler_line(s) -> str:
    """One straggler (analysis.results.Straggler) in words: who, why, and the evidence."""
    return f"{s.who} {s.reason}: {s.evidence}"


def straggler_lines(d: Diagnosis) -> list[str]:
    """The stragglers, or why nobody can tell who is late (nothing matched across ranks)."""
    if not d.comm:
        return []
    lines = [f"straggler: {straggler_line(s)}" for s in d.comm.stragglers]
    if d.comm.stragglers_unknown:
        lines.insert(0, f"stragglers: cannot tell ({d.comm.stragglers_unknown})")
    return lines


PIPE_HEADER = ["stage", "ranks", "bubble ms/step", "bubble %", "ideal %", "compute ms/step"]


def pipeline_rows(d: Diagnosis) -> list[list[str]]:
    p = d.pipeline
    if not p:
        return []
    ideal = pct(None if p.ideal_fraction is None else 100 * p.ideal_fraction)
    # An unmeasurable bubble says "unknown" (the caption says why), never a dash that reads as 0.
    return [[str(s.stage), _ranks(s.ranks), "unknown" if s.bubble_s is None else ms(s.bubble_s, 2),
             "unknown" if s.bubble_fraction is None else pct(100 * s.bubble_fraction), ideal, ms(s.compute_s, 2)]
            for s in p.stages]


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks)) if len(ranks) <= 4 else f"{ranks[0]},...({len(ranks)})"


ORDER_SHOWN = 24            # actions of one step shown per stage; longer orders end with "…"


def pipeline_caption(d: Diagnosis) -> str:
    p = d.pipeline
    m = "unknown" if p.m is None else str(p.m)
    parts = [f"p={p.p}, m={m}, v={p.v}, schedule {p.schedule or 'unknown'}"
             + (f" ({p.source})" if p.source else "") + f"; ideal: {p.convention}. Measured: {p.measured}."]
    orders = [f"stage {s.stage}: {' '.join(s.order[:ORDER_SHOWN])}{' …' * (len(s.order) > ORDER_SHOWN)}"
              for s in p.stages if s.order]
    if orders:
        parts.append("Order of one step: " + "; ".join(orders) + ".")
    parts += [f"Stage {s.stage}: bubble unknown ({s.unknown})." for s in p.stages if s.bubble_s is None and s.unknown]
    parts += [f"Unknown: {u}." for u in p.unknown]
    return " ".join(parts)


def throughput_lines(d: Diagnosis) -> list[str]:
    t = d.throughput
    if not t:
        return []
    parts = [f"step {ms(t.step_time_s)} ms"]
    if t.tokens_per_s_per_gpu is not None:
        parts.append(f"{t.tokens_per_s_per_gpu:,.0f} tokens/s/GPU")
    if t.model_flops_per_step is not None:
        parts.append(f"{t.model_flops_per_step / 1e12:,.3f} TFLOP/step")
    if t.mfu is not None:
        parts.append(f"MFU {100 * t.mfu:.1f}% (peak {t.peak_flops / 1e12:,.0f} TFLOP/s, {t.peak_source})")
    lines = ["Throughput: " + ", ".join(parts)]
    if t.unknown:
        lines.append("Unknown: " + "; ".join(t.unknown))
    return lines


def grouped_rank_notes(d: Diagnosis) -> list[tuple[str, str]]:
    """Per-rank notes with identical text told once, with the ranks they apply to."""
    by_text: dict[str, list[int]] = {}
    for r in d.ranks:
        for n in r.notes:
            by_text.setdefault(n, []).append(r.rank)
    return [(("rank " if len(rs) == 1 else "ranks ") + _ranks(rs), n) for n, rs in by_text.items()]
