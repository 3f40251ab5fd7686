"""Sees the collectives torch issues on the trainer's behalf, and hands them to the CommLog.

DTensor redistributions, pipelining's sends and receives, FSDP2's all-gathers and reduce-scatters
and our own DP all-reduces all reach c10d through the dispatcher as `_c10d_functional.*` (async
functional collectives, waited by `wait_tensor`) or `c10d.*` ops (returning a `Work`). A
`TorchDispatchMode` sees every one of them, whoever issued it, with its process group, so each
can be labelled with its mesh axis and timed; no collective of torch's is reimplemented.

What it costs: one Python call per dispatched op while training (DTensor already pays several).
It lets DTensor ops through untouched (`NotImplemented`), so they desugar into local ops and
collectives first and the tap sees those, as torch's own CommDebugMode does.

Waits: a functional collective's is its `wait_tensor`, seen here. A `Work` is waited in Python;
ours call `CommLog.wait`, and pipelining's (`schedules._wait_batch_p2p`, a private function of
torch 2.11-2.13) is wrapped by `time_pipeline_waits` so a pipeline stage's time blocked on its
neighbours is measured. On NCCL a batch of sends and receives is coalesced: each op dispatched
gets no Work, the batch one; `schedules._batch_p2p` is wrapped so that Work times the batch's
ops. If `_wait_batch_p2p` is missing on another torch, one warning: the transfers are still
logged, their durations unknown.
"""

from __future__ import annotations

import torch
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from .safe import guard, warn_once

# dispatcher op name -> the op name diag's labels use
_OPS = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast": "broadcast", "broadcast_": "broadcast",
    "all_to_all_single": "all_to_all", "alltoall_base_": "all_to_all", "alltoall_": "all_to_all",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
}
_NAMESPACES = ("_c10d_functional", "c10d")
_PROCESS_GROUP = torch._C._distributed_c10d.ProcessGroup
_WORK = torch._C._distributed_c10d.Work


def _nbytes(arg) -> int:
    if isinstance(arg, torch.Tensor):
        return arg.numel() * arg.element_size()
    if isinstance(arg, (list, tuple)):
        return sum(_nbytes(a) for a in arg)
    return 0


def message_bytes(namespace: str, op: str, args, n: int) -> int:
    """S as nccl-tests counts it, the size diag reads from the traces (diag.analysis.bandwidth.
    message_bytes): an all_gather's whole output, a reduce_scatter's whole input, else the buffer
    handed over. `c10d.*` ops are given output and input (the larger is the whole); a functional
    all_gather only its input (this rank's share: times n)."""
    sizes = [_nbytes(a) for a in args[:2] if isinstance(a, (torch.Tensor, list, tuple))]
    if not sizes:
        return 0
    if op == "all_gather" and namespace == "_c10d_functional":
        return sizes[0] * n
    return max(sizes) if op in ("all_gather", "reduce_scatter") else sizes[0]


class CommTap(TorchDispatchMode):
    """Active around training; `groups` maps a process-group name to (axis, member ranks)."""

    def __init__(self, comm, groups: dict[str, tuple[str, list[int]]]) -> None:
        super().__init__()
        self.comm, self.groups = comm, groups

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.comm.held:  # the caller has the Works launched before this op by now
            self.comm.let_go()
        if DTensor in types or AsyncCollectiveTensor in types:
            return NotImplemented  # let the subclass desugar into ops this mode then sees
        if func.namespace not in _NAMESPACES:
            return func(*args, **kwargs)
        name = func._opname
        if name == "wait_tensor":  # closes the timing of the collective that made args[0]
            return self.comm.wait(args[0], lambda: func(*args, **kwargs))
        op = _OPS.get(name)
        group = self._group(args, kwargs) if op else None
        if group is None:
            return func(*args, **kwargs)
        axis, ranks = group
        return self.comm.launched(op, axis, ranks, message_bytes(func.namespace, op, args, len(ranks)),
                                  lambda: func(*args, **kwargs), self._wait_key)

    def _group(self, args, kwargs):
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, str) and a in self.groups:
                return self.groups[a]
            if isinstance(a, torch.ScriptObject):
                try:
                    name = _PROCESS_GROUP.unbox(a).group_name
                except RuntimeError:
                    continue
                return self.groups.get(name)
        return None

    @staticmethod
    def _wait_key(out):
        """What the wait will name: the Work (the Python object pybind hands the caller, kept
        alive so it stays the same object), else the functional collective's output tensor."""
        for o in (out if isinstance(out, (list, tuple)) else (out,)):
            if isinstance(o, torch.ScriptObject):
                try:
                    return _WORK.unbox(o)
                except RuntimeError:
                    continue
        return out[0] if isinstance(out, (list, tuple)) else out


def time_pipeline_waits(comm) -> None:
    """Route pipelining's waits on its send/recv Works through `comm.wait` (see module doc)."""
    from torch.distributed.pipelining import schedules  # noqa: PLC0415

    original = getattr(schedules, "_wait_batch_p2p", None)
    if original is None or getattr(original, "_diag_timed", False):
        if original is None:
            warn_once("pipeline wait timing", RuntimeError(
                "torch.distributed.pipelining.schedules._wait_batch_p2p not found: pipeline "
                "transfers logged without durations"))
        return

    def wait_batch_p2p(work):
        for w in (work if isinstance(work, (list, tuple)) else [work]):
            comm.wait(w)

    wait_batch_p2p._diag_timed = True
    schedules._wait_batch_p2p = wait_batch_p2p

    batch = getattr(schedules, "_batch_p2p", None)
    if batch is None:
        return

    def batch_p2p(*args, **kwargs):
        with comm.p2p_batch() as bind:
            works = batch(*args, **kwargs)
            bind(works)
        return works

    schedules._batch_p2p = batch_p2p


class TapSwitch:
    """The tap, on only for the steps that need it.

    A dispatch mode costs every op one Python call (~5 us on this CPU: a no-op mode took a loop
    of 6,000 small ops from 68 to 101 ms), and a tiny model's step is mostly such ops: with the tap
    in every step, benchmarks/trainer_overhead.py measured a PP 2 tiny job's step 2.43x and a TP 2
    one's 1.15x what they take untapped (docs/trainer.md, "Overhead"). So it runs in every
    step only where its timings are read every step (the comm log file, the live exporter), and
    otherwise in the profiler's warmup and active steps, whose trace it labels; the other steps
    run untapped. `always`: every step; `steps`: the steps (loop indices) it runs in besides.
    If it cannot start, one warning and training goes on unlabelled."""

    def __init__(self, comm, groups: dict, always: bool, steps: range = range(0)) -> None:
        self.comm, self.groups, self.always, self.steps = comm, groups, always, steps
        self.tap = None
        self.broken = False
        if always or len(steps):
            with guard("communication tap"):
                time_pipeline_waits(comm)

    def at_step(self, step: int) -> None:
        """Before step `step`: the tap on if the step needs it, else off."""
        self._set(self.always or step in self.steps)

    def _set(self, on: bool) -> None:
        if on and self.tap is None and not self.broken:
            with guard("communication tap"):
                tap = CommTap(self.comm, self.groups)
                tap.__enter__()
                self.tap = tap
            self.broken = self.tap is None
        elif not on and self.tap is not None:
            tap, self.tap = self.tap, None
            with guard("communication tap"):
                tap.__exit__(None, None, None)
            # the Works it still held strongly "until its next op": that op may be steps away
            self.comm.let_go()

    def close(self) -> None:
        self._set(False)

    def __enter__(self) -> "TapSwitch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
