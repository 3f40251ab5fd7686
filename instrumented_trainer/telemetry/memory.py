"""Peak allocated memory of each profiled step on CPU, from the profiler's allocation events.

torch keeps no allocator counters on CPU (`torch.cuda.max_memory_allocated` is GPU only). With
`profile_memory=True` the profiler records every allocation and free of torch's CPU allocator
with `total_allocated`: the bytes allocated *while memory profiling was on* and still alive
(c10's ProfiledCPUMemoryReporter). Blocks allocated before the profiled window are not in that
counter, and their frees are not subtracted from it. So a step's peak is measured as

    peak = B + max over the step of total_allocated - total_allocated at the window's start

where B is the bytes of the parameters and optimizer states alive when the window opens, read
from their storages (the same byte counts the allocator hands out; local shards of DTensors,
each storage counted once). Gradients are not in B: `zero_grad(set_to_none=True)` frees the
previous step's before any new allocation, and the new ones are inside the window's counter.
The window's first step is not reported: blocks the step before it allocated and that are
still alive during it (the DP sync's buckets, the last micro-batch's outputs) are not in the
counter, while from its second step on they are (allocated in the window). Blocks older than
the window and alive through it, besides the parameters and optimizer states (pipelining's
receive buffers made in the first step, process-group state), are not counted: the figure is
exact for what it counts, and the docs say what that is.

Each rank measures its own; the trainer MAX-reduces them over all ranks once the window closes,
as the GPU path does with the CUDA allocator's peaks of the profiled steps (`reduce_peaks`).
Any failure is a warning and an unknown (null), never a zero.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .safe import guard


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (DTensors: their local shards)."""
    seen, total = set(), 0
    for t in tensors:
        storage = _local(t).untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def state_tensors(optimizer) -> list[torch.Tensor]:
    """The optimizer states this rank holds (under ZeRO-1 its share only)."""
    return [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def persistent_bytes(params, optimizer) -> int:
    """Parameters and this rank's optimizer states: what outlives a step (B above)."""
    return storage_bytes([*params, *state_tensors(optimizer)])


def step_peaks(prof, baseline: int) -> dict[int, int]:
    """{step: peak bytes} of the steps in the profiler's finished window (`ProfilerStep#N`)."""
    from torch._C._profiler import _ExtraFields_Allocation

    steps, allocs = [], []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        fields = event.extra_fields
        if event.name.startswith("ProfilerStep#"):
            steps.append((event.start_time_ns, event.end_time_ns, int(event.name[13:])))
        elif isinstance(fields, _ExtraFields_Allocation) and fields.device.type == "cpu":
            allocs.append((event.start_time_ns, fields.total_allocated, fields.alloc_size))
    if not steps or not allocs:
        raise RuntimeError("the trace has no ProfilerStep ranges or no CPU allocation events")
    allocs.sort()
    origin = level = allocs[0][1] - allocs[0][2]  # the counter before the window's first event
    peaks, i = {}, 0
    for start, end, step in sorted(steps):
        while i < len(allocs) and allocs[i][0] < start:
            level, i = allocs[i][1], i + 1
        peak = level
        while i < len(allocs) and allocs[i][0] <= end:
            level, i = allocs[i][1], i + 1
            peak = max(peak, level)
        peaks[step] = baseline + peak - origin
    del peaks[min(peaks)]  # the window's first step: see the module docstring
    return peaks


def reduce_peaks(local: dict[int, int] | None, steps: list[int],
                 device: torch.device | None = None) -> dict[int, int | None]:
    """The largest peak of any rank per step (a collective: every rank calls it at the same
    step, with None where it measured nothing); a step any rank could not measure is None.
    `device`: where the backend reduces (the rank's GPU under NCCL; CPU by default)."""
    result: dict[int, int | None] = dict.fromkeys(steps)
    with guard("peak memory"):
        local = local or {}
        values = [local.get(s, -1) for s in steps]
        # MAX of v gives the peak; MAX of -v is positive iff some rank had none (v = -1)
        t = torch.tensor(values + [-v for v in values], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        n = len(steps)
        for k, step in enumerate(steps):
            if int(t[n + k]) <= 0:
                result[step] = int(t[k])
    return result
