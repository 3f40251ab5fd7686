"""What torch's split backward costs over the fused one, on one pipeline stage of the trainer's GPT.

The zero-bubble schedules (ScheduleZBVZeroBubble, ScheduleInterleavedZeroBubble) run a stage's backward
in two autograd passes: `stage_backward_input` (the input's gradient, the graph kept), then, later,
`stage_backward_weight` (the weights'). 1F1B runs `stage_backward`, one pass. This times the three
functions torch.distributed.pipelining's stages call, on the module the trainer builds
(instrumented_trainer.model.GPTStage), with no pipeline and no second rank around them, so nothing but
the backward itself is in the figures:

  forward      the stage's forward (and the loss, on a last stage), hidden states in with a gradient;
  fused        stage_backward, as 1F1B runs it;
  input        stage_backward_input;  weight   stage_backward_weight;  split = input + weight.

Each iteration runs one forward, then the fused or the split backward, alternating (which comes first
alternates too), so drift on a shared machine falls on both. Each figure is the median over the
iterations after --warmup; on CUDA a pass is timed on the host with the device synchronised before
and after (the pass's wall time, launches and kernels: what a stage's timeline holds), and by CUDA
events. The first iteration's weight gradients of the two backwards are compared (they must agree).
Printed per stage kind (`last`: layers, final LayerNorm, head and the trainer's loss; `middle`: layers
alone, an output gradient given): each pass's median, backward over forward, and split over fused: the figure diag.advise.calibrate.SPLIT_BACKWARD_EXTRA is (split / fused - 1), measured there on
the trainer's pipeline job (benchmarks/README.md, issue #19). Then `stream`: 8 micro-batches in a row with no
synchronisation between passes, fused (F, B) against split (F, I, the previous micro-batch's W), a
micro-batch's forward and backward each, and what the split adds a layer: on a GPU the host time that
queued kernels do not hide (wall clock: the stream columns are the same on both clocks' rows).

    python benchmarks/split_backward.py --hidden-size 512 --num-attention-heads 8 --seq-length 256 \\
        --vocab-size 256 --layers 2 --micro-batch-size 1            # the zero-bubble lever's CPU job
    python benchmarks/split_backward.py --device cuda --dtype bf16 --hidden-size 1024 \\
        --num-attention-heads 16 --seq-length 1024 --vocab-size 32000 --layers 2 --micro-batch-size 2

--json FILE writes the figures too. A benchmark, not a test: its figures are timings.
"""
from __future__ import annotations

import argparse
import json
import statistics as st
import sys
import time

import torch
import torch.nn.functional as F
from torch.distributed.pipelining._backward import (stage_backward, stage_backward_input,
                                                     stage_backward_weight)

from instrumented_trainer.config import ModelConfig
from instrumented_trainer.model import GPTStage

PASSES = ("forward", "fused", "input", "weight")


