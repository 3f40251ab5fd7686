"""Pipeline parallelism with torch.distributed.pipelining: this rank's stages and its schedule.

The model is cut into p x v stages (`ParallelConfig.stage_layers`: even, or Megatron's uneven
first/last stages); pipeline rank r holds stages r, r + p, ... (Megatron's interleaving) or, for
the V-shaped zero-bubble schedules, stages r and 2p - 1 - r. Each stage is a `PipelineStage` on
the mesh's `pp` group and the schedule is torch's own: GPipe, 1F1B, interleaved 1F1B, and the
zero-bubble schedules (interleaved ZB1P, ZBV, DualPipeV). A job without pipeline parallelism
runs the same way, as one stage under its schedule (the default 1F1B: each micro-batch's forward,
then its backward, one in flight; GPipe: every forward, then every backward).

Gradients are not rescaled by the schedule (`scale_grads=False`): the loss of each micro-batch is
multiplied by 1 / (micro-batches x DP size) in `loss_fn`, so the summed gradient is already the
global-batch mean before any DP reduction starts (which may begin during backward). Under FSDP2,
which averages over the DP ranks itself, the factor is 1 / micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.distributed import pipelining as pp

from instrumented_trainer.config import JobConfig

SCHEDULE_CLASSES = {
    "gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "zb1p": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}


@dataclass
class Pipeline:
    """This rank's stage modules and the schedule that runs one step over them."""

    modules: list[torch.nn.Module]
    stages: list
    schedule: object
    loss_scale: float
    losses: list = field(default_factory=list)

    @property
    def has_first(self) -> bool:
        return any(s.is_first for s in self.stages)

    @property
    def has_last(self) -> bool:
        return any(s.is_last for s in self.stages)

    def step(self, inputs: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """One step over the micro-batches; the last stage's unscaled per-micro-batch losses.

        The outputs are not returned (`return_outputs=False`): returned, the last stage keeps every
        micro-batch's logits to the step's end and concatenates them, global batch x sequence x
        vocabulary elements the loop never reads (1 GiB of an H200 run's 1.8 GiB peak at global
        batch 16, sequence 512, vocabulary 32,000: benchmarks/README.md)."""
        losses: list[torch.Tensor] = []
        kwargs = {"target": labels, "losses": losses} if self.has_last else {}
        args = (inputs,) if self.has_first else ()
        self.schedule.step(*args, return_outputs=False, **kwargs)
        return [loss.detach() / self.loss_scale for loss in losses]


def build_pipeline(job: JobConfig, make_stage, pp_group, pp_rank: int, device) -> Pipeline:
    """`make_stage(layers, first, last)` builds (and parallelises) one stage module."""
    par, n_layers = job.parallel, job.model.num_layers
    layers = par.stage_layers(n_layers)
    n_stages = len(layers)
    modules, stages = [], []
    for sid in par.rank_stages(pp_rank, n_layers):
        module = make_stage(layers[sid], sid == 0, sid == n_stages - 1)
        modules.append(module)
        stages.append(pp.PipelineStage(module, sid, n_stages, device, group=pp_group))
    scale = 1.0 / (job.num_micro_batches * (1 if par.sharded else par.dp_size))

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return loss * scale

    cls = getattr(pp, SCHEDULE_CLASSES[job.pipeline_schedule])
    multi = job.pipeline_schedule not in ("gpipe", "1f1b")
    schedule = cls(stages if multi else stages[0], n_microbatches=job.num_micro_batches,
                   loss_fn=loss_fn, scale_grads=False)
    return Pipeline(modules, stages, schedule, scale)
