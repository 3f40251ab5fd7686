"""Replicated data parallelism: gradients all-reduced across replicas, in buckets, optionally
overlapped with backward (Megatron-LM's DDP; torch's DistributedDataParallel does not compose with
DTensor tensor parallelism, and torchtitan refuses DDP with more than one mesh dimension).

Parameters are bucketed in reverse registration order (roughly the order backward produces
their gradients) until a bucket holds at least `bucket_size` elements, so each all-reduce moves a
few large messages instead of many small ones. Without overlap every bucket is reduced after the
pipeline finishes; with `overlap_grad_reduce` a post-accumulate-grad hook counts each parameter's
gradient accumulations (one per micro-batch backward of its stage) and launches a bucket's async
all-reduce as soon as all of its gradients are final, so DP communication hides behind the rest of backward (Megatron-LM's
`--overlap-grad-reduce`). `finish()` waits for everything before the optimizer step.

Gradients are not divided here: the pipeline scales each micro-batch loss by
1 / (micro-batches x DP size), so the summed gradient is already the global-batch mean. Under
tensor parallelism a gradient is a DTensor; its local shard is what the replicas reduce (the
same shard on every replica). The all-reduces go through `torch.distributed` on the mesh's `dp`
group; the communication log sees them and `CommLog.wait` closes their timing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Bucket:
    params: list[torch.nn.Parameter]
    buffer: torch.Tensor | None = None
    ready: int = 0
    handle: object = None
    launched: bool = False


@dataclass
class GradSync:
    params: list[torch.nn.Parameter]
    group: object  # the mesh's dp ProcessGroup
    dp_size: int
    bucket_size: int
    overlap: bool
    accumulations: int  # gradient accumulations per step (micro-batches per stage)
    comm: object  # CommLog: waits go through it so their time is logged
    buckets: list[Bucket] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.enabled = self.dp_size > 1
        self._seen: dict[int, int] = {}
        self._bucket_of: dict[int, Bucket] = {}
        if not self.enabled:
            return
        current: list[torch.nn.Parameter] = []
        for p in reversed(self.params):
            current.append(p)
            if sum(_local(q).numel() for q in current) >= self.bucket_size:
                self._add_bucket(current)
                current = []
        if current:
            self._add_bucket(current)
        if self.overlap:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _add_bucket(self, params: list[torch.nn.Parameter]) -> None:
        bucket = Bucket(list(params))
        self.buckets.append(bucket)
        for p in params:
            self._bucket_of[id(p)] = bucket

    def start_step(self) -> None:
        self._seen.clear()
        for b in self.buckets:
            b.ready, b.handle, b.launched = 0, None, False

    def _on_grad_ready(self, param: torch.nn.Parameter) -> None:
        seen = self._seen[id(param)] = self._seen.get(id(param), 0) + 1
        if seen < self.accumulations:
            return  # an earlier micro-batch: the gradient is still accumulating
        bucket = self._bucket_of[id(param)]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._launch(bucket)

    def _launch(self, bucket: Bucket) -> None:
        # a fresh buffer: a gradient's placement (so its local size) may differ from its
        # parameter's (DTensor leaves an embedding's gradient partial over TP)
        bucket.buffer = torch.cat([_local(p.grad).reshape(-1) for p in bucket.params])
        bucket.handle = dist.all_reduce(bucket.buffer, group=self.group, async_op=True)
        bucket.launched = True

    def finish(self) -> None:
        """Reduce what is not yet reduced, wait for all buckets, copy results into .grad."""
        if not self.enabled:
            return
        for bucket in self.buckets:
            if not bucket.launched:
                self._launch(bucket)
        for bucket in self.buckets:
            self.comm.wait(bucket.handle)
            offset = 0
            for p in bucket.params:
                grad = _local(p.grad)
                grad.copy_(bucket.buffer[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (a view: writing it writes the DTensor), else `t`."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def apply_fsdp(stage: torch.nn.Module, dp_mesh, strategy: str) -> None:
    """Sharded data parallelism with FSDP2 (`fully_shard`), per transformer layer and then the
    stage's root, as torchtitan wraps it. `optim_grads_params` (ZeRO-3) reshards parameters after
    forward and gathers them again for backward; `optim_grads` (ZeRO-2) keeps them unsharded
    from forward to backward. On a 2D mesh (replicas x shards) it is HSDP. FSDP2 averages the
    gradients over the data-parallel ranks (a divide factor of 1 needs PREMUL_SUM, which gloo
    lacks), so the loss is not scaled by the DP size in this case (see pipeline.py)."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    reshard = strategy == "optim_grads_params"
    for block in stage.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
    fully_shard(stage, mesh=dp_mesh, reshard_after_forward=reshard)
