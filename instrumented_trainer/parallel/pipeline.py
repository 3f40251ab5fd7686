"""Pipeline schedules (1F1B and GPipe) over the micro-batches of one step.

Both follow Megatron-LM's non-interleaved schedules. 1F1B: stage r runs min(p - r - 1, m)
warm-up forwards, then alternates one forward and one backward, then drains the remaining
backwards; GPipe runs all m forwards, then all m backwards. Activations go to the next stage and
their gradients come back by isend/irecv through the instrumented PP group. Where a stage sends
and receives at the same time (steady state of 1F1B), both operations are posted before either is
waited on, which is what keeps neighbouring stages from deadlocking.

Backwards run in micro-batch order in both schedules, so gradients accumulate in the same order
and the two schedules give the same loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class MicroBatch:
    inputs: torch.Tensor  # token ids [b, s]
    labels: torch.Tensor  # next-token ids [b, s]


@dataclass
class PipelineStep:
    """One step of the pipeline for this stage; `run()` returns the stage's micro-batch losses
    (last stage only; unscaled means per micro-batch)."""

    stage: torch.nn.Module
    groups: object  # ParallelGroups
    micro_batches: list[MicroBatch]
    act_shape: tuple[int, ...]
    act_dtype: torch.dtype
    device: torch.device
    loss_scale: float  # 1 / (micro-batches x DP size): summed gradients are the global mean
    before_last_backward: object = None  # callback: the DP sync must know the final backward
    losses: list[float] = field(default_factory=list)
    _backwards_done: int = 0

    # -- point-to-point --------------------------------------------------------------------
    def _buffer(self) -> torch.Tensor:
        return torch.empty(self.act_shape, dtype=self.act_dtype, device=self.device)

    def _exchange(self, send: torch.Tensor | None, send_to: int, recv_from: int | None):
        """Post the send and the receive (either may be absent), then wait for both."""
        handles, buf = [], None
        if send is not None:
            handles.append(self.groups.isend(send.detach().contiguous(),
                                             self.groups.stage_peer(send_to)))
        if recv_from is not None:
            buf = self._buffer()
            handles.append(self.groups.irecv(buf, self.groups.stage_peer(recv_from)))
        for h in handles:
            h.wait()
        return buf

    def recv_forward(self):
        if self.groups.is_first_stage:
            return None
        return self._exchange(None, 0, -1).requires_grad_()

    def send_forward(self, y):
        if not self.groups.is_last_stage:
            self._exchange(y, +1, None)

    def recv_backward(self):
        return None if self.groups.is_last_stage else self._exchange(None, 0, +1)

    def send_backward(self, grad):
        if not self.groups.is_first_stage:
            self._exchange(grad, -1, None)

    def send_forward_recv_backward(self, y):
        return None if self.groups.is_last_stage else self._exchange(y, +1, +1)

    def send_backward_recv_forward(self, grad):
        if self.groups.is_first_stage:
            return None
        return self._exchange(grad, -1, -1).requires_grad_()

    # -- compute ---------------------------------------------------------------------------
    def forward(self, index: int, x):
        mb = self.micro_batches[index]
        out = self.stage(mb.inputs if x is None else x, mb.labels)
        if self.groups.is_last_stage:
            self.losses.append(out.detach())
            return out * self.loss_scale
        return out.to(self.act_dtype)

    def backward(self, x, out, grad_out):
        if self._backwards_done == len(self.micro_batches) - 1 and self.before_last_backward:
            self.before_last_backward()
        self._backwards_done += 1
        torch.autograd.backward(out, grad_tensors=None if grad_out is None else grad_out)
        return None if x is None else x.grad

    # -- schedules -------------------------------------------------------------------------
    def run_gpipe(self) -> list:
        saved = []
        for i in range(len(self.micro_batches)):
            x = self.recv_forward()
            y = self.forward(i, x)
            self.send_forward(y)
            saved.append((x, y))
        for x, y in saved:
            self.send_backward(self.backward(x, y, self.recv_backward()))
        return self.losses

    def run_1f1b(self) -> list:
        m = len(self.micro_batches)
        p, r = self.groups.grid.pp, self.groups.coords.pp_rank
        warmup = min(p - r - 1, m)
        saved = []
        for i in range(warmup):
            x = self.recv_forward()
            y = self.forward(i, x)
            self.send_forward(y)
            saved.append((x, y))
        x = self.recv_forward() if m > warmup else None
        for i in range(m - warmup):
            y = self.forward(warmup + i, x)
            grad_y = self.send_forward_recv_backward(y)
            saved.append((x, y))
            x_old, y_old = saved.pop(0)
            grad_x = self.backward(x_old, y_old, grad_y)
            if i == m - warmup - 1:
                self.send_backward(grad_x)
            else:
                x = self.send_backward_recv_forward(grad_x)
        for _ in range(warmup):
            x_old, y_old = saved.pop(0)
            self.send_backward(self.backward(x_old, y_old, self.recv_backward()))
        return self.losses
