"""benchmarks/split_backward.py, the instrument behind calibrate.SPLIT_BACKWARD_HOST_S (benchmarks/README.md).

A small CPU run through it: both stage kinds, every pass timed, the split the sum of its passes, and the
gradient check (the split backward's weight gradients are the fused one's) passed on the way; and the
check itself fails where the two do not agree (a weight pass that skips one parameter's gradient).
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16", "--vocab-size", "32",
         "--iters", "2", "--warmup", "1"]


def test_a_small_cpu_run_times_every_pass_of_both_stages(tmp_path):
    out = tmp_path / "split.json"
    res = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "split_backward.py"), *SMALL,
                          "--json", str(out)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["stage"], r["clock"]) for r in rows] == [("last", "wall"), ("middle", "wall")]
    for r in rows:
        assert all(r[f"{p}_ms"] > 0 for p in ("forward", "fused", "input", "weight", "stream_fused", "stream_split"))
        assert r["split_ms"] == pytest.approx(r["input_ms"] + r["weight_ms"])
        assert r["split_over_fused"] == pytest.approx(r["split_ms"] / r["fused_ms"])
        assert r["stream_extra_ms_per_layer"] == pytest.approx((r["stream_split_ms"] - r["stream_fused_ms"]) / 2)
    assert "| last | wall |" in res.stdout and "| middle | wall |" in res.stdout


def test_the_gradient_check_catches_a_weight_pass_that_is_not_the_same_work(monkeypatch):
    spec = importlib.util.spec_from_file_location("split_backward", os.path.join(ROOT, "benchmarks", "split_backward.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import torch
    from instrumented_trainer.config import ModelConfig

    real = mod.stage_backward_weight

    cfg = ModelConfig(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=32)
    device = torch.device("cpu")
    # agreeing passes: no error
    mod.measure("middle", cfg, 1, 1, device, torch.float32, iters=1, warmup=0)

    def spoilt(weights, groups, *a, **k):
        weights = list(weights)
        out = real(iter(weights), groups, *a, **k)
        weights[0].grad.mul_(2.0)             # not the fused backward's gradient
        return out
    monkeypatch.setattr(mod, "stage_backward_weight", spoilt)
    with pytest.raises(SystemExit, match="differ from the fused one's"):
        mod.measure("middle", cfg, 1, 1, device, torch.float32, iters=1, warmup=0)
