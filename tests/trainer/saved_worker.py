"""One rank of a TP job that builds its stage as the trainer does (GPTStage, then the TP plan of
`apply_tensor_parallel`), runs one forward of one micro-batch and writes to `<out>/rank-<r>.json`
the bytes autograd saved for backward (each storage once; a DTensor's local shard).

    python -m tests.trainer.saved_worker OUT TRAINER-FLAGS...   (RANK, WORLD_SIZE, ... set)
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from instrumented_trainer.cli import build_parser, job_from_args
from instrumented_trainer.model import GPTStage
from instrumented_trainer.parallel.tensor_parallel import apply_tensor_parallel
from tests.trainer.worker_exit import finish


def main(out: str, argv: list[str]) -> None:
    world = int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=world)
    job = job_from_args(build_parser().parse_args(["--out", out, *argv]), world, [])
    stage = GPTStage(job.model, range(job.model.num_layers), True, True, job.train.seed)
    apply_tensor_parallel(stage, init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)),
                          job.parallel.sequence_parallel)
    storages: dict[int, int] = {}

    def pack(t):
        local = getattr(t, "_local_tensor", t)
        storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, job.model.vocab_size, (job.train.micro_batch_size, job.model.seq_length))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stage(ids)
    with open(os.path.join(out, f"rank-{dist.get_rank()}.json"), "w", encoding="utf-8") as f:
        json.dump({"saved_bytes": sum(storages.values())}, f)
    dist.barrier()
    finish()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
