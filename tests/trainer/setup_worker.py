"""One rank of a job that is set up as the trainer sets it up (train.set_up), runs two steps and
writes what the tests need to `<out>/rank-<r>.json`: the bytes of its optimizer states and of
its parameters' local shards, and each mesh dimension's process-group timeout.

    python -m tests.trainer.setup_worker OUT TRAINER-FLAGS...   (RANK, WORLD_SIZE, ... set)
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

from instrumented_trainer.cli import build_parser, job_from_args
from instrumented_trainer.parallel.mesh import MESH_AXES, group_timeout
from instrumented_trainer.telemetry.memory import state_tensors, storage_bytes
from instrumented_trainer.train import set_up, train_step
from tests.trainer.worker_exit import finish


def main(out: str, argv: list[str]) -> None:
    args = build_parser().parse_args(["--out", out, "--no-comm-log", *argv])
    job = job_from_args(args, int(os.environ["WORLD_SIZE"]), [])
    s = set_up(job)
    for step in range(2):
        train_step(job, step, s.pipe, s.mesh, s.optimizer, s.grad_sync, s.comm, s.runtime)
    record = {
        "rank": s.rank, "coords": {a: s.mesh.coords[a] for a in MESH_AXES},
        "state_bytes": storage_bytes(state_tensors(s.optimizer)),
        "state_tensors": len(state_tensors(s.optimizer)),
        "param_bytes": storage_bytes(s.params), "param_tensors": len(s.params),
        "timeouts": {a: group_timeout(s.mesh.group(a)).total_seconds() for a in MESH_AXES},
        "default_timeout": group_timeout(dist.group.WORLD).total_seconds(),
    }
    with open(os.path.join(out, f"rank-{s.rank}.json"), "w", encoding="utf-8") as f:
        json.dump(record, f)
    dist.barrier()
    finish()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
