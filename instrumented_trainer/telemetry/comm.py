"""The one door every collective and point-to-point transfer goes through.

The analyser needs to know, for each communication in a trace, which parallel axis it served and
how many bytes it moved; gloo and NCCL traces do not say which of our process groups is TP, PP or
DP. So each call is wrapped in a profiler range named

    diag:comm:<axis>:<op>:<bytes>      e.g. diag:comm:tp:all_reduce:65536

and timed into `<out>/comm-rank-<r>.jsonl` (op, axis, group ranks, bytes, wall-clock start,
duration). On GPU the timing uses CUDA events that are read only at `flush()` (step end), so the
hot path never synchronises; on CPU it uses time.perf_counter. Async operations are timed from
launch to the end of `wait()`.

Each operation's *exposed* time is also kept (for the live Prometheus metrics): the time the
training thread (CPU) or the compute stream (GPU) stood still for it -- the whole call for a
blocking collective, only the `wait()` for an async one. `last_step` holds the resolved
operations of the step just flushed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .safe import JsonlWriter, guard

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


@dataclass
class _Pending:
    """One timed operation whose end is not yet known or not yet read."""

    record: dict
    t0: float = 0.0
    t_wait: float | None = None  # async: when wait() began (CPU)
    start_event: object = None
    wait_event: object = None  # async: recorded when wait() began (GPU)
    end_event: object = None
    exposed: float = 0.0
    done: bool = False


@dataclass
class Handle:
    """An in-flight async operation; `wait()` finishes it and closes its timing."""

    work: object
    pending: _Pending | None
    log: "CommLog"

    def wait(self) -> None:
        self.log._begin_wait(self.pending)
        self.work.wait()
        self.log._close(self.pending)


@dataclass
class CommLog:
    """Labels and times communication for one rank; `enabled=False` keeps only the labels."""

    rank: int
    path: str | None
    cuda: bool = False
    step: int = 0
    timed: bool = False  # time operations even without a file (the live exporter reads them)
    _pending: list[_Pending] = field(default_factory=list)
    last_step: list[dict] = field(default_factory=list)  # resolved records of the last flush

    def __post_init__(self) -> None:
        self._writer = JsonlWriter(self.path, "comm log") if self.path else None

    # -- the collectives -------------------------------------------------------------------
    def all_reduce(self, tensor, axis, group, ranks, op="sum", async_op=False):
        return self._run("all_reduce", tensor, axis, ranks, async_op,
                         lambda: dist.all_reduce(tensor, op=_REDUCE_OPS[op], group=group,
                                                 async_op=async_op))

    def all_gather(self, outputs, tensor, axis, group, ranks, async_op=False):
        return self._run("all_gather", tensor, axis, ranks, async_op,
                         lambda: dist.all_gather(outputs, tensor, group=group, async_op=async_op))

    def broadcast(self, tensor, src, axis, group, ranks, async_op=False):
        return self._run("broadcast", tensor, axis, ranks, async_op,
                         lambda: dist.broadcast(tensor, src=src, group=group, async_op=async_op))

    def isend(self, tensor, dst, axis, group, ranks):
        return self._run("send", tensor, axis, ranks, True,
                         lambda: dist.isend(tensor, dst=dst, group=group), peer=dst)

    def irecv(self, tensor, src, axis, group, ranks):
        return self._run("recv", tensor, axis, ranks, True,
                         lambda: dist.irecv(tensor, src=src, group=group), peer=src)

    # -- timing ----------------------------------------------------------------------------
    def _run(self, op, tensor, axis, ranks, async_op, launch, peer=None):
        nbytes = tensor.numel() * tensor.element_size()
        pending = self._open(op, axis, ranks, nbytes, peer)
        with torch.profiler.record_function(f"diag:comm:{axis}:{op}:{nbytes}"):
            work = launch()
        if async_op:
            return Handle(work, pending, self)
        self._close(pending)
        return None

    def _open(self, op, axis, ranks, nbytes, peer):
        if self._writer is None and not self.timed:
            return None
        record = {"step": self.step, "op": op, "axis": str(axis), "group_ranks": list(ranks),
                  "bytes": nbytes, "start": time.time()}
        if peer is not None:
            record["peer"] = peer
        pending = _Pending(record)
        with guard("comm timing"):
            if self.cuda:
                pending.start_event = torch.cuda.Event(enable_timing=True)
                pending.end_event = torch.cuda.Event(enable_timing=True)
                pending.start_event.record()
            else:
                pending.t0 = time.perf_counter()
        return pending

    def _begin_wait(self, pending: _Pending | None) -> None:
        if pending is None:
            return
        with guard("comm timing"):
            if self.cuda:
                pending.wait_event = torch.cuda.Event(enable_timing=True)
                pending.wait_event.record()
            else:
                pending.t_wait = time.perf_counter()

    def _close(self, pending: _Pending | None) -> None:
        if pending is None:
            return
        with guard("comm timing"):
            if self.cuda:
                pending.end_event.record()  # read lazily in flush(): no sync here
            else:
                end = time.perf_counter()
                pending.record["duration"] = end - pending.t0
                pending.exposed = end - (pending.t0 if pending.t_wait is None else pending.t_wait)
            pending.done = True
            self._pending.append(pending)

    def _resolve_cuda(self, p: _Pending) -> None:
        p.end_event.synchronize()
        p.record["duration"] = p.start_event.elapsed_time(p.end_event) / 1e3
        first = p.start_event if p.wait_event is None else p.wait_event
        p.exposed = first.elapsed_time(p.end_event) / 1e3

    def flush(self) -> None:
        """Resolve this step's timings and write them; called at step end, off the hot path."""
        resolved = []
        with guard("comm timing"):
            for p in self._pending:
                if self.cuda:
                    self._resolve_cuda(p)
                if self._writer is not None:
                    self._writer.append(p.record)
                if self.timed:
                    resolved.append({**p.record, "exposed": p.exposed})
        self._pending.clear()
        self.last_step = resolved
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._writer.close()
