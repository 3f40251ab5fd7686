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
      N = L * (4 h^2 + 2 h f) + V h
  i.e. per block the Q, K, V, O projections (4 h^2, multi-head attention with
  n_heads * head_dim = h) and the two MLP matrices (2 h f, f = ffn_hidden, default 4h
  -> 12 L h^2 in total); plus the LM-head matmul V h. Excluded: the input embedding
  (a lookup, no FLOPs; torchtitan excludes nn.Embedding parameters), biases, layer norms,
  position embeddings. The LM head counts whether or not it is tied to the embedding
  (it is a matmul either way; for untied models this equals torchtitan's count).
  The attention term 12 L h s per token is QK^T and AV (2 * 2 s h forward per layer,
  x3 for forward + backward) over the FULL sequence: no halving for a causal mask
  (PaLM and torchtitan do not halve either).
  For SwiGLU (3 MLP matrices) or GQA, pass `params` explicitly.
"""
from __future__ import annotations

# Recomputation modes accepted by `hfu_flops_per_step`.
RECOMPUTE_MODES = ("none", "full", "selective")


def gpt_params(num_layers: int, hidden: int, vocab: int, ffn_hidden: int | None = None) -> float:
    """Matmul parameter count N = L * (4 h^2 + 2 h f) + V h (f defaults to 4h); see the
    module docstring for what is in and out."""
    f = 4 * hidden if ffn_hidden is None else ffn_hidden
    return float(num_layers) * (4.0 * hidden * hidden + 2.0 * hidden * f) + float(vocab or 0) * hidden


def attention_flops_per_token(num_layers: int, hidden: int, seq_len: int) -> float:
    """Forward + backward FLOPs per token of QK^T and AV: 12 * L * h * s
    (PaLM appendix B; torchtitan "12 * l * h * q * t")."""
    return 12.0 * num_layers * hidden * seq_len


def model_flops_per_step(num_layers: int, hidden: int, seq_len: int, vocab: int, tokens: float,
                         ffn_hidden: int | None = None, params: float | None = None) -> float:
    """Dense GPT model FLOPs per training step: 6 N tokens + 12 L h s tokens.

    `tokens` = tokens per step over the whole job (global batch x seq_len). `params`
    overrides N (it must follow the same convention: matmul parameters, LM head in,
    input embedding out)."""
    n = gpt_params(num_layers, hidden, vocab, ffn_hidden) if params is None else float(params)
    return (6.0 * n + attention_flops_per_token(num_layers, hidden, seq_len)) * tokens


def hfu_flops_per_step(num_layers: int, hidden: int, seq_len: int, vocab: int, tokens: float,
                       ffn_hidden: int | None = None, params: float | None = None,
                       recompute: str = "none") -> float:
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
    base = model_flops_per_step(num_layers, hidden, seq_len, vocab, tokens, ffn_hidden, params)
    attn_fwd = 4.0 * num_layers * hidden * seq_len * tokens
    if recompute == "none":
        return base
    if recompute == "selective":
        return base + attn_fwd
    n = gpt_params(num_layers, hidden, vocab, ffn_hidden) if params is None else float(params)
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
