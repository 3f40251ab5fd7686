"""Training throughput: tokens/s/GPU, model FLOPs per step, MFU and HFU.

Problem: step time alone cannot be compared across model sizes, batch sizes or cluster
sizes; tokens/s/GPU and Model FLOPs Utilisation (MFU) can. MFU counts only the FLOPs
the model mathematically needs (no recomputation), so it is comparable across
implementations; Hardware FLOPs Utilisation (HFU) adds the recomputed forward FLOPs.

Convention (stated once, used everywhere):
  model FLOPs per step = 6 * N * tokens + 12 * L * h * s * tokens
  -- PaLM (Chowdhery et al. 2022, arXiv:2204.02311, appendix B) and torchtitan
  (`get_nparams_and_flops` in the model args, formerly `utils.get_num_flop_per_token`:
  "6 * (nparams - nparams_embedding) + 12 * l * h * q * t").
  N = parameters that take part in matmuls per token:
      N = L * (2 h^2 + 2 h h_kv + m h f) + V h,   h_kv = h * groups / heads
  i.e. per block the Q and O projections (h x h each: n_heads * head_dim = h, Megatron's
  default kv_channels), the K and V projections (h x h_kv each: grouped-query attention with
  `num_query_groups` key/value heads; h_kv = h without GQA), and the MLP's m matrices of
  h x f (m = 2 for GeLU, m = 3 for SwiGLU's gate, up and down; f = ffn_hidden, default 4h,
  or for SwiGLU Megatron-LM's int(8h/3 / 64) * 64); plus the LM-head matmul V h. For a plain
  GPT (MHA, 2 matrices, f = 4h) this is 12 L h^2 + V h. Excluded: the input embedding (a
  lookup, no FLOPs; torchtitan excludes nn.Embedding parameters), biases, norms, position
  embeddings. The LM head counts whether or not it is tied to the embedding (it is a matmul
  either way; for untied models, e.g. Llama 3 8B, this equals torchtitan's count less its
  norms). The attention term 12 L h s per token is QK^T and AV (2 * 2 s h forward per layer,
  x3 for forward + backward) over the FULL sequence: no halving for a causal mask (PaLM and
  torchtitan do not halve either); GQA shares K/V heads but every query head still attends.
"""
from __future__ import annotations

# Recomputation modes accepted by `hfu_flops_per_step`.
RECOMPUTE_MODES = ("none", "full", "selective")


def default_ffn_hidden(hidden: int, swiglu: bool = False) -> int:
    """Megatron-LM's MLP width when none is given: 4h, or for SwiGLU 2/3 of that rounded
    down to a multiple of 64 (three matrices instead of two, about the same parameters)."""
    return int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden


def gpt_params(num_layers: int, hidden: int, vocab: int, ffn_hidden: int | None = None, *,
               num_heads: int | None = None, num_query_groups: int | None = None,
               swiglu: bool = False) -> float:
    """Matmul parameter count N = L * (2 h^2 + 2 h h_kv + m h f) + V h; see the module
    docstring for what is in and out. Without both num_heads and num_query_groups the
    attention is taken as multi-head (h_kv = h)."""
    h = float(hidden)
    f = float(default_ffn_hidden(hidden, swiglu) if ffn_hidden is None else ffn_hidden)
    h_kv = h * num_query_groups / num_heads if num_heads and num_query_groups else h
    per_layer = 2.0 * h * h + 2.0 * h * h_kv + (3.0 if swiglu else 2.0) * h * f
    return float(num_layers) * per_layer + float(vocab or 0) * h


def attention_flops_per_token(num_layers: int, hidden: int, seq_len: int) -> float:
    """Forward + backward FLOPs per token of QK^T and AV: 12 * L * h * s
    (PaLM appendix B; torchtitan "12 * l * h * q * t")."""
    return 12.0 * num_layers * hidden * seq_len


def model_flops_per_step(num_layers: int, hidden: int, seq_len: int, vocab: int, tokens: float,
                         ffn_hidden: int | None = None, params: float | None = None, **arch) -> float:
    """Dense GPT model FLOPs per training step: 6 N tokens + 12 L h s tokens.

    `tokens` = tokens per step over the whole job (global batch x seq_len). `params`
    overrides N (it must follow the same convention: matmul parameters, LM head in,
    input embedding out); else N = gpt_params(..., **arch), arch being its keyword-only
    shape (num_heads, num_query_groups, swiglu)."""
    n = gpt_params(num_layers, hidden, vocab, ffn_hidden, **arch) if params is None else float(params)
    return (6.0 * n + attention_flops_per_token(num_layers, hidden, seq_len)) * tokens


def hfu_flops_per_step(num_layers: int, hidden: int, seq_len: int, vocab: int, tokens: float,
                       ffn_hidden: int | None = None, params: float | None = None,
                       recompute: str = "none", **arch) -> float:
    """Hardware FLOPs per step: model FLOPs + the forward FLOPs recomputed in backward.

    "none": = model FLOPs.
    "full": every transformer block's forward runs twice (Megatron-LM / torchtitan full
      activation checkpointing wrap blocks, not the LM head): + 2 N_blocks tokens +
      4 L h s tokens, with N_blocks = N - V h. (With N_blocks = N this is the familiar
      8 N tokens + 16 L h s tokens.)
    "selective": only the core attention (QK^T, softmax, dropout, AV) is recomputed
      (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
      Models", section 4.2): + 4 L h s tokens -> 6 N tokens + 16 L h s tokens.
    Recomputation inside kernels (FlashAttention's backward) is not counted.
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    base = model_flops_per_step(num_layers, hidden, seq_len, vocab, tokens, ffn_hidden, params, **arch)
    attn_fwd = 4.0 * num_layers * hidden * seq_len * tokens
    if recompute == "none":
        return base
    if recompute == "selective":
        return base + attn_fwd
    n = gpt_params(num_layers, hidden, vocab, ffn_hidden, **arch) if params is None else float(params)
    n_blocks = n - float(vocab or 0) * hidden
    return base + 2.0 * n_blocks * tokens + attn_fwd


def tokens_per_second_per_gpu(global_batch: float, seq_len: float, step_s: float,
                              gpus: int) -> float | None:
    """global batch x sequence length / (step time x GPUs); None when step_s or gpus is
    not > 0."""
    if not step_s or step_s <= 0 or not gpus or gpus <= 0:
        return None
    return float(global_batch) * float(seq_len) / (float(step_s) * gpus)


def mfu(model_flops: float, step_s: float, gpus: int, peak_flops: float | None) -> float | None:
    """Model FLOPs Utilisation = model FLOPs per step / (step time x GPUs x peak FLOP/s)
    (PaLM appendix B). A fraction (0.4 = 40 %). None when the peak is unknown or any
    denominator piece is not > 0. Pass HFU FLOPs to get HFU."""
    if peak_flops is None or peak_flops <= 0 or not step_s or step_s <= 0 or not gpus or gpus <= 0:
        return None
    return float(model_flops) / (float(step_s) * gpus * float(peak_flops))
