"""One rank of gloo under the trainer's CommTap (run by test_telemetry through run_workers): a synchronous all-gather
waited inside c10d (as FSDP2's are) and an async all-reduce waited through the tap; what the CPU
allocator still holds after the all-gather's tensors are dropped, from the profiler's allocation
events (the trainer's own measure of memory on CPU)."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from instrumented_trainer.telemetry.comm import CommLog
from instrumented_trainer.telemetry.commtap import CommTap
from tests.trainer.worker_exit import finish

ELEMENTS = 1 << 20        # 4 MiB of fp32 in, 4 MiB out
GLOO_SETTLE_S = 1.0       # gloo's worker thread drops its own reference to a finished Work a moment later


def allocated_after(prof) -> int:
    """`Total Allocated` at the last CPU allocation event: the bytes allocated in the profiled
    region and still alive."""
    from torch._C._profiler import _ExtraFields_Allocation

    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if isinstance(e.extra_fields, _ExtraFields_Allocation) and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.total_allocated))
    return max(events)[1]


def main(out: str) -> None:
    dist.init_process_group("gloo")       # one rank: run by runner.run_workers
    group = dist.group.WORLD
    comm = CommLog(0, os.path.join(out, "comm.jsonl"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        with CommTap(comm, {group.group_name: ("dp_shard", [0])}):
            output, inp = torch.empty(ELEMENTS), torch.ones(ELEMENTS)
            dist.all_gather_into_tensor(output, inp)        # waited by c10d, not the tap (as FSDP2's)
            del output, inp
            time.sleep(GLOO_SETTLE_S)
            x = torch.ones(4)                               # the next op the tap sees
            comm.wait(dist.all_reduce(x, async_op=True))    # waited through the tap
            del x
            torch.zeros(1)
    # NCCL coalesces a batch of sends and receives: each op dispatched gets no Work, the batch one
    # (gloo cannot coalesce, so the Work-less ops are made so here): both timed by the batch's Work;
    # a Work-less op outside any batch has no wait to time it by, so no duration.
    # The Works the log is not given are kept and waited before the group goes: gloo's worker
    # threads must not be running one when destroy_process_group tears it down (a CI run once
    # ended in "terminate called without an active exception" here).
    with comm.p2p_batch() as bind:
        works = [comm.launched(op, "pp", [0], 16, lambda: dist.all_reduce(torch.ones(4), async_op=True),
                               lambda _out: None) for op in ("send", "recv")]
        batch_work = dist.all_reduce(torch.ones(4), async_op=True)
        bind([batch_work])
    comm.wait(batch_work)
    works.append(comm.launched("broadcast", "pp", [0], 16,
                               lambda: dist.broadcast(torch.ones(4), 0, async_op=True), lambda _out: None))
    for work in works:
        work.wait()
    comm.close()
    records = [json.loads(line) for line in open(os.path.join(out, "comm.jsonl"))]
    with open(os.path.join(out, "rank-0.json"), "w") as f:
        json.dump({"allocated_after": allocated_after(prof), "records": records}, f)
    finish()


if __name__ == "__main__":
    main(sys.argv[1])
