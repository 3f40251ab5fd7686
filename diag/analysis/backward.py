"""The backward pass's compute, and the part of it a zero-bubble schedule can defer.

Problem: the zero-bubble schedules (Qi et al. 2023; torch.distributed.pipelining's ZB1P, ZBV)
split each backward into its input gradients ("I", on the critical path) and its weight
gradients ("W", run later to fill the bubble). What they gain depends on W's share of the
backward, which is not a half: a linear layer's backward is two GEMMs of the same FLOPs (dX and
dW), but attention's core, the norms and the activations have input gradients only.

Read per rank, on the window's steps: the compute inside autograd nodes
(`autograd::engine::evaluate_function: <Node>`: on a host timeline the compute intervals under
those spans, on a GPU the compute kernels launched from inside one), of it the compute inside
the nodes of layers with a weight (WEIGHT_GEMM_NODES: linears, convolutions) and inside the nodes
that compute weight gradients only (WEIGHT_ONLY_NODES: embeddings, gradient accumulation). W's
share is half the first plus the second, over the whole.
A trace without autograd nodes (no host operators recorded) gives None: the share is unknown.
"""
from __future__ import annotations

import re
from typing import Optional

import numpy as np

from ..trace.kinds import Kind
from ..trace.table import RankTrace
from . import intervals as iv
from .hostlink import enclosing, launches
from .results import BackwardSplit
from .steps import Window

BACKWARD = "autograd::engine::evaluate_function"
# autograd nodes of layers with a weight, whose backward is an input- and a weight-gradient GEMM (or
# convolution) of the same FLOPs: torch's own (nn.Linear: addmm with a bias, mm without; convolutions),
# Megatron-LM's tensor-parallel linears (LinearWithGradAccumulationAndAsyncCommunication), Transformer
# Engine's fused modules (_Linear, _LayerNormLinear, _LayerNormMLP)
WEIGHT_GEMM_NODES = re.compile(BACKWARD + r": (AddmmBackward0|MmBackward0|\w*Linear\w*Backward\w*|"
                               r"_LayerNormMLPBackward|\w*Convolution\w*Backward\w*)$")
# nodes that compute weight gradients only: embeddings' (no input gradient) and the accumulation of
# each parameter's gradient into .grad (which the weight pass does under a zero-bubble schedule)
WEIGHT_ONLY_NODES = re.compile(BACKWARD + r": (EmbeddingBackward0|EmbeddingBagBackward0|"
                               r"torch::autograd::AccumulateGrad)$")


def _spans(t, keep) -> iv.Intervals:
    rows = np.flatnonzero(t.name_mask(keep) & t.mask(Kind.CPU_OP, Kind.ANNOTATION))
    return iv.merge(t.ts_ns[rows], t.end_ns[rows])


def _compute_launches(t, w: Window) -> tuple:
    """The window's compute kernels and their launches' (time, thread), made once per window: a
    rank's pass asks for them five times (the backward, its two parts, the Gantt's backward and
    optimizer), ~0.5 ms each on a 240k-event trace."""
    got = w.__dict__.get("_compute_launches")
    if got is None:
        rows = w.rows[t.kind[w.rows] == Kind.COMPUTE]
        got = w.__dict__["_compute_launches"] = (rows, *launches(t, rows))
    return got


def backward_compute(rt: RankTrace, w: Window, timeline: str, compute: iv.Intervals,
                     keep=lambda s: s.startswith(BACKWARD)) -> iv.Intervals:
    """The compute of the autograd nodes `keep` selects (by name): on a host timeline `compute`
    under their spans, on a GPU the window's compute kernels launched from inside one."""
    t = rt.events
    if timeline == "host":
        return iv.intersect(compute, _spans(t, keep))
    rows, lts, lth = _compute_launches(t, w)
    inside = rows[enclosing(t, lts, lth, keep) >= 0]
    return iv.merge(t.ts_ns[inside], t.end_ns[inside])


def backward_split(rt: RankTrace, w: Window, timeline: str, compute: iv.Intervals) -> Optional[BackwardSplit]:
    """The backward's compute, and of it the weighted layers' and the weight-only nodes', per window
    step; None without any."""
    steps = len(set(w.step_index[w.step_index >= 0].tolist())) or 1
    every = backward_compute(rt, w, timeline, compute)
    if iv.length(every) == 0:
        return None

    def part(nodes: re.Pattern) -> float:
        return iv.length(iv.intersect(every, backward_compute(rt, w, timeline, compute, nodes.match))) * 1e-9 / steps

    return BackwardSplit(backward_s=iv.length(every) * 1e-9 / steps, weight_gemm_s=part(WEIGHT_GEMM_NODES),
                         weight_only_s=part(WEIGHT_ONLY_NODES))
