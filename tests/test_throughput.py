"""Model FLOPs, HFU, tokens/s/GPU and MFU (diag.analysis.throughput), hand-worked."""
import math

import pytest

from diag.analysis.throughput import (attention_flops_per_token, default_ffn_hidden, gpt_params,
                                      hfu_flops_per_step, mfu, model_flops_per_step,
                                      tokens_per_second_per_gpu)

# GPT-3 175B (Brown et al. 2020): L=96, h=12288, s=2048, vocab 50257, ffn 4h.
L, H, S, V = 96, 12288, 2048, 50257


def test_gpt3_params():
    blocks = 12 * 96 * 12288 * 12288          # 12 L h^2 = 173,946,175,488
    head = 50257 * 12288                      # V h = 617,558,016
    assert blocks == 173_946_175_488
    assert head == 617_558_016
    n = gpt_params(L, H, V)
    assert n == 174_563_733_504 == blocks + head
    assert math.isclose(n, 174.6e9, rel_tol=1e-3)
    # explicit ffn_hidden = 4h gives the same
    assert gpt_params(L, H, V, ffn_hidden=4 * H) == n


def test_gpt3_model_flops():
    n = 174_563_733_504
    attn = 12 * 96 * 12288 * 2048             # 12 L h s = 28,991,029,248 per token
    assert attn == 28_991_029_248
    assert attention_flops_per_token(L, H, S) == attn
    tokens = 1536 * 2048                      # GPT-3 batch of 1536 sequences = 3,145,728 tokens
    want = (6 * n + attn) * tokens            # (1,047,382,401,024 + 28,991,029,248) * tokens
    assert 6 * n == 1_047_382_401_024
    got = model_flops_per_step(L, H, S, V, tokens)
    assert got == pytest.approx(want, rel=1e-12)
    assert got == pytest.approx(1_076_373_430_272 * 3_145_728, rel=1e-12)
    # `params` overrides N
    assert model_flops_per_step(L, H, S, V, tokens, params=175e9) == pytest.approx(
        (6 * 175e9 + attn) * tokens, rel=1e-12)


def test_small_model_by_hand():
    # L=2, h=4, s=8, V=10, ffn 16: N = 2*(4*16 + 2*4*16) + 10*4 = 2*192 + 40 = 424
    assert gpt_params(2, 4, 10) == 424
    # ffn 6: N = 2*(64 + 48) + 40 = 264
    assert gpt_params(2, 4, 10, ffn_hidden=6) == 264
    # model FLOPs, 16 tokens: (6*424 + 12*2*4*8) * 16 = (2544 + 768) * 16 = 52992
    assert model_flops_per_step(2, 4, 8, 10, 16) == 52992
    assert hfu_flops_per_step(2, 4, 8, 10, 16) == 52992
    assert hfu_flops_per_step(2, 4, 8, 10, 16, recompute="none") == 52992
    # selective: + 4 L h s tokens = 4*2*4*8*16 = 4096
    assert hfu_flops_per_step(2, 4, 8, 10, 16, recompute="selective") == 52992 + 4096
    # full: + 2 * N_blocks * tokens + 4 L h s tokens, N_blocks = 424 - 40 = 384
    assert hfu_flops_per_step(2, 4, 8, 10, 16, recompute="full") == 52992 + 2 * 384 * 16 + 4096


def test_full_recompute_no_vocab_is_8n_16lhs():
    # no LM head: N = N_blocks, so full recomputation = 8 N tokens + 16 L h s tokens
    n = gpt_params(L, H, 0)
    tokens = 2048
    assert hfu_flops_per_step(L, H, S, 0, tokens, recompute="full") == pytest.approx(
        (8 * n + 16 * 96 * 12288 * 2048) * tokens, rel=1e-12)


def test_bad_recompute():
    with pytest.raises(ValueError):
        hfu_flops_per_step(2, 4, 8, 10, 16, recompute="partial")


def test_tokens_per_second_per_gpu():
    # 512 sequences x 4096 tokens in 8 s on 256 GPUs: 2,097,152 / 2048 = 1024 tokens/s/GPU
    assert tokens_per_second_per_gpu(512, 4096, 8.0, 256) == 1024.0
    assert tokens_per_second_per_gpu(512, 4096, 0.0, 256) is None
    assert tokens_per_second_per_gpu(512, 4096, 8.0, 0) is None


