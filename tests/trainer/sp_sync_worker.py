"""One of two gloo ranks timing the trainer's start-up probe of what a gradient left Partial over TP costs the
optimizer (telemetry.run_metadata.sp_grad_sync), run by test_telemetry through run_workers:

  sleeper    an optimizer whose step sleeps SLEEP_S for each parameter whose gradient is Partial and does
             nothing else: the probe must read SLEEP_S a parameter (its arithmetic: Partial less Replicate, the
             median step, per parameter);
  adamw      the trainer's AdamW, whose reads of a partial gradient each reduce it over TP: a positive figure,
             and the number of TP all-reduces one of its steps makes per partial parameter (AdamW's reads,
             counted in a profile of the step);
  tp1        a TP mesh of one rank: None, nothing timed;
  broken     an optimizer factory that raises: None and a warning, the process goes on."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate

from instrumented_trainer.telemetry.run_metadata import sp_grad_sync
from tests.trainer.worker_exit import finish

SLEEP_S = 4e-3


class Sleeper:
    def __init__(self, params):
        self.params = params

    def step(self):
        for p in self.params:
            if any(pl.is_partial() for pl in p.grad.placements):
                time.sleep(SLEEP_S)


def broken(params):
    raise RuntimeError("no optimizer here")


def adamw_reductions(mesh) -> int:
    """TP all-reduces one AdamW step makes for one parameter with a Partial gradient: the functional
    collective DTensor's redistribution calls, counted in a profile of the step."""
    p = torch.nn.Parameter(DTensor.from_local(torch.zeros(8), mesh, [Replicate()]))
    opt = torch.optim.AdamW([p], lr=1e-3)
    p.grad = DTensor.from_local(torch.ones(8), mesh, [Partial()])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    return sum(e.name == "_c10d_functional::all_reduce" for e in prof.events())


def main(out: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    tp = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))["tp"]
    one = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))["tp"]
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)   # noqa: E731
    rec = {"sleeper": sp_grad_sync(tp, Sleeper, False), "adamw": sp_grad_sync(tp, adamw, False),
           "adamw_reductions": adamw_reductions(tp), "tp1": sp_grad_sync(one, adamw, False),
           "broken": sp_grad_sync(tp, broken, False), "sleep_s": SLEEP_S}
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(rec, f)
    finish()


if __name__ == "__main__":
    main(sys.argv[1])
