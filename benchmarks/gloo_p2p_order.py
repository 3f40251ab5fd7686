"""How long a gloo message takes to arrive by the order its two ends are posted in, two ranks of
one intra-op thread each (the pipeline lever's CPU jobs; benchmarks/README.md).

A pipeline stage receives either a message whose receive it posted before the send (it waited on its
neighbour: the only kind in a 1F1B step of one micro-batch) or one sent while it was still computing,
its receive posted after the send (the kind more micro-batches add: the stages compute at once).
Gloo completes the first as soon as the sender writes; the second takes a round of its threads
(the receiver's notice, the sender's thread writing), which need a core beside the compute.

Modes, each N exchanges of one activation-sized message (--hidden x 64 tokens x --micro-batch fp32)
from rank 0 to rank 1, what is timed being rank 1's receive done less the later of the two posts
(both ranks on one monotonic clock):
  recv-first  rank 1 posts its receive and waits; rank 0 computes 2 ms, then sends;
  send-first  rank 0 sends, then computes 3 ms; rank 1 computes 2 ms, then posts its receive;
  both-ways   each rank computes (1 and 2 ms), then posts a send and a receive to the other, as
              pipelining's fused batches do (1F1B's steady state).

    python benchmarks/gloo_p2p_order.py [--n 150] [--repeats 2] [--hidden 128] [--micro-batch 2]
"""
from __future__ import annotations

import argparse
import os
import statistics as st
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("recv-first", "send-first", "both-ways")


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    peer = 1 - rank
    dist.init_process_group("gloo", rank=rank, world_size=2)
    h = args.hidden
    layers = [torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)]
    x = torch.randn(args.micro_batch, 64, h)

    def compute(ms: float) -> None:
        t = time.perf_counter()
        while (time.perf_counter() - t) * 1e3 < ms:
            layers[1](torch.relu(layers[0](x)))

    out_buf, in_buf = torch.randn(args.micro_batch, 64, h), torch.empty(args.micro_batch, 64, h)
    times: dict = {m: [] for m in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            dist.barrier()
            for _ in range(args.n):
                if mode == "recv-first":
                    if rank == 0:
                        compute(2)
                        t = time.monotonic_ns()
                        dist.isend(out_buf, 1).wait()
                    else:
                        t = time.monotonic_ns()
                        dist.irecv(in_buf, 0).wait()
                elif mode == "send-first":
                    if rank == 0:
                        t = time.monotonic_ns()
                        work = dist.isend(out_buf, 1)
                        compute(3)
                        work.wait()
                    else:
                        compute(2)
                        t = time.monotonic_ns()
                        dist.irecv(in_buf, 0).wait()
                else:
                    compute(1 + rank)
                    t = time.monotonic_ns()
                    for w in [dist.isend(out_buf, peer), dist.irecv(in_buf, peer)]:
                        w.wait()
                times[mode].append((t, time.monotonic_ns()))
    both = [None, None]
    dist.all_gather_object(both, times)
    if rank == 1:
        print(f"{args.micro_batch * 64 * h * 4 / 1024:.0f} KiB messages, {args.n * args.repeats} a mode; "
              "rank 1's receive done less the later post, ms:")
        print(f"{'mode':<11} {'median':>7} {'mean':>7} {'p90':>7} {'max':>7}  over 1.5 ms")
        for mode in MODES:
            lat = sorted((done - max(p1, p0)) / 1e6 for (p1, done), (p0, _) in zip(both[1][mode], both[0][mode]))
            print(f"{mode:<11} {st.median(lat):7.3f} {st.mean(lat):7.3f} {lat[int(0.9 * len(lat))]:7.3f} "
                  f"{lat[-1]:7.2f}  {sum(v > 1.5 for v in lat)}/{len(lat)}")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=150, help="exchanges a mode per repeat")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=2)
    args = ap.parse_args()
    if "RANK" in os.environ:
        return worker(args)
    sys.path.insert(0, ROOT)
    from diag.ports import free_port  # noqa: PLC0415 - below the ephemeral range, as the trainer's launcher

    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env={**env, "RANK": str(r)})
             for r in range(2)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
