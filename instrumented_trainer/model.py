"""A GPT (pre-LayerNorm decoder) split into one pipeline stage per rank, with TP-sharded layers.

Stage `pp_rank` holds layers [pp_rank * L/p, (pp_rank + 1) * L/p); the first stage also holds the
vocab-parallel token embedding and the position embedding, the last stage the final LayerNorm,
the vocab-parallel output layer (untied from the embedding, so no embedding-gradient all-reduce
between first and last stage is needed) and the loss. Parameter names are global
(`layers.<i>....`), so the seeded initialisation gives every layout the same weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from diag.layout import Axis
from instrumented_trainer.config import ModelConfig
from instrumented_trainer.parallel.tensor_parallel import (
    ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, full_init, scaled_std,
    vocab_parallel_cross_entropy)

INIT_STD = 0.02


class Block(nn.Module):
    """One transformer layer: TP attention (heads split across ranks) and TP MLP."""

    def __init__(self, cfg: ModelConfig, groups, index: int, seed: int) -> None:
        super().__init__()
        h, tp = cfg.hidden_size, groups.size(Axis.TP)
        name = f"layers.{index}"
        out_std = scaled_std(INIT_STD, cfg.num_layers)
        self.local_heads = cfg.num_attention_heads // tp
        self.head_dim = h // cfg.num_attention_heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = ColumnParallelLinear(h, 3 * h, groups, name=f"{name}.qkv", seed=seed,
                                        std=INIT_STD, partitions=3)
        self.proj = RowParallelLinear(h, h, groups, name=f"{name}.proj", seed=seed, std=out_std)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = ColumnParallelLinear(h, cfg.ffn_hidden_size, groups, name=f"{name}.fc1",
                                        seed=seed, std=INIT_STD)
        self.fc2 = RowParallelLinear(cfg.ffn_hidden_size, h, groups, name=f"{name}.fc2",
                                     seed=seed, std=out_std)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.local_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each [b, local_heads, s, head_dim]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPTStage(nn.Module):
    """The part of the GPT that lives on this rank's pipeline stage."""

    def __init__(self, cfg: ModelConfig, groups, seed: int) -> None:
        super().__init__()
        self.cfg, self.groups = cfg, groups
        self.first, self.last = groups.is_first_stage, groups.is_last_stage
        per_stage = cfg.num_layers // groups.size(Axis.PP)
        first_layer = groups.local_rank(Axis.PP) * per_stage
        if self.first:
            self.embedding = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, groups,
                                                    name="embedding", seed=seed, std=INIT_STD)
            self.position = nn.Parameter(full_init("position", (cfg.seq_length, cfg.hidden_size),
                                                   seed, INIT_STD))
        self.layers = nn.ModuleList(Block(cfg, groups, first_layer + i, seed)
                                    for i in range(per_stage))
        if self.last:
            self.final_ln = nn.LayerNorm(cfg.hidden_size)
            self.head = ColumnParallelLinear(cfg.hidden_size, cfg.vocab_size, groups,
                                             name="head", seed=seed, std=INIT_STD, bias=False)
            tp_rank, tp = groups.local_rank(Axis.TP), groups.size(Axis.TP)
            self.vocab_start = tp_rank * cfg.vocab_size // tp

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (first stage) or activations in; activations or the mean loss out."""
        x = self.embedding(inputs) + self.position if self.first else inputs
        for layer in self.layers:
            x = layer(x)
        if not self.last:
            return x
        logits = self.head(self.final_ln(x))
        losses = vocab_parallel_cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                              self.vocab_start, self.groups)
        return losses.mean()
