#!/usr/bin/env python3
"""How much of an async gloo all-reduce hides behind compute when the ranks share the cores.

Two gloo ranks on this machine, one intra-op thread each (as the trainer runs them). Each round,
both ranks: compute alone (matmuls, ~20 ms), the all-reduce of MB megabytes of fp32 alone, the two
one after the other ("serial"), and the all-reduce started async before the compute and waited
after it ("overlap"). Medians of rank 0 over the rounds, the first 4 left out. A GPU (NCCL on its
own stream) hides the all-reduce up to the compute's length; on a CPU the gloo threads that run it
need the cores the compute uses. The step-time model hides all of an overlapped DP all-reduce
(docs/model.md) where a core is idle; where the run says its ranks take every core (facts.host_cpus,
ranks_per_host, threads_per_rank) it hides none and the dp_overlap rule declines, and where that is
unknown the recommendation says so and is low confidence
(diag/advise/rules.py, benchmarks/README.md).

    python benchmarks/gloo_overlap.py [--mb 4 16] [--rounds 24] [--port 29517]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, port: int, mb: int, rounds: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    a, g = torch.randn(256, 256), torch.randn(mb << 18)

    def compute(n: int) -> None:
        for _ in range(n):
            a @ a

    compute(200)                                  # warm up before sizing the compute
    t = time.perf_counter()
    compute(100)
    n = max(1, int(0.020 / ((time.perf_counter() - t) / 100)))
    res: dict = {"compute": [], "allreduce": [], "serial": [], "overlap": []}
    for _ in range(rounds):
        dist.barrier()
        t = time.perf_counter(); compute(n); res["compute"].append(time.perf_counter() - t)
        dist.barrier()
        t = time.perf_counter(); dist.all_reduce(g); res["allreduce"].append(time.perf_counter() - t)
        dist.barrier()
        t = time.perf_counter(); compute(n); dist.all_reduce(g); res["serial"].append(time.perf_counter() - t)
        dist.barrier()
        t = time.perf_counter()
        work = dist.all_reduce(g, async_op=True)
        compute(n)
        work.wait()
        res["overlap"].append(time.perf_counter() - t)
    if rank == 0:
        q.put({k: statistics.median(v[4:]) for k, v in res.items()})
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    print("| all-reduce | compute | all-reduce alone | serial | overlapped | hidden |\n|---|---|---|---|---|---|")
    for mb in a.mb:
        q = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(r, a.port, mb, a.rounds, q)) for r in range(2)]
        for p in procs:
            p.start()
        m = q.get()
        for p in procs:
            p.join()
        hidden = (m["serial"] - m["overlap"]) / m["allreduce"] if m["allreduce"] > 0 else float("nan")
        print(f"| {mb} MB | {m['compute'] * 1e3:.1f} ms | {m['allreduce'] * 1e3:.1f} ms | {m['serial'] * 1e3:.1f} ms "
              f"| {m['overlap'] * 1e3:.1f} ms | {100 * hidden:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
