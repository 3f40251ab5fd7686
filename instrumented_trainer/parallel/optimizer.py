"""The optimizer: AdamW, or AdamW with its states sharded over the data-parallel ranks (ZeRO-1,
Megatron-LM's `--use-distributed-optimizer`).

ZeRO-1 is torch's `ZeroRedundancyOptimizer` on the replicated `dp` group: each DP rank keeps
the Adam states (and runs the update) of its share of the parameters only, then broadcasts the
updated parameters to the other replicas. Gradients are still all-reduced in full by the DP sync
(data_parallel.GradSync); parameters stay replicated. ZeRO-1 partitions whole tensors (largest
first, onto the least loaded rank), so a rank's share is about 1/DP of the states, not exactly.

`ZeroRedundancyOptimizer` broadcasts with plain `torch.distributed` calls, which take no DTensor,
so under tensor parallelism it is handed each parameter's local shard (a view: updating it
updates the DTensor) and, before each step, the gradient's local shard in the parameter's own
placement (DTensor may leave a gradient Partial over TP where the parameter is Replicate; the
redistribution is the TP reduction a DTensor AdamW would do itself). Under pipelining each rank
shards its own stages' parameters over its own DP group.
"""

from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer


def build_optimizer(params: list[torch.nn.Parameter], train, dp_group, dp_size: int,
                    distributed: bool):
    """AdamW(β=0.9, 0.95) over `params`; ZeRO-1 over `dp_group` when `distributed` and DP > 1."""
    kwargs = {"lr": train.lr, "betas": (0.9, 0.95), "weight_decay": train.weight_decay}
    if not distributed or dp_size == 1:
        return torch.optim.AdamW(params, **kwargs)
    return LocalShardZero(params, dp_group, kwargs)


class LocalShardZero:
    """ZeroRedundancyOptimizer over the parameters' local tensors (see the module docstring)."""

    def __init__(self, params: list[torch.nn.Parameter], group, kwargs: dict) -> None:
        self.params = params
        self.locals = [_local(p) for p in params]
        self.zero = ZeroRedundancyOptimizer(self.locals, optimizer_class=torch.optim.AdamW,
                                            process_group=group, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, local in zip(self.params, self.locals):
            p.grad = None
            if local is not p:
                local.grad = None

    def step(self) -> None:
        for p, local in zip(self.params, self.locals):
            if p.grad is not None and local is not p:
                local.grad = _local_grad(p)
        self.zero.step()

    @property
    def state(self) -> dict:
        """This rank's Adam states only (the tensors it updates)."""
        return self.zero.optim.state


def _local(p: torch.Tensor) -> torch.Tensor:
    return p._local_tensor if hasattr(p, "_local_tensor") else p


def _local_grad(p: torch.Tensor) -> torch.Tensor:
    grad = p.grad
    if hasattr(grad, "placements") and tuple(grad.placements) != tuple(p.placements):
        grad = grad.redistribute(p.device_mesh, p.placements)
    return _local(grad)

