"""The model's shape, read off the shapes of its matrix multiplications in one rank's trace.

A trace from another program has no diag_run.json, but with `record_shapes` its GEMM ops carry
their `Input Dims`: every layer's projections run on [tokens, in] x [in, out]. From them:
  tokens_per_micro_batch  the rows most GEMMs share: micro-batch x sequence as this rank computes
                          it (the gathered sequence under sequence parallelism, a 1/cp share
                          under context parallelism);
  hidden_size             the width nearly every one of those GEMMs has on one side (h is not
                          split by tensor parallelism; the other side is);
  ffn_hidden_size_per_rank  the MLP width on this rank (ffn / tp): the down projection's input.
                          A block has two GEMMs into h, the attention output (h -> h unless
                          TP splits it) and the MLP's down projection; the wider is the MLP's;
  ffn_hidden_size         the same times `tp`, when the caller knows tp;
  swiglu                  the MLP's up side has two GEMMs of that width (gate and up) or one of
                          twice it (fused), against one for a GeLU MLP.
Forward GEMMs are told apart from backward ones only through aten::linear (input, weight
[out, in]); traces whose layers run plain aten::matmul/mm (Megatron-LM without Transformer
Engine) give tokens and hidden size only. Whatever the shapes leave ambiguous is left out of
the result: unknown, never a guess. Ops fused away by torch.compile or Transformer Engine
leave no aten shapes at all.

The attention kind (`attention_kind`), for the memory model: "fused" when the trace runs an
attention that keeps no s x s scores for backward (flash, memory-efficient or cuDNN SDPA,
flash-attn, Transformer Engine's fused attention), "eager" when it materialises them (SDPA's math
path, Megatron's unfused softmax), None when its op names say neither.
"""
from __future__ import annotations

import re
from collections import Counter
from math import prod
from typing import Iterable, Mapping, Optional, Union

MIN_TOKEN_SHARE = 0.5     # of the GEMMs (by count) that must share the token rows
MIN_HIDDEN_SHARE = 0.75   # of those that must have h on one side: a transformer, not a mix of MLPs
MIN_SHAPES = 2            # distinct GEMMs behind a value: a block has several, a toy model one

# ops and kernels of attention that keeps only its output and log-sum-exp (no s x s scores), in
# lower case: attention_kind searches the names lowered (~5x faster than re.IGNORECASE on them)
FUSED_ATTENTION_RE = re.compile(r"flash|_efficient_attention|_scaled_dot_product_(efficient|cudnn|fused)_attention|"
                                r"fmha|fusedattn|cudnn_attention")
# ... and of attention that keeps the scores: SDPA's math fallback, Megatron-LM's unfused core
EAGER_ATTENTION_RE = re.compile(r"_scaled_dot_product_attention_math|scaled_(upper_triang_)?masked_softmax|"
                                r"scaleduppertriangmaskedsoftmax|scaledmaskedsoftmax")

Gemm = tuple[int, int, int]          # (tokens m, in k, out n)
GemmsIn = Union[Iterable[tuple[str, tuple]], Mapping[tuple[str, tuple], int]]


def infer_shape(gemms: GemmsIn, tp: Optional[int] = None) -> dict:
    """Model shape from one rank's GEMMs: (op name, input dims) pairs, or a mapping of them
    to counts (RankTrace.gemms). Keys are present only when the shapes settle them."""
    counts = Counter(dict(gemms)) if isinstance(gemms, Mapping) else Counter((n, _freeze(d)) for n, d in gemms)
    oriented, by_shape = _gemms(counts)
    tokens = _mode(by_shape, lambda g: g[0], MIN_TOKEN_SHARE)
    if tokens is None:
        return {}
    rows = Counter({g: c for g, c in by_shape.items() if g[0] == tokens})
    hidden = _mode(rows, lambda g: {g[1], g[2]}, MIN_HIDDEN_SHARE)
    out = {"tokens_per_micro_batch": tokens}
    if hidden is None:
        return out
    out["hidden_size"] = hidden
    if oriented:
        out.update(_mlp(rows, hidden, tp))
    return out


def _freeze(dims) -> tuple:
    return tuple(tuple(d) if isinstance(d, (list, tuple)) else () for d in dims or ())


def _gemms(counts: Counter) -> tuple[bool, Counter]:
    """(whether in and out are known, (m, k, n) -> count). aten::linear when the trace has it:
    its children (addmm, matmul, mm) are the same GEMMs again, and backward never calls it.
    Else addmm and the outermost of matmul/mm, forward and backward mixed."""
    if any(name == "aten::linear" for name, _ in counts):
        parse = {"aten::linear": _linear}
    else:
        top = "aten::matmul" if any(name == "aten::matmul" for name, _ in counts) else "aten::mm"
        parse = {"aten::addmm": _addmm, top: _matmul}
    out = Counter()
    for (name, dims), c in counts.items():
        g = parse[name](dims) if name in parse else None
        if g:
            out[g] += c
    return "aten::linear" in parse, out


