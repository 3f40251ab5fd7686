"""Tensor (and sequence) parallelism of a GPT stage with torch.distributed.tensor.parallel.

The plan is Megatron-LM's, written as DTensor parallel styles the way torchtitan writes its own:
QKV and the first MLP layer column-parallel, the attention projection and the second MLP layer
row-parallel, the token embedding vocabulary-parallel (row-wise over the vocabulary), the output
layer column-parallel over the vocabulary with its logits gathered for the loss. Without
sequence parallelism each row-parallel output is all-reduced; with `--sequence-parallel` the
residual stream is split over the sequence: LayerNorms run on a sequence shard
(`SequenceParallel`), the row-parallel outputs are reduce-scattered and the column-parallel
inputs all-gathered, as Megatron does. Between modules the residual stream is a plain local
tensor (torchtitan's convention), so the pipeline sends ordinary tensors.

Parameters that no style shards (LayerNorms without SP, the position embedding) are replicated
DTensors (`Replicated`), so the optimizer and FSDP see one kind of parameter.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               parallelize_module)


class Replicated(ParallelStyle):
    """Parameters replicated over the TP mesh (DTensor); local tensors in, local tensors out,
    the output optionally sliced to `output_layout` (no communication: a slice of a replica)."""

    def __init__(self, output_layout=None) -> None:
        super().__init__()
        self.output_layout = output_layout

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        def to_dtensor(_mod, inputs, mesh):
            return tuple(DTensor.from_local(t, mesh, [Replicate()], run_check=False)
                         if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) else t
                         for t in inputs)

        def to_local(_mod, out, _mesh):
            if self.output_layout is not None:
                out = out.redistribute(placements=[self.output_layout])
            return out.to_local()

        return distribute_module(module, device_mesh, None, input_fn=to_dtensor,
                                 output_fn=to_local)


def _block_plan(sp: bool) -> dict:
    """One transformer layer: Megatron's column/row split, with or without SP."""
    residual = Shard(1) if sp else Replicate()
    plan = {
        "ln1": SequenceParallel() if sp else Replicated(),
        "ln2": SequenceParallel() if sp else Replicated(),
        "attention.qkv": ColwiseParallel(),
        "attention.proj": RowwiseParallel(output_layouts=residual),
        "mlp.fc1": ColwiseParallel(),
        "mlp.fc2": RowwiseParallel(output_layouts=residual),
    }
    if sp:  # the norms' sequence shards are gathered once for each column-parallel input
        plan["attention"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                               desired_input_layouts=(Replicate(),))
        plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                         desired_input_layouts=(Replicate(),))
    return plan


def _ends_plan(stage: nn.Module, sp: bool) -> dict:
    """Embeddings (first stage) and final norm + output layer (last stage)."""
    residual = Shard(1) if sp else Replicate()
    plan = {}
    if stage.embeddings is not None:
        plan["embeddings.token"] = RowwiseParallel(input_layouts=Replicate(),
                                                   output_layouts=residual)
        plan["embeddings.position"] = Replicated(Shard(0) if sp else None)
    if stage.head is not None:
        plan["final_ln"] = SequenceParallel() if sp else Replicated()
        plan["head"] = ColwiseParallel(input_layouts=residual, output_layouts=Replicate())
    return plan


def apply_tensor_parallel(stage: nn.Module, tp_mesh, sequence_parallel: bool) -> None:
    """Shard `stage` over `tp_mesh` in place. Weights are sliced locally (src_data_rank=None):
    every rank built the same full weights, so nothing needs to be sent at start-up."""
    plan = _ends_plan(stage, sequence_parallel)
    for name in stage.layers:
        plan.update({f"layers.{name}.{k}": v for k, v in _block_plan(sequence_parallel).items()})
    parallelize_module(stage, tp_mesh, plan, src_data_rank=None)
