"""The communication log: every collective and point-to-point transfer, its axis, size and time.

The analyser needs to know, for each communication in a trace, which parallel axis it served and
how many bytes it moved. With DTensor, pipelining and FSDP2 the collectives are issued inside
torch, so `CommTap` (telemetry/commtap.py) observes them as they are dispatched and hands each one
here; it is wrapped in a profiler range named

    diag:comm:<axis>:<op>:<bytes>      e.g. diag:comm:tp:all_reduce:65536

and timed into `<out>/comm-rank-<r>.jsonl` (op, axis, group ranks, bytes, wall-clock start,
duration). On GPU the timing uses CUDA events that are read only at `flush()` (step end), so the
hot path never synchronises; on CPU it uses time.perf_counter. Asynchronous operations (all of
DTensor's, pipelining's and ours) are timed from launch to the end of their wait.

Each operation's *exposed* time is also kept (for the live Prometheus metrics): the time the
training thread (CPU) or the compute stream (GPU) stood still for it, i.e. its wait. An operation
whose wait happened where the tap cannot see it (FSDP2 waits on its own) has no duration: it is
logged with `duration` and `exposed` null, never as a measured zero. `last_step` holds the
resolved operations of the step just flushed.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass, field

import torch

from .safe import JsonlWriter, guard


@dataclass
class _Pending:
    """One timed operation whose end is not yet known or not yet read."""

    record: dict
    t0: float = 0.0
    t_wait: float | None = None  # async: when wait() began (CPU)
    start_event: object = None
    wait_event: object = None  # async: recorded when wait() began (GPU)
    end_event: object = None
    exposed: float | None = 0.0
    done: bool = False
    unwaited: bool = False  # its wait was not seen: duration unknown


def _identity(key) -> int:
    """A tensor is named by its storage (the wait may be given another tensor aliasing the
    collective's output: autograd's wrapper of it), anything else by the object."""
    return key.untyped_storage().data_ptr() if isinstance(key, torch.Tensor) else id(key)


@dataclass
class CommLog:
    """Labels and times communication for one rank; `enabled=False` keeps only the labels."""

    rank: int
    path: str | None
    cuda: bool = False
    step: int = 0
    timed: bool = False  # time operations even without a file (the live exporter reads them)
    _pending: list[_Pending] = field(default_factory=list)
    _inflight: dict = field(default_factory=dict)  # id(key) -> (key or its weakref, [_Pending]), until waited
    held: list = field(default_factory=list)  # ids of the Works held strongly until the tap's next op
    last_step: list[dict] = field(default_factory=list)  # resolved records of the last flush
    _batch: list | None = None  # inside p2p_batch(): the operations launched without a Work of their own

    def __post_init__(self) -> None:
        self._writer = JsonlWriter(self.path, "comm log") if self.path else None

    # -- what the tap reports ---------------------------------------------------------------
    def launched(self, op, axis, ranks, nbytes, launch, key_of):
        """Run `launch()` (the dispatch of one async operation) under its label; `key_of(out)`
        names what its wait will be given (kept alive until then; the tap lets earlier ones go
        before each op it sees, this one included)."""
        pending = self._open(op, axis, ranks, nbytes)
        with torch.profiler.record_function(f"diag:comm:{axis}:{op}:{nbytes}"):
            out = launch()
        if pending is not None:
            key = key_of(out)
            if key is None:  # no Work of its own: NCCL hands back one for a coalesced batch
                if self._batch is not None:
                    self._batch.append(pending)
                else:
                    self._unknown([pending])
            else:
                self._hold(key, [pending])
        return out

    def _hold(self, key, pendings: list) -> None:
        self._inflight[_identity(key)] = (key, pendings)
        if not isinstance(key, torch.Tensor):
            self.held.append(_identity(key))

    def _unknown(self, pendings: list) -> None:
        """Logged with unknown duration: their wait is not one the tap can see."""
        for p in pendings:
            p.record["duration"], p.exposed, p.unwaited = None, None, True
            self._pending.append(p)

    @contextlib.contextmanager
    def p2p_batch(self):
        """Around a batch of sends and receives (pipelining's `_batch_p2p`): on NCCL,
        batch_isend_irecv coalesces them, each op is given no Work and the batch one Work for
        all. Call `bind(works)` with what the batch returned: the operations that had no Work
        are timed by it (one Work: all of them; as many Works as operations: in order); any
        left over are logged with unknown duration."""
        outer, self._batch = self._batch, []
        batch = self._batch

        def bind(works) -> None:
            works = list(works) if isinstance(works, (list, tuple)) else [works]
            free = [w for w in works if w is not None and _identity(w) not in self._inflight]
            if batch and len(free) == 1:
                self._hold(free[0], list(batch))
            elif batch and len(free) == len(batch):
                for w, p in zip(free, batch):
                    self._hold(w, [p])
            else:
                self._unknown(batch)
            batch.clear()
        try:
            yield bind
        finally:
            self._batch = outer
            if batch:
                self._unknown(batch)

    def let_go(self) -> None:
        """Hold the Works launched so far weakly (the tap calls it at the next op it sees). A Work
        is held strongly from its launch until then, so that the caller is handed the same Python
        object its wait will name; after that only the caller keeps it. A Work holds its
        collective's tensors, and one whose wait the tap never sees (FSDP2 waits on its own) was
        kept with every all-gather output and reduce-scatter input of its step until the next
        step's flush: the ZeRO-3 job of benchmarks/bench_tune.py (zero_down) measured 44,072,288 B
        at its peak with them, 22,321,504 B without."""
        for key_id in self.held:
            entry = self._inflight.get(key_id)
            if entry is not None and not isinstance(entry[0], weakref.ref):
                self._inflight[key_id] = (weakref.ref(entry[0], self._dropped(key_id)), entry[1])
        self.held.clear()

    def _dropped(self, key_id: int):
        """The weakref callback of a Work let go unwaited by the tap: logged with unknown duration."""
        def gone(_ref) -> None:
            entry = self._inflight.pop(key_id, None)
            if entry is not None:
                self._unknown(entry[1])
        return gone

    def wait(self, key, wait=None):
        """Wait for the operation `key` (a Work, or a functional collective's output tensor) with
        `wait()` (default: key.wait()), close its timing if it was launched through `launched`,
        and return what `wait()` returned."""
        entry = self._inflight.pop(_identity(key), None)
        pendings = entry[1] if entry is not None else ()
        for p in pendings:
            self._begin_wait(p)
        result = (wait or key.wait)()
        for p in pendings:
            self._close(p)
        return result

    def _open(self, op, axis, ranks, nbytes):
        if self._writer is None and not self.timed:
            return None
        record = {"step": self.step, "op": op, "axis": str(axis), "group_ranks": list(ranks),
                  "bytes": nbytes, "start": time.time()}
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
            self._drop_unwaited()
            for p in self._pending:
                if self.cuda and not p.unwaited:
                    self._resolve_cuda(p)
                if self._writer is not None:
                    self._writer.append(p.record)
                if self.timed:
                    resolved.append({**p.record, "exposed": p.exposed})
        self._pending.clear()
        self.last_step = resolved
        if self._writer is not None:
            self._writer.flush()

    def _drop_unwaited(self, final: bool = False) -> None:
        """Operations launched before the previous flush and never waited through the tap (FSDP2
        waits on its own): logged with unknown duration rather than kept forever."""
        for key_id, (_key, pendings) in list(self._inflight.items()):
            if final or pendings[0].record["step"] < self.step:
                self._unknown(pendings)
                del self._inflight[key_id]

    def close(self) -> None:
        with guard("comm timing"):
            self._drop_unwaited(final=True)
        self.flush()
        if self._writer is not None:
            self._writer.close()
