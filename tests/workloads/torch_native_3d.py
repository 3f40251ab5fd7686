"""A 3D-parallel (PP x DP x TP) training job built only from PyTorch's own pieces, torchtitan-style.

The project's tests need traces from a trainer that is *not* ours: no diag labels, no
`diag_run.json`, nothing but what PyTorch and Kineto write on their own. This script is that
trainer, shaped like torchtitan's llama3 recipe so its traces look like the ones users bring:

- `init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))` over gloo;
- a tiny llama (token embedding, blocks of RMSNorm + attention with RoPE + SwiGLU MLP w1/w2/w3,
  final RMSNorm, output projection), its layers split into pipeline chunks the way torchtitan's
  manual pipeline split does it (deep copy, drop the layers of other stages, drop the embedding
  off the first stage and norm/output off the last);
- tensor + sequence parallelism on "tp" with `parallelize_module` and torchtitan's plan
  (Colwise q/k/v/w1/w3, Rowwise o/w2 with Shard(1) outputs, SequenceParallel norms);
- FSDP2 `fully_shard` on "dp" per block and per chunk root, `reshard_after_forward=False` as
  torchtitan's default is when PP is on; gloo does reduce-scatter on tensors, so no fallback;
- `torch.distributed.pipelining`: `PipelineStage` per chunk and `ScheduleGPipe`,
  `Schedule1F1B` or `ScheduleInterleaved1F1B` (2 chunks a rank, stages looped over ranks);
- gradient-norm clipping over the DTensor gradients plus an all-reduce over "pp" (torchtitan's
  `clip_grad_norm_` with PP), AdamW;
- torch.profiler with CPU activity, `record_shapes=True`, schedule(wait=1, warmup=1, active=2)
  and torchtitan's trace handler: `<out>/profile_traces/iteration_<N>/rank<R>_trace.json`.

Launch: `python tests/workloads/torch_native_3d.py --out DIR [--schedule gpipe|1f1b|
interleaved-1f1b] [--pp 2 --dp 2 --tp 2] [--steps 4] [--microbatches 4] [--slow-rank R
--slow-ms X]`. It starts `pp*dp*tp` processes on 127.0.0.1 itself (torch.multiprocessing, fork
by default; `--start-method spawn` gives each a fresh interpreter), or runs as one rank when
started by torchrun (RANK and WORLD_SIZE set). `--slow-rank R --slow-ms X` makes rank R sleep X ms
in its first forward of every step: an injected straggler. The loss is printed by the first rank
that holds the last pipeline stage (torchtitan logs it where the last stage lives, too).
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
             "interleaved-1f1b": ScheduleInterleaved1F1B}


# -- model (torchtitan llama3, miniature) ---------------------------------------------------------
def rope_tables(head_dim: int, seq: int, theta: float = 10000.0):
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(seq).float(), freqs)  # [s, d/2]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]  # x: [b, s, heads, d]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        bs, seqlen, _ = x.shape
        # -1 heads: under TP each rank holds n_heads / tp of them
        q = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        k = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, ffn: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = nn.RMSNorm(dim)
        self.feed_forward = FeedForward(dim, ffn)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, vocab: int, dim: int, n_layers: int, n_heads: int, ffn: int, seq: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(dim, n_heads, ffn)
                                     for i in range(n_layers)})
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(dim // n_heads, seq)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens):
        # Pipeline chunks lack some of these modules (torchtitan sets them to None).
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


# -- parallelism ----------------------------------------------------------------------------------
def split_stage(model: Transformer, stage: int, n_stages: int) -> Transformer:
    """torchtitan's manual pipeline split: a copy holding only this stage's layers."""
    n = len(model.layers)
    per = n // n_stages
    keep = {str(i) for i in range(stage * per, (stage + 1) * per)}
    chunk = copy.deepcopy(model)
    for name in list(chunk.layers.keys()):
        if name not in keep:
            del chunk.layers[name]
    if stage != 0:
        chunk.tok_embeddings = None
    if stage != n_stages - 1:
        chunk.norm = None
        chunk.output = None
    return chunk


def apply_tp(chunk: Transformer, tp_mesh) -> None:
    """torchtitan's llama TP + sequence-parallel plan (without loss parallel)."""
    root_plan = {}
    if chunk.tok_embeddings is not None:
        root_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                      output_layouts=Shard(1))
    if chunk.output is not None:
        root_plan["norm"] = SequenceParallel()
        root_plan["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(),
                                              use_local_output=True)
    if root_plan:
        parallelize_module(chunk, tp_mesh, root_plan)
    for block in chunk.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })


