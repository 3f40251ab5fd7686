"""One rank of gloo under the trainer's TapSwitch (run by test_telemetry through run_workers):
six steps, each an async all-reduce waited through the log, the tap on for steps 2 and 3 only.
Records which steps' collectives the log saw, and whether a dispatch mode was active per step."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _get_current_dispatch_mode

from instrumented_trainer.telemetry.comm import CommLog
from instrumented_trainer.telemetry.commtap import CommTap, TapSwitch
from tests.trainer.worker_exit import finish


def main(out: str) -> None:
    dist.init_process_group("gloo")       # one rank: run by runner.run_workers
    group = dist.group.WORLD
    comm = CommLog(0, os.path.join(out, "comm.jsonl"))
    modes = []
    with TapSwitch(comm, {group.group_name: ("dp", [0])}, always=False, steps=range(2, 4)) as tap:
        for step in range(6):
            comm.step = step
            tap.at_step(step)
            modes.append(type(_get_current_dispatch_mode()).__name__ if _get_current_dispatch_mode() else None)
            comm.wait(dist.all_reduce(torch.ones(4), async_op=True))
            comm.flush()
    modes.append(type(_get_current_dispatch_mode()).__name__ if _get_current_dispatch_mode() else None)
    held_at_exit = list(comm.held)
    comm.close()
    records = [json.loads(line) for line in open(os.path.join(out, "comm.jsonl"))]
    with open(os.path.join(out, "rank-0.json"), "w") as f:
        json.dump({"modes": modes, "records": records, "held_at_exit": held_at_exit,
                   "tap_class": CommTap.__name__}, f)
    finish()


if __name__ == "__main__":
    main(sys.argv[1])