def _linear(dims) -> Optional[Gemm]:
    """linear(x [..., in], weight [out, in], bias)."""
    if len(dims) < 2 or len(dims[0]) < 2 or len(dims[1]) != 2 or dims[1][1] != dims[0][-1]:
        return None
    return prod(dims[0][:-1]), dims[0][-1], dims[1][0]


def _addmm(dims) -> Optional[Gemm]:
    """addmm(bias, a [m, k], b [k, n])."""
    if len(dims) < 3 or len(dims[1]) != 2 or len(dims[2]) != 2 or dims[1][1] != dims[2][0]:
        return None
    return dims[1][0], dims[1][1], dims[2][1]


def _matmul(dims) -> Optional[Gemm]:
    """mm / matmul(a [..., k], b [k, n]) with a 2-D right side (a weight, or a gradient)."""
    if len(dims) < 2 or len(dims[0]) < 2 or len(dims[1]) != 2 or dims[0][-1] != dims[1][0]:
        return None
    return prod(dims[0][:-1]), dims[0][-1], dims[1][1]


def _mode(gemms: Counter, key, min_share: float) -> Optional[int]:
    """The value `key` gives most GEMMs (by count), if it is unique, covers min_share of them
    and comes from MIN_SHAPES distinct GEMMs. key returns one value or a set of them per GEMM."""
    votes, shapes, total = Counter(), Counter(), sum(gemms.values())
    for g, c in gemms.items():
        k = key(g)
        for v in (k if isinstance(k, set) else {k}):
            votes[v] += c
            shapes[v] += 1
    ranked = votes.most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[1][1] == ranked[0][1]) or ranked[0][1] < min_share * total:
        return None
    return ranked[0][0] if shapes[ranked[0][0]] >= MIN_SHAPES else None


def _mlp(rows: Counter, h: int, tp: Optional[int]) -> dict:
    """MLP width (per rank, and whole with tp) and SwiGLU, from the GEMMs into and out of h."""
    into, out_of = Counter(), Counter()
    square = sum(c for (_, k, n), c in rows.items() if k == n == h)
    for (_, k, n), c in rows.items():
        if n == h and k != h:
            into[k] += c
        elif k == h and n != h:
            out_of[n] += c
    f = _down_width(into, square)
    if f is None:
        return {}
    res = {"ffn_hidden_size_per_rank": f}
    if tp:
        res["ffn_hidden_size"] = f * tp
    swiglu = _gated(out_of, f, into[f])
    if swiglu is not None:
        res["swiglu"] = swiglu
    return res


def _down_width(into: Counter, square: int) -> Optional[int]:
    """The MLP's down projection among the GEMMs into h: one per layer, as many as the
    attention output's. With TP the attention output comes in narrower than h (two widths
    into h, equally often: the MLP's is the wider); without, it is square (h -> h)."""
    widths = sorted(into)
    if len(widths) == 2 and into[widths[0]] == into[widths[1]]:
        return widths[1]
    if len(widths) == 1 and square >= into[widths[0]]:
        return widths[0]
    return None                        # one width and no attention output: MoE, or not a GPT


def _gated(out_of: Counter, f: int, per_layer: int) -> Optional[bool]:
    """SwiGLU when the up side has two GEMMs of width f per down projection (gate, up) or one
    of 2f (fused); GeLU when one of f and none of 2f; else unknown."""
    if out_of[f] == 2 * per_layer or (out_of[2 * f] == per_layer and not out_of[f]):
        return True
    if out_of[f] == per_layer and not out_of[2 * f]:
        return False
    return None


def attention_kind(names: Iterable[str]) -> Optional[str]:
    """"fused", "eager" or None (the names say neither) from one rank's op and kernel names. Both
    kinds in one trace is "eager": some layers keep the scores. Megatron's unfused core without
    its fused softmax shows only as baddbmm + softmax, taken as eager when nothing is fused."""
    names = {n for n in names if ".py(" not in n}         # ops and kernels, not Python stack frames
    text = "\n".join(names).lower()                       # one search; no pattern spans a line
    fused = FUSED_ATTENTION_RE.search(text) is not None
    if EAGER_ATTENTION_RE.search(text) or (not fused and {"aten::baddbmm", "aten::_softmax"} <= names):
        return "eager"
    return "fused" if fused else None
