"""Synthetic, deterministic training data that every layout splits the same way.

The global batch of step `s` depends only on (seed, s), never on the layout, so a 1x1x1 run and a
TPxPPxDP run see exactly the same tokens; DP replica d takes the contiguous rows
[d * B/dp, (d + 1) * B/dp), which the pipeline schedule cuts into micro-batches, as Megatron-LM
does. The sequences
are arithmetic progressions modulo the vocabulary with 10% noise, so there is something to learn
and the loss goes down.
"""

from __future__ import annotations

import torch


def global_batch(step: int, batch: int, seq_length: int, vocab: int, seed: int) -> torch.Tensor:
    """Token ids [batch, seq_length + 1] of step `step`."""
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, 8, (batch, 1), generator=gen)
    tokens = (start + stride * torch.arange(seq_length + 1)) % vocab
    noise = torch.randint(0, vocab, tokens.shape, generator=gen)
    keep = torch.rand(tokens.shape, generator=gen) >= 0.1
    return torch.where(keep, tokens, noise)


def replica_batch(tokens: torch.Tensor, dp_rank: int, dp: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This DP replica's share of a global batch: (inputs, next-token labels)."""
    per_replica = tokens.shape[0] // dp
    mine = tokens[dp_rank * per_replica:(dp_rank + 1) * per_replica].to(device)
    return mine[:, :-1].contiguous(), mine[:, 1:].contiguous()
