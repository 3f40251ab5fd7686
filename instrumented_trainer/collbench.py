"""Collective micro-benchmark over the trainer's own TP/PP/DP groups (nccl-tests style).

`python -m instrumented_trainer.collbench --nproc N --tensor-model-parallel-size T
--pipeline-model-parallel-size P --out bench.json` (or under torchrun, without --nproc).

For every axis whose group size is > 1 it times all_reduce, all_gather, reduce_scatter,
broadcast and all_to_all (and send/recv between neighbouring pipeline stages on PP) over a
x2 sweep of message sizes. Each size: warm-up, a barrier over the whole job, `iters` calls
timed as one loop (CUDA events on GPU, perf_counter on CPU), per-call mean per rank, then
all_reduce MAX over the job: the slowest rank's time counts, as in nccl-tests. Message
size S, algbw and busbw come from `diag.analysis.bandwidth` (the analyser's own formulas).
An op the backend rejects is skipped and listed with the reason.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from diag.analysis.bandwidth import busbw, algbw, message_bytes
from diag.layout import Axis, RankGrid
from diag.trace.kinds import coll_from_arg
from instrumented_trainer.launch import gpu_for, spawn

SCHEMA = "diag.collbench/1"
DTYPE, DTYPE_BYTES = torch.float32, 4
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
COLL = {op: coll_from_arg(op) for op in OPS}      # diag's one map of op names
# torch >= 2.13 renamed the tensor forms; older versions only have the old names.
_ALL_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'8', '1K', '64M', '1G' -> bytes (binary units, as nccl-tests -b/-e)."""
    t = text.strip().upper().rstrip("B").rstrip("I")
    unit = t[-1] if t and t[-1] in _UNITS else ""
    return int(float(t[: len(t) - len(unit)]) * _UNITS[unit])


def sizes(lo: int, hi: int) -> list[int]:
    """lo, 2lo, 4lo, ... <= hi."""
    out, s = [], max(lo, 1)
    while s <= hi:
        out.append(s)
        s *= 2
    return out