def apply_fsdp(chunk: Transformer, dp_mesh) -> None:
    """FSDP2 per block, then the chunk's root; no reshard after forward under PP (torchtitan)."""
    for block in chunk.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=False)
    fully_shard(chunk, mesh=dp_mesh, reshard_after_forward=False)


def clip_grad_norm(params, max_norm: float, pp_mesh) -> torch.Tensor:
    """torchtitan's clip_grad_norm_ under PP: DTensor norm, then summed over the pipeline."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    total = total ** 2
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=pp_mesh.get_group())
    total = total ** 0.5
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


# -- profiling (torchtitan's layout) --------------------------------------------------------------
def make_profiler(out: str, rank: int):
    trace_dir = os.path.join(out, "profile_traces")

    def trace_handler(prof):
        curr = os.path.join(trace_dir, f"iteration_{prof.step_num}")
        os.makedirs(curr, exist_ok=True)
        prof.export_chrome_trace(f"{curr}/rank{rank}_trace.json")

    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2),
        on_trace_ready=trace_handler,
        record_shapes=True,
        with_stack=False,
    )


# -- training -------------------------------------------------------------------------------------
def build_pipeline(args, pp_mesh, dp_mesh, tp_mesh):
    """This rank's model chunks (TP, then FSDP, as torchtitan orders them), stages, schedule."""
    torch.manual_seed(0)  # the same initial weights everywhere
    model = Transformer(args.vocab, args.dim, args.layers, args.heads, args.ffn, args.seq)
    looped = args.schedule == "interleaved-1f1b"
    v = 2 if looped else 1
    n_stages = args.pp * v
    pp_rank = pp_mesh.get_local_rank()
    chunks, stages = [], []
    for sid in (pp_rank + s * args.pp for s in range(v)):  # torchtitan's "loop" stage style
        chunk = split_stage(model, sid, n_stages)
        apply_tp(chunk, tp_mesh)
        apply_fsdp(chunk, dp_mesh)
        chunks.append(chunk)
        stages.append(PipelineStage(chunk, sid, n_stages, torch.device("cpu"),
                                    group=pp_mesh.get_group()))

    def loss_fn(pred, labels):
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    schedule = SCHEDULES[args.schedule](stages if looped else stages[0],
                                        n_microbatches=args.microbatches, loss_fn=loss_fn)
    return chunks, stages, schedule


def install_straggler(chunk: nn.Module, ms: float):
    """Sleep `ms` in the first forward after each re-arm; returns the re-arm function."""
    due = [False]

    def straggle(_module, _inputs):
        if due[0]:
            due[0] = False
            time.sleep(ms / 1000)

    chunk.register_forward_pre_hook(straggle)
    return lambda: due.__setitem__(0, True)


def synthetic_batch(gen: torch.Generator, args):
    """A learnable next-token rule (t+1 mod vocab) from random starting tokens."""
    start = torch.randint(0, args.vocab, (args.microbatches * args.mbs, 1), generator=gen)
    seq = (start + torch.arange(args.seq + 1)) % args.vocab
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def pipeline_step(schedule, stages, inputs, labels) -> list[torch.Tensor]:
    """torchtitan's PP train step: inputs to the first stage, targets to the last."""
    has_first = any(s.is_first for s in stages)
    has_last = any(s.is_last for s in stages)
    losses: list[torch.Tensor] = []
    if has_first:
        schedule.step(inputs, target=labels if has_last else None,
                      losses=losses if has_last else None)
    elif has_last:
        schedule.step(target=labels, losses=losses)
    else:
        schedule.step()
    return losses


