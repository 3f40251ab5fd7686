"""A GPT (pre-LayerNorm decoder, Megatron-LM's shape) built one pipeline stage at a time.

A stage holds a range of the model's layers; the first stage also holds the token and position
embeddings, the last the final LayerNorm and the output layer (untied from the embedding, so no
embedding-gradient all-reduce between first and last stage is needed). The stage returns logits
on the last stage, else the hidden states; the loss is the pipeline schedule's `loss_fn`.

Every weight is drawn whole from a generator seeded by (seed, parameter name), the same on every
rank, before tensor parallelism keeps this rank's slice: a 1x1x1 run and a TPxPPxDP run start
from exactly the same model. The fused QKV weight is laid out head by head ([q, k, v] of head 0,
then of head 1, ...), as Megatron-LM stores it, so a column-parallel split of its rows gives each
rank whole heads of all three.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from instrumented_trainer.config import ModelConfig

INIT_STD = 0.02


def full_init(name: str, shape: tuple[int, ...], seed: int, std: float) -> torch.Tensor:
    """The full, unsharded N(0, std) weight of parameter `name`, the same on every rank."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def _init_linear(layer: nn.Linear, name: str, seed: int, std: float) -> nn.Linear:
    with torch.no_grad():
        layer.weight.copy_(full_init(f"{name}.weight", tuple(layer.weight.shape), seed, std))
        if layer.bias is not None:
            layer.bias.zero_()
    return layer


class Attention(nn.Module):
    """Causal self-attention; under TP each rank holds whole heads (the QKV rows it owns)."""

    def __init__(self, cfg: ModelConfig, name: str, seed: int) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.head_dim = h // cfg.num_attention_heads
        out_std = INIT_STD / math.sqrt(2.0 * cfg.num_layers)  # Megatron's residual-output init
        self.qkv = _init_linear(nn.Linear(h, 3 * h), f"{name}.qkv", seed, INIT_STD)
        self.proj = _init_linear(nn.Linear(h, h), f"{name}.proj", seed, out_std)
        self.recompute_core = False  # selective recomputation (Megatron-LM's)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        qkv = self.qkv(x).view(b, s, -1, 3, self.head_dim)  # -1: this rank's heads
        q, k, v = qkv.permute(3, 0, 2, 1, 4)  # each [b, heads, s, head_dim]
        if self.recompute_core:
            out = checkpoint(F.scaled_dot_product_attention, q, k, v, is_causal=True,
                             use_reentrant=False)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, name: str, seed: int) -> None:
        super().__init__()
        h, f = cfg.hidden_size, cfg.ffn_hidden_size
        out_std = INIT_STD / math.sqrt(2.0 * cfg.num_layers)
        self.fc1 = _init_linear(nn.Linear(h, f), f"{name}.fc1", seed, INIT_STD)
        self.fc2 = _init_linear(nn.Linear(f, h), f"{name}.fc2", seed, out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """One transformer layer."""

    def __init__(self, cfg: ModelConfig, index: int, seed: int) -> None:
        super().__init__()
        name = f"layers.{index}"
        self.ln1 = nn.LayerNorm(cfg.hidden_size)
        self.attention = Attention(cfg, f"{name}.attention", seed)
        self.ln2 = nn.LayerNorm(cfg.hidden_size)
        self.mlp = MLP(cfg, f"{name}.mlp", seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embeddings(nn.Module):
    """Token plus learned position embedding (first stage)."""

    def __init__(self, cfg: ModelConfig, seed: int) -> None:
        super().__init__()
        self.token = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.seq_length, cfg.hidden_size)
        with torch.no_grad():
            self.token.weight.copy_(full_init("embedding.weight", tuple(self.token.weight.shape),
                                              seed, INIT_STD))
            self.position.weight.copy_(full_init("position", tuple(self.position.weight.shape),
                                                 seed, INIT_STD))
        self.register_buffer("positions", torch.arange(cfg.seq_length), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # under sequence parallelism both come back as this rank's slice of the sequence
        return self.token(ids) + self.position(self.positions)


def apply_recompute(stage: nn.Module, granularity: str) -> None:
    """Activation recomputation: `full` wraps each layer in a non-reentrant checkpoint (its
    forward, TP collectives included, runs again in backward); `selective` recomputes only the
    core attention. Applied after tensor parallelism and before FSDP2, as torchtitan does."""
    if granularity == "selective":
        for block in stage.layers.values():
            block.attention.recompute_core = True
    elif granularity == "full":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: PLC0415
            checkpoint_wrapper)

        for name in list(stage.layers):
            stage.layers[name] = checkpoint_wrapper(stage.layers[name], preserve_rng_state=False)


class GPTStage(nn.Module):
    """The layers `layers` of the GPT, with the embeddings if `first`, the head if `last`."""

    def __init__(self, cfg: ModelConfig, layers: range, first: bool, last: bool,
                 seed: int) -> None:
        super().__init__()
        self.embeddings = Embeddings(cfg, seed) if first else None
        self.layers = nn.ModuleDict({str(i): Block(cfg, i, seed) for i in layers})
        self.final_ln = nn.LayerNorm(cfg.hidden_size) if last else None
        self.head = (_init_linear(nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False), "head",
                                  seed, INIT_STD) if last else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (first stage) or hidden states in; hidden states or logits out."""
        if self.embeddings is not None:
            x = self.embeddings(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.head is None:
            return x
        return self.head(self.final_ln(x))