class Timer:
    """Wall time of a pass (device synchronised around it) and, on CUDA, its events' time."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn):
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        out = fn()
        if self.cuda:
            end.record()
        self.sync()
        wall = time.perf_counter() - t0
        return out, wall, (start.elapsed_time(end) / 1e3 if self.cuda else None)


def handover(out, last: bool, grad_out) -> tuple:
    """(stage_backward's outputs, their gradients) as a stage hands them over: the loss alone on the last stage,
    else (outputs,) and (their gradients,). stage_backward_input takes the outputs in a tuple either way: (out,)."""
    return (out, None) if last else ((out,), (grad_out,))


def measure(kind: str, cfg: ModelConfig, layers: int, mb: int, device: torch.device, dtype: torch.dtype,
            iters: int, warmup: int) -> dict:
    """{pass: (median wall s, median event s or None)} over the iterations after warmup, for one stage kind."""
    torch.manual_seed(0)
    last = kind == "last"
    stage = GPTStage(cfg, range(layers), first=False, last=last, seed=1234).to(device)
    params = list(stage.parameters())
    x0 = torch.randn(mb, cfg.seq_length, cfg.hidden_size, device=device)
    labels = torch.randint(0, cfg.vocab_size, (mb, cfg.seq_length), device=device)
    grad_out = torch.randn(mb, cfg.seq_length, cfg.hidden_size, device=device)
    timer = Timer(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)

    def forward(x):
        with autocast:
            out = stage(x)
            if last:   # the trainer's loss_fn (instrumented_trainer.parallel.pipeline)
                out = F.cross_entropy(out.flatten(0, 1).float(), labels.flatten())
        return out

    times = {p: [] for p in PASSES}
    got = {}
    events = {p: [] for p in PASSES}
    for i in range(warmup + iters):
        order = ("fused", "split") if i % 2 == 0 else ("split", "fused")
        for how in order:
            x = x0.detach().requires_grad_(True)
            out, wall, ev = timer(lambda: forward(x))
            outs, grads = handover(out, last, grad_out)
            rec = [("forward", wall, ev)]
            if how == "fused":
                _, wall, ev = timer(lambda: stage_backward(outs, grads, [x]))
                rec.append(("fused", wall, ev))
            else:
                (_, groups), wall, ev = timer(lambda: stage_backward_input((out,), grads, [x], iter(params)))
                rec.append(("input", wall, ev))
                _, wall, ev = timer(lambda: stage_backward_weight(iter(params), groups))
                rec.append(("weight", wall, ev))
            if i == 0:   # the two backwards' weight gradients, once: the split one is the same work
                got[how] = [p.grad.detach().float().clone() for p in params]
            for p in params:
                p.grad = None
            if i >= warmup:
                for name, wall, ev in rec:
                    times[name].append(wall)
                    if ev is not None:
                        events[name].append(ev)
    diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(got["split"], got["fused"]))
    if diff > (2e-2 if dtype == torch.bfloat16 else 1e-4):
        raise SystemExit(f"split_backward: the split backward's weight gradients differ from the fused one's "
                         f"by {diff:.2g} of the largest ({kind} stage): not the same work")
    fig = {p: (st.median(times[p]), st.median(events[p]) if events[p] else None) for p in PASSES}
    fig["stream"] = stream(forward, last, x0, grad_out, params, timer, iters, warmup)
    return fig


def stream(forward, last: bool, x0, grad_out, params, timer, iters: int, warmup: int, k: int = 8) -> dict:
    """Seconds a micro-batch (forward and backward) over k micro-batches in a row with no synchronisation
    between passes, as a schedule issues them: fused (1F1B's F, B) against split (F, I, then the previous
    micro-batch's W: the zero-bubble schedules defer it), so work queued on a GPU hides what host time it can.
    Median over rounds, alternating which comes first."""
    def run(how):
        pending = None
        for _ in range(k):
            x = x0.detach().requires_grad_(True)
            out = forward(x)
            outs, grads = handover(out, last, grad_out)
            if how == "fused":
                stage_backward(outs, grads, [x])
                continue
            _, groups = stage_backward_input((out,), grads, [x], iter(params))
            if pending is not None:
                stage_backward_weight(iter(params), pending)
            pending = groups
        if pending is not None:
            stage_backward_weight(iter(params), pending)
        for p in params:
            p.grad = None

    per = {"fused": [], "split": []}
    for i in range(warmup + iters):
        for how in (("fused", "split") if i % 2 == 0 else ("split", "fused")):
            wall = timer(lambda: run(how))[1]
            if i >= warmup:
                per[how].append(wall / k)
    return {h: st.median(v) for h, v in per.items()}


def report(kind: str, fig: dict, clock: int, layers: int) -> dict:
    """The figures on one clock (0: wall, 1: CUDA events): each pass, bwd/fwd, split/fused."""
    med = {p: fig[p][clock] for p in PASSES}
    split = med["input"] + med["weight"]
    sf, ss = fig["stream"]["fused"], fig["stream"]["split"]
    return {"stage": kind, **{f"{p}_ms": 1e3 * med[p] for p in PASSES}, "split_ms": 1e3 * split,
            "fused_over_forward": med["fused"] / med["forward"], "split_over_forward": split / med["forward"],
            "split_over_fused": split / med["fused"], "stream_fused_ms": 1e3 * sf, "stream_split_ms": 1e3 * ss,
            "stream_extra_ms_per_layer": 1e3 * (ss - sf) / layers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden-size", type=int, default=512)
    ap.add_argument("--num-attention-heads", type=int, default=8)
    ap.add_argument("--seq-length", type=int, default=256)
    ap.add_argument("--vocab-size", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2, help="layers on the stage")
    ap.add_argument("--micro-batch-size", type=int, default=1)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="bf16: autocast, as the trainer")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--stages", default="last,middle")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(1)   # as the trainer's ranks
    cfg = ModelConfig(num_layers=a.layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
                      seq_length=a.seq_length, vocab_size=a.vocab_size)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    print(f"torch {torch.__version__}, {a.device}"
          + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else "")
          + f", {a.dtype}, h {a.hidden_size}, s {a.seq_length}, V {a.vocab_size}, {a.layers} layers, "
            f"mb {a.micro_batch_size}; median of {a.iters} iterations after {a.warmup}", flush=True)
    clocks = ["wall"] + (["events"] if device.type == "cuda" else [])
    rows = []
    for kind in [k for k in a.stages.split(",") if k]:
        if kind not in ("last", "middle"):
            raise SystemExit(f"split_backward: --stages takes last and middle, not {kind!r}")
        fig = measure(kind, cfg, a.layers, a.micro_batch_size, device, dtype, a.iters, a.warmup)
        for c, clock in enumerate(clocks):
            rows.append({"clock": clock, **report(kind, fig, c, a.layers)})
    head = ["stage", "clock", "forward_ms", "fused_ms", "input_ms", "weight_ms", "split_ms",
            "fused_over_forward", "split_over_forward", "split_over_fused", "stream_fused_ms", "stream_split_ms",
            "stream_extra_ms_per_layer"]
    print("| " + " | ".join(h.replace("_", " ") for h in head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(f"{r[h]:.3f}" if isinstance(r[h], float) else str(r[h]) for h in head) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
