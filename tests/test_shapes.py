"""Model shape from GEMM input dims (diag.analysis.shapes): hand-made layers of known models,
traces written with those shapes, and the real traces that carry Input Dims."""
from __future__ import annotations

import gzip
import json
import os
from collections import Counter

import pytest

from conftest import DATA, ROOT
from diag.analysis import diagnose
from diag.analysis.rankpass import summarize
from diag.analysis.shapes import attention_kind, infer_shape
from diag.trace import load_job, load_rank
from kineto import TraceBuilder


def linear(tokens: tuple, k: int, n: int, bias: bool = False) -> tuple:
    """aten::linear(x [*tokens, k], weight [n, k], bias [n]) as the profiler records it."""
    return "aten::linear", [list(tokens) + [k], [n, k], [n] if bias else []]


def llama_layers(layers: int, tokens: tuple, h: int, q: int, kv: int, f: int, vocab: int, fused=False) -> list:
    """One forward pass of a Llama block stack on one rank: wq, wk, wv, wo, w1, w3, w2, then the LM head
    (widths as this rank holds them); fused: w1 and w3 as one [2f, h] weight (Megatron's fc1)."""
    mlp_up = [linear(tokens, h, 2 * f)] if fused else [linear(tokens, h, f), linear(tokens, h, f)]
    block = [linear(tokens, h, q), linear(tokens, h, kv), linear(tokens, h, kv), linear(tokens, q, h),
             *mlp_up, linear(tokens, f, h)]
    return block * layers + [linear(tokens, h, vocab)]


def backward_mms(gemms: list) -> list:
    """What autograd adds for each linear: grad input [m, n] x [n, k] and grad weight [n, m] x [m, k]
    (aten::mm), and what linear itself calls (aten::matmul, aten::mm) on the same operands."""
    out = []
    for _, (x, w, _b) in gemms:
        m, k, n = 1, x[-1], w[0]
        for d in x[:-1]:
            m *= d
        out += [("aten::mm", [[m, n], [n, k]]), ("aten::mm", [[n, m], [m, k]]),
                ("aten::matmul", [x, [k, n]]), ("aten::mm", [[m, k], [k, n]])]
    return out


def test_llama3_8b_without_tp():
    # 2 micro-batches of 1 x 8192 tokens; 8 layers shown (any number works)
    fwd = llama_layers(8, (1, 8192), h=4096, q=4096, kv=1024, f=14336, vocab=128256) * 2
    got = infer_shape(fwd + backward_mms(fwd), tp=1)
    assert got == {"tokens_per_micro_batch": 8192, "hidden_size": 4096, "ffn_hidden_size_per_rank": 14336,
                   "ffn_hidden_size": 14336, "swiglu": True}


def test_llama3_8b_with_tp2_sees_the_shards():
    # TP 2 splits heads and MLP: wq 4096/2, wk/wv 1024/2, w1/w3/w2 14336/2; h and tokens stay whole
    fwd = llama_layers(4, (8192,), h=4096, q=2048, kv=512, f=7168, vocab=64128)
    assert infer_shape(fwd) == {"tokens_per_micro_batch": 8192, "hidden_size": 4096,
                                "ffn_hidden_size_per_rank": 7168, "swiglu": True}
    assert infer_shape(fwd, tp=2)["ffn_hidden_size"] == 14336


def test_fused_gate_and_up():
    fwd = llama_layers(4, (2, 4096), h=2048, q=1024, kv=256, f=2816, vocab=16000, fused=True)
    got = infer_shape(fwd, tp=2)
    assert (got["ffn_hidden_size"], got["swiglu"]) == (5632, True)


def test_gpt2_gelu_block():
    # fused QKV h -> 3h, output h -> h, fc 4h both ways: GeLU MLP of 4h = 3072
    h, tok = 768, (4, 1024)
    block = [linear(tok, h, 3 * h, True), linear(tok, h, h, True), linear(tok, h, 4 * h, True),
             linear(tok, 4 * h, h, True)]
    got = infer_shape(block * 12 + [linear(tok, h, 50257)])
    assert got == {"tokens_per_micro_batch": 4096, "hidden_size": 768, "ffn_hidden_size_per_rank": 3072,
                   "swiglu": False}


def test_megatron_matmuls_without_linear_give_tokens_and_hidden_only():
    """Megatron-LM's own linear layers call torch.matmul: forward and backward look alike."""
    fwd = llama_layers(4, (4096, 1), h=1024, q=512, kv=512, f=1408, vocab=8000, fused=True)
    plain = [("aten::matmul", [x, [k, w[0]]]) for _, (x, w, _b) in fwd for k in [x[-1]]]
    plain += [("aten::matmul", [[4096, 1, w[0]], [w[0], x[-1]]]) for _, (x, w, _b) in fwd]      # grad input
    plain += [("aten::matmul", [[w[0], 4096], [4096, x[-1]]]) for _, (x, w, _b) in fwd]         # grad weight
    assert infer_shape(plain) == {"tokens_per_micro_batch": 4096, "hidden_size": 1024}


def test_ambiguous_shapes_are_left_out():
    tok = (512,)
    # an MoE block whose experts are not aten::linear: only attention in and out of h
    moe = [linear(tok, 2880, 640), linear(tok, 512, 2880), linear(tok, 2880, 128)] * 8
    assert infer_shape(moe) == {"tokens_per_micro_batch": 512, "hidden_size": 2880}
    # a recommender's MLP tower: widths change from layer to layer, no common h
    tower = [linear(tok, 512, 256), linear(tok, 256, 128), linear(tok, 128, 64), linear(tok, 64, 1)]
    assert infer_shape(tower) == {"tokens_per_micro_batch": 512}
    # two token counts equally often: no tokens, nothing else
    assert infer_shape([linear((64,), 32, 32), linear((128,), 32, 32)]) == {}
    assert infer_shape([]) == {} and infer_shape([("aten::mm", None), ("aten::linear", [[3]])]) == {}


