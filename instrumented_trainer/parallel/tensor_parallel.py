"""Megatron-style tensor-parallel layers: column/row-parallel linear, vocab-parallel embedding
and cross-entropy.

The communication pattern is Megatron-LM's (Shoeybi et al. 2019, "f" and "g" operators):
a column-parallel layer takes a replicated input and produces a sharded output, so its input
gradient must be summed across TP ranks in backward (`copy_to_tp`); a row-parallel layer takes a
sharded input and produces partial sums that are all-reduced in forward (`reduce_from_tp`).

Parameters are initialised identically in every layout: each rank draws the *full* weight from a
generator seeded by (seed, parameter name) and keeps its slice, so a 1x1x1 run and a TPxPPxDP run
start from exactly the same model.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from diag.layout import Axis


def full_init(name: str, shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    """The full, unsharded N(0, std) weight of parameter `name`, the same on every rank."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def shard(full: torch.Tensor, dim: int, rank: int, size: int, partitions: int = 1) -> torch.Tensor:
    """This rank's slice of `full` along `dim`; with `partitions` > 1 each of the equal
    partitions (e.g. Q, K and V of a fused QKV weight) is sliced separately, so a rank keeps
    whole attention heads of all three."""
    parts = full.chunk(partitions, dim=dim)
    return torch.cat([p.chunk(size, dim=dim)[rank] for p in parts], dim=dim).contiguous()


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient across TP ranks in backward."""

    @staticmethod
    def forward(ctx, x, groups):
        ctx.groups = groups
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        ctx.groups.all_reduce(grad, Axis.TP)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce of partial sums across TP ranks in forward; identity in backward."""

    @staticmethod
    def forward(ctx, x, groups):
        x = x.contiguous().clone()
        groups.all_reduce(x, Axis.TP)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x, groups):
    return x if groups.size(Axis.TP) == 1 else _CopyToTP.apply(x, groups)


def reduce_from_tp(x, groups):
    return x if groups.size(Axis.TP) == 1 else _ReduceFromTP.apply(x, groups)


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A split by output rows: replicated input, TP-sharded output."""

    def __init__(self, in_f, out_f, groups, *, name, seed, std, bias=True, partitions=1):
        super().__init__()
        self.groups = groups
        tp, r = groups.size(Axis.TP), groups.local_rank(Axis.TP)
        self.weight = nn.Parameter(shard(full_init(name + ".weight", (out_f, in_f), seed, std),
                                         0, r, tp, partitions))
        self.bias = (nn.Parameter(shard(torch.zeros(out_f), 0, r, tp, partitions))
                     if bias else None)

    def forward(self, x):
        return F.linear(copy_to_tp(x, self.groups), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A split by input columns: sharded input, all-reduced output."""

    def __init__(self, in_f, out_f, groups, *, name, seed, std):
        super().__init__()
        self.groups = groups
        tp, r = groups.size(Axis.TP), groups.local_rank(Axis.TP)
        self.weight = nn.Parameter(shard(full_init(name + ".weight", (out_f, in_f), seed, std),
                                         1, r, tp))
        self.bias = nn.Parameter(torch.zeros(out_f))  # replicated, added after the reduction

    def forward(self, x):
        return reduce_from_tp(F.linear(x, self.weight), self.groups) + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows; each rank looks up the ids it owns."""

    def __init__(self, vocab, hidden, groups, *, name, seed, std):
        super().__init__()
        self.groups = groups
        tp, r = groups.size(Axis.TP), groups.local_rank(Axis.TP)
        self.start, self.end = r * vocab // tp, (r + 1) * vocab // tp
        self.weight = nn.Parameter(shard(full_init(name + ".weight", (vocab, hidden), seed, std),
                                         0, r, tp))

    def forward(self, ids):
        outside = (ids < self.start) | (ids >= self.end)
        local = torch.where(outside, torch.zeros_like(ids), ids - self.start)
        out = F.embedding(local, self.weight) * (~outside).unsqueeze(-1).to(self.weight.dtype)
        return reduce_from_tp(out, self.groups)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits sharded by vocabulary, without gathering them (Megatron)."""

    @staticmethod
    def forward(ctx, logits, target, start, groups):
        ctx.in_dtype = logits.dtype
        logits = logits.float()
        logits_max = logits.max(dim=-1).values
        groups.all_reduce(logits_max, Axis.TP, op="max")
        logits = logits - logits_max.unsqueeze(-1)
        outside = (target < start) | (target >= start + logits.shape[-1])
        local = torch.where(outside, torch.zeros_like(target), target - start)
        predicted = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1) * (~outside)
        groups.all_reduce(predicted, Axis.TP)
        exp = logits.exp()
        sum_exp = exp.sum(dim=-1)
        groups.all_reduce(sum_exp, Axis.TP)
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local, outside)
        return torch.log(sum_exp) - predicted

    @staticmethod
    def backward(ctx, grad):
        softmax, local, outside = ctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, local.unsqueeze(-1), -(~outside).to(g.dtype).unsqueeze(-1))
        return (g * grad.unsqueeze(-1)).to(ctx.in_dtype), None, None, None


def vocab_parallel_cross_entropy(logits, target, start, groups):
    """Per-token loss; `logits` are this rank's vocabulary columns starting at id `start`."""
    return _VocabParallelCrossEntropy.apply(logits, target, start, groups)


def scaled_std(base: float, num_layers: int) -> float:
    """Megatron's init for output projections feeding the residual stream."""
    return base / math.sqrt(2.0 * num_layers)