def test_mfu():
    # 1e18 FLOPs per step, 10 s, 1024 GPUs at 312 TF: 1e18 / (10*1024*312e12) = 1e18 / 3.19488e18
    assert mfu(1e18, 10.0, 1024, 312e12) == pytest.approx(1e18 / 3.19488e18, rel=1e-12)
    assert mfu(1e18, 10.0, 1024, 312e12) == pytest.approx(0.3130008012820513, rel=1e-12)
    assert mfu(1e18, 10.0, 1024, None) is None
    assert mfu(1e18, 0.0, 1024, 312e12) is None
    assert mfu(1e18, 1.0, 0, 312e12) is None


def test_gpt3_mfu_end_to_end():
    # GPT-3 step of 3,145,728 tokens in 20 s on 1024 A100 (312 TF bf16):
    # (1,076,373,430,272 * 3,145,728) / (20 * 1024 * 312e12)
    flops = model_flops_per_step(L, H, S, V, 1536 * 2048)
    want = 1_076_373_430_272 * 3_145_728 / (20 * 1024 * 312e12)
    assert mfu(flops, 20.0, 1024, 312e12) == pytest.approx(want, rel=1e-12)
    assert 0.52 < want < 0.53


# Llama 3 8B (torchtitan's "8B" flavour, Meta's config): L=32, h=4096, 32 query heads, 8 key/value
# heads, SwiGLU MLP of 14336, untied vocabulary of 128256.
L3 = dict(num_layers=32, hidden=4096, vocab=128256)
L3_ARCH = dict(num_heads=32, num_query_groups=8, swiglu=True)


def test_llama3_8b_params_swiglu_gqa():
    q_o = 2 * 4096 * 4096                     # 33,554,432
    k_v = 2 * 4096 * (4096 * 8 // 32)         # h_kv = 1024: 8,388,608
    mlp = 3 * 4096 * 14336                    # gate, up, down: 176,160,768
    head = 128256 * 4096                      # 525,336,576
    n = 32 * (q_o + k_v + mlp) + head
    assert n == 7_504_658_432
    assert gpt_params(**L3, ffn_hidden=14336, **L3_ARCH) == n
    # + the input embedding and the 65 RMSNorm weight vectors = Meta's published 8,030,261,248
    assert n + head + (2 * 32 + 1) * 4096 == 8_030_261_248


def test_llama3_8b_flops_per_token():
    n = 7_504_658_432
    attn = 12 * 32 * 4096 * 8192              # attention at s = 8192: 12,884,901,888 per token
    got = model_flops_per_step(32, 4096, 8192, 128256, 1.0, ffn_hidden=14336, **L3_ARCH)
    assert got == 6 * n + attn == 57_912_852_480
    # HFU with full recompute adds the blocks' forward again: 2 (N - V h) + 4 L h s per token
    full = hfu_flops_per_step(32, 4096, 8192, 128256, 1.0, ffn_hidden=14336, recompute="full", **L3_ARCH)
    assert full == got + 2 * (n - 128256 * 4096) + 4 * 32 * 4096 * 8192


def test_small_swiglu_gqa_by_hand():
    # L=2, h=8, 4 heads, 2 groups (h_kv = 4), SwiGLU f=12, V=10:
    # per layer 2*64 + 2*8*4 + 3*8*12 = 128 + 64 + 288 = 480; N = 2*480 + 80 = 1040
    assert gpt_params(2, 8, 10, 12, num_heads=4, num_query_groups=2, swiglu=True) == 1040
    # the same without GQA (h_kv = h): 2*(128 + 128 + 288) + 80 = 1168; heads alone change nothing
    assert gpt_params(2, 8, 10, 12, swiglu=True) == gpt_params(2, 8, 10, 12, num_heads=4, swiglu=True) == 1168


def test_swiglu_default_width_is_megatrons():
    # int(4 h * 2/3 / 64) * 64: h = 4096 -> int(170.67) * 64 = 10880; h = 8 -> int(0.33) * 64 = 0
    assert default_ffn_hidden(4096, swiglu=True) == 10880
    assert default_ffn_hidden(4096) == 16384
    assert gpt_params(1, 4096, 0, swiglu=True) == 4 * 4096 ** 2 + 3 * 4096 * 10880


def test_rates_use_the_real_shape():
    from types import SimpleNamespace

    from diag.analysis.rates import throughput
    from diag.runmeta import RunFacts

    meta = RunFacts(global_batch_size=16, seq_length=8192, num_layers=32, hidden_size=4096, vocab_size=128256,
                ffn_hidden_size=14336, num_attention_heads=32, num_query_groups=8, swiglu=True)
    t = throughput([SimpleNamespace(step_time_s=2.0, device=None)], meta, 8, peak_tflops=1000)
    assert t.model_flops_per_step == 57_912_852_480 * 16 * 8192
    assert t.mfu == pytest.approx(57_912_852_480 * 16 * 8192 / (2.0 * 8 * 1e15))
