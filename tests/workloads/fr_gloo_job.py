"""A 4-rank gloo job on a DeviceMesh (dp 2 × tp 2) that leaves Flight Recorder dumps.

Each step runs a TP all-reduce and a DP all-reduce (async, as gradient buckets are). With
--skip-rank R --skip-step K, rank R skips its DP all-reduce of step K (and everything after), so
its DP peer waits in it: a hang. With --plain the groups come from dist.new_group() with no
description, as a script that knows nothing of meshes makes them. Every rank then dumps its buffer twice, as JSON
(`_dump_fr_trace_json`, rank-<r>.json) and as PyTorch's pickle (`_dump_fr_trace`, pickle/rank_<r>),
and exits without waiting. Used by tests/test_flightrec.py.
"""
import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh


def run(rank: int, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), TORCH_FR_BUFFER_SIZE="1000")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=4)
    if args.plain:           # new_group() with no description: nothing names an axis
        tps, dps = [dist.new_group([0, 1]), dist.new_group([2, 3])], [dist.new_group([0, 2]), dist.new_group([1, 3])]
        tp, dp = tps[rank // 2], dps[rank % 2]
    else:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp, dp = mesh["tp"].get_group(), mesh["dp"].get_group()
    done = threading.Event()
    threading.Thread(target=dump_when_done, args=(rank, args.out, done), daemon=True).start()
    grads, act = torch.ones(4096), torch.ones(256)
    try:
        for step in range(args.steps):
            dist.all_reduce(act, group=tp)
            if rank == args.skip_rank and step >= args.skip_step:
                break
            work = dist.all_reduce(grads, group=dp, async_op=True)
            if step < args.skip_step:
                work.wait()
    except RuntimeError:
        pass                 # a peer that has dumped and left: this rank dumps all the same
    done.set()
    time.sleep(60)           # blocked ranks never get here; the dumper ends the process


def dump_when_done(rank: int, out: str, done: threading.Event) -> None:
    """Every rank dumps about when the others do: when its loop ends, or after a deadline while
    blocked in a collective (the hang). Then the process ends without waiting for anything."""
    done.wait(timeout=8.0)
    time.sleep(1.0)
    c10d = torch._C._distributed_c10d
    with open(os.path.join(out, f"rank-{rank}.json"), "wb") as f:
        f.write(c10d._dump_fr_trace_json(True, False))
    with open(os.path.join(out, "pickle", f"rank_{rank}"), "wb") as f:
        f.write(c10d._dump_fr_trace(True, True, False))
    os._exit(0)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--skip-rank", type=int, default=-1)
    p.add_argument("--skip-step", type=int, default=1 << 30)
    p.add_argument("--port", type=int, default=29741)
    p.add_argument("--plain", action="store_true", help="groups from dist.new_group(), no DeviceMesh")
    a = p.parse_args()
    os.makedirs(os.path.join(a.out, "pickle"), exist_ok=True)
    mp.spawn(run, args=(a,), nprocs=4)
