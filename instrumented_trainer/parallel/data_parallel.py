"""Gradient all-reduce across data-parallel replicas, in buckets, optionally overlapped.

Parameters are bucketed in reverse registration order (roughly the order backward produces
their gradients) until a bucket holds at least `bucket_size` elements, so each all-reduce moves a
few large messages instead of many small ones. Without overlap every bucket is reduced after the
pipeline finishes; with `overlap_grad_reduce` a post-accumulate-grad hook counts the gradients of
the *last* micro-batch's backward and launches a bucket's async all-reduce as soon as all of its
gradients are final, so DP communication hides behind the rest of backward (Megatron-LM's
`--overlap-grad-reduce`). `finish()` waits for everything before the optimizer step.

Gradients are not divided here: the pipeline scales each micro-batch loss by
1 / (micro-batches x DP size), so the summed gradient is already the global-batch mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from diag.layout import Axis


@dataclass
class Bucket:
    params: list[torch.nn.Parameter]
    buffer: torch.Tensor
    ready: int = 0
    handle: object = None
    launched: bool = False


@dataclass
class GradSync:
    params: list[torch.nn.Parameter]
    groups: object  # ParallelGroups
    bucket_size: int
    overlap: bool
    buckets: list[Bucket] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.enabled = self.groups.size(Axis.DP) > 1
        self._final = False
        self._bucket_of: dict[int, Bucket] = {}
        if not self.enabled:
            return
        current: list[torch.nn.Parameter] = []
        for p in reversed(self.params):
            current.append(p)
            if sum(q.numel() for q in current) >= self.bucket_size:
                self._add_bucket(current)
                current = []
        if current:
            self._add_bucket(current)
        if self.overlap:
            for p in self.params:
                p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _add_bucket(self, params: list[torch.nn.Parameter]) -> None:
        numel = sum(p.numel() for p in params)
        bucket = Bucket(list(params), torch.zeros(numel, dtype=params[0].dtype,
                                                  device=params[0].device))
        self.buckets.append(bucket)
        for p in params:
            self._bucket_of[id(p)] = bucket

    def start_step(self) -> None:
        self._final = False
        for b in self.buckets:
            b.ready, b.handle, b.launched = 0, None, False

    def mark_last_backward(self) -> None:
        """Called by the pipeline just before the last micro-batch's backward."""
        self._final = True

    def _on_grad_ready(self, param: torch.nn.Parameter) -> None:
        if not self._final:
            return  # an earlier micro-batch: the gradient is still accumulating
        bucket = self._bucket_of[id(param)]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._launch(bucket, async_op=True)

    def _launch(self, bucket: Bucket, async_op: bool) -> None:
        torch.cat([p.grad.reshape(-1) for p in bucket.params], out=bucket.buffer)
        bucket.handle = self.groups.all_reduce(bucket.buffer, Axis.DP, async_op=async_op)
        bucket.launched = True

    def finish(self) -> None:
        """Reduce what is not yet reduced, wait for all buckets, copy results into .grad."""
        if not self.enabled:
            return
        for bucket in self.buckets:
            if not bucket.launched:
                self._launch(bucket, async_op=False)
        for bucket in self.buckets:
            if bucket.handle is not None:
                bucket.handle.wait()
            offset = 0
            for p in bucket.params:
                n = p.numel()
                p.grad.copy_(bucket.buffer[offset:offset + n].view_as(p))
                offset += n