def train(args) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)  # 8 processes on a couple of cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (args.pp, args.dp, args.tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_mesh, dp_mesh, tp_mesh = mesh["pp"], mesh["dp"], mesh["tp"]
    chunks, stages, schedule = build_pipeline(args, pp_mesh, dp_mesh, tp_mesh)
    params = [p for c in chunks for p in c.parameters()]
    optimizer = torch.optim.AdamW(params, lr=args.lr)
    rearm = (install_straggler(chunks[0], args.slow_ms)
             if rank == args.slow_rank and args.slow_ms > 0 else None)
    gen = torch.Generator().manual_seed(1000 + dp_mesh.get_local_rank())  # one stream per replica
    log = (any(s.is_last for s in stages) and dp_mesh.get_local_rank() == 0
           and tp_mesh.get_local_rank() == 0)

    with make_profiler(args.out, rank) as prof:
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            if rearm:
                rearm()
            inputs, labels = synthetic_batch(gen, args)
            optimizer.zero_grad()
            losses = pipeline_step(schedule, stages, inputs, labels)
            grad_norm = clip_grad_norm(params, 1.0, pp_mesh)
            optimizer.step()
            prof.step()
            if log:
                print(f"[rank{rank}] step {step:3d}  loss {torch.stack(losses).mean().item():.4f}"
                      f"  grad_norm {grad_norm.item():.3f}"
                      f"  {1000 * (time.perf_counter() - t0):.0f} ms", flush=True)
    dist.barrier()
    dist.destroy_process_group()


# -- launch ---------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawned(local_rank: int, args, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank),
                      LOCAL_RANK=str(local_rank), WORLD_SIZE=str(args.nproc))
    train(args)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output dir (profile_traces/ goes inside)")
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--nproc", type=int, default=None, help="processes (default pp*dp*tp)")
    p.add_argument("--steps", type=int, default=4, help=">= 4: the profiler saves steps 2-3")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--mbs", type=int, default=3,
                   help="micro-batch size (3: b*s = 96 mm rows, unlike any model dimension)")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=172)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=None,
                   help="default 2 per pipeline rank (1 per stage under interleaved-1f1b)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--start-method", choices=("fork", "spawn"), default="fork")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    args = p.parse_args(argv)
    v = 2 if args.schedule == "interleaved-1f1b" else 1
    args.layers = args.layers or 2 * args.pp  # the same model whatever the schedule
    world = args.pp * args.dp * args.tp
    args.nproc = args.nproc or world
    if args.nproc != world:
        p.error(f"--nproc {args.nproc} != pp*dp*tp = {world}")
    if args.layers % (args.pp * v):
        p.error(f"--layers {args.layers} must split evenly into {args.pp * v} stages")
    if args.heads % args.tp or args.ffn % args.tp or args.seq % args.tp:
        p.error("--heads, --ffn and --seq must be multiples of --tp")
    if args.steps < 4:
        p.error("--steps must be >= 4 so the profiler writes a trace")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        if int(os.environ["WORLD_SIZE"]) != args.nproc:
            raise SystemExit(f"WORLD_SIZE {os.environ['WORLD_SIZE']} != pp*dp*tp {args.nproc}")
        train(args)
        return
    import torch.multiprocessing as mp
    # fork by default: 8 children re-importing torch cost ~20 s of CPU on a 2-core machine
    mp.start_processes(spawned, args=(args, free_port()), nprocs=args.nproc, join=True,
                       start_method=args.start_method)


if __name__ == "__main__":
    main()