def test_a_written_trace_keeps_its_gemm_shapes(tmp_path):
    """Through the trace reader: Input Dims of the GEMM ops are kept per rank (RankTrace.gemms)."""
    b = TraceBuilder().step(1, 0.0, 1000.0)
    fwd = llama_layers(2, (2, 256), h=256, q=256, kv=64, f=768, vocab=2048)    # torchtitan's llama3 debugmodel
    for i, (name, dims) in enumerate(fwd + backward_mms(fwd)):
        b.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": b.pid, "tid": b.pid,
                         "ts": b.base + 1.0 + i, "dur": 0.5, "args": {"External id": i, "Input Dims": dims}})
    rt = load_rank(b.write(str(tmp_path / "rank0.json")))
    assert sum(rt.gemms.values()) == len(fwd) * 5
    assert infer_shape(rt.gemms, tp=1) == {"tokens_per_micro_batch": 512, "hidden_size": 256,
                                           "ffn_hidden_size_per_rank": 768, "ffn_hidden_size": 768, "swiglu": True}


@pytest.mark.parametrize("run", ["dp2_no_overlap", "pp2_m2", "tp2_pp2_dp2"])
def test_the_trainers_traces_agree_with_their_run_metadata(run):
    folder = os.path.join(ROOT, "sample_traces", run)
    with open(os.path.join(folder, "diag_run.json")) as f:
        meta = json.load(f)
    want = {"tokens_per_micro_batch": meta["micro_batch_size"] * meta["seq_length"],
            "hidden_size": meta["hidden_size"], "ffn_hidden_size_per_rank": meta["ffn_hidden_size"] // meta["tp"],
            "ffn_hidden_size": meta["ffn_hidden_size"], "swiglu": False}          # the trainer's MLP is GeLU
    for name in sorted(os.listdir(folder)):
        if name.endswith(".pt.trace.json.gz"):
            rt = load_rank(os.path.join(folder, name))
            if summarize(rt).dtensor:       # DTensor's aten::linear carries the global weight
                assert infer_shape(rt.gemms, tp=1) == {**want, "ffn_hidden_size_per_rank": meta["ffn_hidden_size"]}
            else:
                assert meta["tp"] == 1 and infer_shape(rt.gemms, tp=meta["tp"]) == want
    facts = diagnose(load_job(folder)).facts
    assert (facts.hidden_size, facts.ffn_hidden_size) == (meta["hidden_size"], meta["ffn_hidden_size"])


def test_real_b200_trace():
    """gpt-oss (hidden 2880) served with TP 8: the MoE experts are no aten::linear, so the MLP is unknown."""
    path = os.path.join(DATA, "b200_rank0_of_8_eager", "eager_trace.json.gz")
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    rows = Counter(e["args"]["Input Dims"][0][0] for e in events if e.get("name") == "aten::linear")
    assert infer_shape(load_rank(path).gemms, tp=8) == {"tokens_per_micro_batch": rows.most_common(1)[0][0],
                                                        "hidden_size": 2880}


def test_traces_without_shapes_give_nothing():
    rt = load_rank(os.path.join(DATA, "a100_rank0_of_2_nccl_args", "nccl_data.json.gz"))
    assert rt.gemms == {} and infer_shape(rt.gemms) == {}       # aten::mm ops, but no record_shapes


@pytest.mark.parametrize("names,kind", [
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"], "fused"),
    (["aten::_scaled_dot_product_efficient_attention", "fmha_cutlassF_f16_aligned_64x64_rf_sm80"], "fused"),
    (["aten::_scaled_dot_product_cudnn_attention"], "fused"),
    (["aten::_flash_attention_forward", "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>"], "fused"),
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math", "aten::_softmax"], "eager"),
    (["aten::baddbmm", "aten::_softmax", "aten::bmm"], "eager"),          # Megatron's unfused core
    (["scaled_upper_triang_masked_softmax_warp_forward", "aten::bmm"], "eager"),
    (["autograd::engine::evaluate_function: ScaledUpperTriangMaskedSoftmaxBackward"], "eager"),  # any case
    (["ScaledMaskedSoftmax", "aten::bmm"], "eager"),
    (["FMHA_fwd_kernel", "aten::mm"], "fused"),
    (["aten::_flash_attention_forward", "aten::_scaled_dot_product_attention_math"], "eager"),   # both: keeps scores
    (["aten::_log_softmax", "aten::mm", "aten::addmm"], None),            # the loss's softmax is not attention
    (["flash_attn/modules/mha.py(120): forward", "aten::mm"], None),       # a Python frame is not an op
])
def test_attention_kind_from_op_and_kernel_names(names, kind):
    assert attention_kind(names) == kind


def test_the_trainers_cpu_attention_is_fused_and_said_once_in_the_facts():
    """The trainer's F.scaled_dot_product_attention runs flash attention on CPU; a GPU trace with
    only the loss's log-softmax says nothing (None: the memory model keeps the scores)."""
    d = diagnose(load_job(os.path.join(ROOT, "sample_traces", "pp2_m2")))
    assert d.facts.attention == "fused"
    rt = load_rank(os.path.join(DATA, "a100_single_ns_resolution", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"))
    assert summarize(rt).attention is None
