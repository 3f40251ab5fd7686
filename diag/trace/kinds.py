"""What an event is: its kind on the timeline, and for communication, which collective.

Kineto's categories changed names over the years (`Kernel` -> `kernel`, `Runtime` ->
`cuda_runtime`, ...), NCCL's kernel names too (`ncclKernel_AllReduce_RING_LL_Sum_float`,
`ncclDevKernel_AllReduce_Sum_f16_RING_LL`, `ncclDevKernel_Generic` on ROCm). This module
maps all of them onto a few stable enums.
"""
from __future__ import annotations

import re
from enum import IntEnum


class Kind(IntEnum):
    COMPUTE = 0         # GPU kernel that is neither communication nor memory
    COMM = 1            # GPU communication kernel (NCCL / RCCL)
    MEMCPY = 2
    MEMSET = 3
    GPU_OTHER = 4       # kernels HTA counts as neither compute nor comm (names with Sync/Memcpy)
    CPU_OP = 5
    ANNOTATION = 6      # user_annotation on the host: ProfilerStep#N, record_function, gloo:*
    GPU_ANNOTATION = 7
    RUNTIME = 8         # cuda_runtime / cuda_driver (also HIP's, under the same names)
    PYTHON = 9
    OTHER = 10


GPU_ACTIVITY = (Kind.COMPUTE, Kind.COMM, Kind.MEMCPY, Kind.MEMSET, Kind.GPU_OTHER)

# Category (lower-cased) -> kind, for everything that is not a kernel.
CATEGORY_KIND = {
    "gpu_memcpy": Kind.MEMCPY, "memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET, "memset": Kind.MEMSET,
    "cpu_op": Kind.CPU_OP, "operator": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION, "cpu_instant_event": Kind.OTHER,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_runtime": Kind.RUNTIME, "runtime": Kind.RUNTIME, "cuda_driver": Kind.RUNTIME,
    "python_function": Kind.PYTHON, "python": Kind.PYTHON,
}
KERNEL_CATEGORIES = frozenset({"kernel"})

# Same rules as HTA 0.5 (utils.get_kernel_type), so breakdowns agree with it.
_COMM_RE = re.compile(r"^nccl.*Kernel")
_MEM_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def kernel_kind(name: str) -> Kind:
    if _COMM_RE.match(name):
        return Kind.COMM
    if _MEM_RE.match(name):
        return Kind.MEMSET if name.startswith("Memset") else Kind.MEMCPY
    if _NOT_COMPUTE_RE.match(name):
        return Kind.GPU_OTHER
    return Kind.COMPUTE


class Coll(IntEnum):
    """Collective / point-to-point operation types."""

    UNKNOWN = 0
    ALL_REDUCE = 1
    ALL_GATHER = 2
    REDUCE_SCATTER = 3
    ALL_TO_ALL = 4
    BROADCAST = 5
    REDUCE = 6
    SEND = 7
    RECV = 8
    SEND_RECV = 9       # NCCL's SendRecv kernel: p2p or one piece of an all-to-all
    BARRIER = 10
    GATHER = 11
    SCATTER = 12


def op_name(c: Coll) -> str:
    """The name diag shows and writes for an operation: 'all_reduce', 'send', 'send_recv', ..."""
    return Coll(c).name.lower()


def bench_op(c: Coll) -> str | None:
    """The `diag bench` (collbench) op that measures c: point-to-point ops are all `send_recv`."""
    c = Coll(c)
    if c in (Coll.SEND, Coll.RECV, Coll.SEND_RECV):
        return "send_recv"
    return op_name(c) if c in (Coll.ALL_REDUCE, Coll.ALL_GATHER, Coll.REDUCE_SCATTER, Coll.BROADCAST,
                                Coll.ALL_TO_ALL) else None


_COLL_WORDS = {
    "allreduce": Coll.ALL_REDUCE, "allgather": Coll.ALL_GATHER,
    "reducescatter": Coll.REDUCE_SCATTER, "alltoall": Coll.ALL_TO_ALL,
    "alltoallv": Coll.ALL_TO_ALL, "broadcast": Coll.BROADCAST, "reduce": Coll.REDUCE,
    "send": Coll.SEND, "recv": Coll.RECV, "sendrecv": Coll.SEND_RECV,
    "barrier": Coll.BARRIER, "gather": Coll.GATHER, "scatter": Coll.SCATTER,
}
_NOISE_RE = re.compile(r"_|base|coalesced|into|tensor|single|\d+$")


def coll_from_arg(value: object) -> Coll:
    """`Collective name` arg ('allreduce', '_allgather_base', 'all_to_all', ...) -> Coll."""
    if not isinstance(value, str):
        return Coll.UNKNOWN
    word = _NOISE_RE.sub("", value.lower())
    return _COLL_WORDS.get(word, Coll.UNKNOWN)


_NCCL_NAME_RE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")


def coll_from_kernel(name: str) -> Coll:
    m = _NCCL_NAME_RE.match(name)
    return _COLL_WORDS.get(m.group(1).lower(), Coll.UNKNOWN) if m else Coll.UNKNOWN


_GLOO_RE = re.compile(r"^(?:gloo|c10d|nccl):+([A-Za-z_]+?)_?$")


def coll_from_host_op(name: str) -> Coll:
    """'gloo:all_reduce', 'c10d::allreduce_', 'nccl:all_to_all', 'c10d::_allgather_base_' -> Coll."""
    m = _GLOO_RE.match(name)
    return coll_from_arg(m.group(1)) if m else Coll.UNKNOWN


# Element sizes by the dtype names PyTorch writes in `dtype` / `Input type` args,
# and by the suffixes NCCL puts in kernel names.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "double": 8, "float64": 8, "f64": 8,
    "half": 2, "float16": 2, "f16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "fp32": 4, "fp8": 1,
    "int": 4, "int32": 4, "i32": 4, "int32_t": 4, "uint32_t": 4, "u32": 4,
    "long": 8, "int64": 8, "i64": 8, "int64_t": 8, "uint64_t": 8, "u64": 8,
    "short": 2, "int16": 2, "byte": 1, "uint8": 1, "u8": 1, "uint8_t": 1,
    "char": 1, "int8": 1, "i8": 1, "int8_t": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "f8e4m3": 1, "f8e5m2": 1,
}


def dtype_bytes(value: object) -> int:
    """Bytes per element, 0 when unknown."""
    if not isinstance(value, str):
        return 0
    return DTYPE_BYTES.get(value.lower().replace("c10::", "").replace("at::", ""), 0)