# --- one op at one size -----------------------------------------------------------------
def _make_op(op: str, nbytes: int, group, ranks: list[int], rank: int, peer, device):
    """(in_nelems, out_nelems, run) for op at S = nbytes; run() does one call."""
    n = len(ranks)
    count = max(1, nbytes // DTYPE_BYTES)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(n, count - count % n)
    buf = lambda k: torch.ones(k, dtype=DTYPE, device=device)  # noqa: E731
    if op == "all_reduce":
        t = buf(count)
        return count, count, lambda: dist.all_reduce(t, group=group)
    if op == "broadcast":
        t = buf(count)
        return count, count, lambda: dist.broadcast(t, src=ranks[0], group=group)
    if op == "all_gather":
        i, o = buf(count // n), buf(count)
        return count // n, count, lambda: _ALL_GATHER(o, i, group=group)
    if op == "reduce_scatter":
        i, o = buf(count), buf(count // n)
        return count, count // n, lambda: _REDUCE_SCATTER(o, i, group=group)
    if op == "all_to_all":
        i, o = buf(count), buf(count)
        return count, count, lambda: dist.all_to_all_single(o, i, group=group)
    if op == "send_recv":
        t = buf(count)
        if peer is None:
            return count, count, lambda: None
        send = rank < peer  # lower stage sends forward, as activations do
        return count, count, (lambda: dist.send(t, peer)) if send else (lambda: dist.recv(t, peer))
    raise ValueError(f"unknown op {op!r}")


def _timed_loop(run, iters: int, device) -> float:
    """Mean seconds per call of `iters` back-to-back calls on this rank."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    return (time.perf_counter() - t0) / iters


def _slowest(seconds: float, device) -> float:
    """all_reduce MAX over the whole job of the per-rank time."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()


def measure(op, nbytes, group, ranks, rank, peer, args, device) -> dict:
    """One (op, size) point: warm-up, barrier, timed loop, slowest rank."""
    in_n, out_n, run = _make_op(op, nbytes, group, ranks, rank, peer, device)
    n = 2 if op == "send_recv" else len(ranks)
    for _ in range(args.warmup):
        run()
    _sync(device)
    t = _slowest(_timed_loop(run, args.iters, device), device)
    coll = COLL[op]
    s = message_bytes(coll, in_n, out_n, DTYPE_BYTES, n)
    return {"op": op, "bytes": s, "count": s // DTYPE_BYTES, "group_size": n, "time_s": t,
            "algbw": algbw(s, t), "busbw": busbw(coll, s, t, n)}


# --- support probe ------------------------------------------------------------------------
def _supported(op, group, ranks, rank, peer, device) -> str | None:
    """None if the backend runs `op` here, else the reason (same on every rank)."""
    reason = None
    try:
        _make_op(op, 64 * len(ranks), group, ranks, rank, peer, device)[2]()
    except (RuntimeError, NotImplementedError, ValueError) as e:  # raised before any traffic
        reason = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    bad = torch.tensor([1.0 if reason else 0.0], device=device)
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if bad.item() and not reason:
        reason = "not supported on another rank"
    return reason


# --- sweep ------------------------------------------------------------------------------
def build_groups(grid: RankGrid, rank: int) -> dict[Axis, tuple[object, list[int]]]:
    """This rank's group per axis, created in the trainer's order (TP, DP, PP) by every rank."""
    mine = {}
    for axis in (Axis.TP, Axis.DP, Axis.PP):
        for ranks in grid.groups(axis):
            handle = dist.new_group(ranks=ranks)
            if rank in ranks:
                mine[axis] = (handle, ranks)
    return mine


def _pp_peer(grid: RankGrid, rank: int) -> int | None:
    """Neighbouring stage this rank pairs with: stages (0,1), (2,3), ...; None if unpaired."""
    c = grid.coords(rank)
    other = c.pp_rank + 1 if c.pp_rank % 2 == 0 else c.pp_rank - 1
    if other >= grid.pp:
        return None
    return grid.rank(c.tp_rank, other, c.dp_rank)


def _ops_for(axis: Axis, wanted: list[str]) -> list[str]:
    return [op for op in wanted if op != "send_recv" or axis == Axis.PP]


def sweep(args, grid: RankGrid, rank: int, device) -> tuple[list[dict], list[dict]]:
    groups = build_groups(grid, rank)
    results, skipped = [], []
    for axis in (Axis.TP, Axis.PP, Axis.DP):
        if grid.size(axis) == 1:
            continue
        group, ranks = groups[axis]
        peer = _pp_peer(grid, rank) if axis == Axis.PP else None
        for op in _ops_for(axis, args.ops):
            reason = _supported(op, group, ranks, rank, peer, device)
            if reason:
                skipped.append({"axis": str(axis), "op": op, "reason": reason})
                continue
            for s in sizes(args.min_bytes, args.max_bytes):
                point = measure(op, s, group, ranks, rank, peer, args, device)
                results.append({"axis": str(axis), **point, "backend": dist.get_backend(),
                                "device": device.type})
    return results, skipped


# --- output ---------------------------------------------------------------------------------
def table(doc: dict) -> str:
    """nccl-tests layout, one block per axis x op (GB/s = 1e9 B/s, time in us)."""
    lines = [f"# diag collbench: backend {doc['backend']} device {doc['device']} world "
             f"{doc['world_size']} grid tp={doc['grid']['tp']} pp={doc['grid']['pp']} "
             f"dp={doc['grid']['dp']} iters {doc['iters']} warmup {doc['warmup']}"]
    blocks: dict[tuple[str, str], list[dict]] = {}
    for r in doc["results"]:
        blocks.setdefault((r["axis"], r["op"]), []).append(r)
    for (axis, op), rows in blocks.items():
        lines.append(f"#\n# axis {axis}  op {op}  group size {rows[0]['group_size']}")
        lines.append(f"# {'size':>12} {'count':>12} {'type':>7} {'redop':>6} {'root':>5} "
                     f"{'time':>9} {'algbw':>8} {'busbw':>8}")
        lines.append(f"# {'(B)':>12} {'(elements)':>12} {'':>7} {'':>6} {'':>5} "
                     f"{'(us)':>9} {'(GB/s)':>8} {'(GB/s)':>8}")
        redop = "sum" if op in ("all_reduce", "reduce_scatter") else "none"
        root = "0" if op == "broadcast" else "-1"
        for r in rows:
            lines.append(f"  {r['bytes']:>12} {r['count']:>12} {'float':>7} {redop:>6} "
                         f"{root:>5} {r['time_s'] * 1e6:>9.1f} {r['algbw'] / 1e9:>8.3f} "
                         f"{r['busbw'] / 1e9:>8.3f}")
    for s in doc["skipped"]:
        lines.append(f"# skipped: axis {s['axis']} op {s['op']}: {s['reason']}")
    return "\n".join(lines)


def _memory_cap(device, world: int) -> int:
    """Largest S the sweep may use: a quarter of free memory per rank over ~3 buffers."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // max(world, 1)
    return max(free // 12, 1)


def worker(args) -> int:
    use_cuda = torch.cuda.is_available() and not args.cpu
    backend = "nccl" if use_cuda else "gloo"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if use_cuda:
        torch.cuda.set_device(gpu_for(int(os.environ.get("LOCAL_RANK", rank)),
                                      torch.cuda.device_count()))
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    dist.init_process_group(backend)
    try:
        grid = RankGrid.from_world(world, args.tensor_model_parallel_size,
                                   args.pipeline_model_parallel_size)
        cap = _memory_cap(device, world)
        if args.max_bytes > cap:
            args.max_bytes = cap
        results, skipped = sweep(args, grid, rank, device)
        doc = {"schema": SCHEMA, "backend": backend, "device": device.type,
               "world_size": world, "grid": {"tp": grid.tp, "pp": grid.pp, "dp": grid.dp},
               "dtype": "float32", "iters": args.iters, "warmup": args.warmup,
               "min_bytes": args.min_bytes, "max_bytes": args.max_bytes,
               "timing": "cuda_events" if use_cuda else "perf_counter",
               "time_s": "slowest rank's mean seconds per call (all_reduce MAX over ranks)",
               "results": results, "skipped": skipped}
        if rank == 0:
            print(table(doc), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(doc, f, indent=1)
    finally:
        dist.destroy_process_group()
    return 0


# --- launching --------------------------------------------------------------------------------
def _strip_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m instrumented_trainer.collbench",
                                description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=None, help="spawn N local processes")
    p.add_argument("--tensor-model-parallel-size", "--tp", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", "--pp", type=int, default=1)
    p.add_argument("--min-bytes", type=parse_size, default=parse_size("8"))
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ops", type=lambda s: [o for o in s.split(",") if o], default=list(OPS),
                   help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--cpu", action="store_true", help="gloo on CPU even if CUDA is present")
    p.add_argument("--out", default=None, help="write the JSON result here (rank 0)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        parser().error(f"unknown op(s) {bad}; choose from {','.join(OPS)}")
    if args.nproc and "RANK" not in os.environ:
        return spawn(args.nproc, _strip_nproc(argv), "collbench", module="instrumented_trainer.collbench",
                     what="collbench")
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
