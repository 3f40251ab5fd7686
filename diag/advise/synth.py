"""Kineto traces of a modelled job: the analyser's test input with known truth.

Problem: on a real trace nobody knows the true overlap, bubble or bus bandwidth, so the
analyser cannot be checked against them. Here the step-time model (model.py) says what
every rank did and when; this module writes it as the per-rank torch.profiler (Kineto)
JSON a GPU job would leave, plus the trainer's `diag_run.json`, so tests can assert
that `diag.analysis.diagnose` recovers what the model put in.

Each GPU op becomes a kernel with a `cudaLaunchKernel` on the host thread (same
`correlation`) shortly before it, inside the host's `ProfilerStep#N` span; communication
is an NCCL kernel on its own stream with NCCL's args, and its launch sits inside the
trainer's `diag:comm:<axis>:<op>:<bytes>` label, as the instrumented trainer writes them.
"""
from __future__ import annotations

import gzip
import json
import os
from typing import Optional

from .. import runmeta
from ..runmeta import RunFacts
from .memory import SHARDING
from .model import Config, RankOps, Timeline, Workload
from ..record import record

US = 1e6
BASE_US = 1_700_000_000_000_000.0 / 1000.0   # a plausible epoch in microseconds
STEP_LEAD_US = 20.0     # the host opens a step this long before its first GPU op may start
LAUNCH_LEAD_US = 5.0    # a kernel is launched this long before it starts (when it can be)
FIRST_STEP = 10         # ProfilerStep numbers start here, as after a profiler's wait + warmup
STREAMS = {None: 7, "tp": 20, "pp": 24, "dp": 28, "ag": 32, "rs": 36, "cp": 40}   # by axis; ZeRO-3's by model stream
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel"
KERNELS = {"optimizer": "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>"}
NCCL = {"all_reduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "send": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
        "recv": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
        "all_gather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "all_to_all": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"}     # NCCL's all-to-all is send/recv
COLLECTIVE = {"all_reduce": "allreduce", "send": "send", "recv": "recv", "all_gather": "allgather",
              "reduce_scatter": "reduce_scatter", "all_to_all": "all_to_allv"}


@record(frozen=True)
class Shape:
    """GPT shape written to diag_run.json (the timeline does not depend on it)."""

    seq_length: int = 2048
    hidden_size: int = 4096
    num_attention_heads: int = 32
    vocab_size: int = 50304
    ffn_hidden_size: int = 16384
    peak_flops: Optional[float] = 989e12

    def __post_init__(self) -> None:
        for name in ("seq_length", "hidden_size", "num_attention_heads", "vocab_size", "ffn_hidden_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"Shape.{name} must be >= 1")


def _pg_names(config: Config) -> dict:
    """Process-group key -> (name, axis), numbered as torch would: default_pg is "0". The key is the
    member tuple; with CP, Megatron-LM's CP group ("cp") and the DP x CP group the gradients are
    reduced over ("dp_cp", DATA_PARALLEL_GROUP_WITH_CP) besides the plain DP group, keyed
    (axis, members): at DP 1 the two have the same members (_pg_key)."""
    out, n = {}, 1
    for axis in ("tp", "dp", "pp") + ("cp", "dp_cp") * (config.cp > 1):
        for g in config.grid.groups(axis):
            out[(axis, tuple(g)) if axis in ("cp", "dp_cp") else tuple(g)] = (str(n), axis)
            n += 1
    return out


def _pg_key(axis: str, group, cp: int):
    """The _pg_names key of a model op's group: with CP its gradients go over the DP x CP group."""
    if cp > 1 and axis in ("cp", "dp"):
        return ("dp_cp" if axis == "dp" else "cp", tuple(group))
    return tuple(group)


def _members(key) -> tuple:
    return key[1] if isinstance(key[0], str) else key


def _distributed_info(rank: int, config: Config, names: dict) -> dict:
    world = config.grid.world_size
    pgs = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": world,
            "ranks": list(range(world))}]
    pgs += [{"pg_name": name, "pg_desc": axis, "backend_config": "cuda:nccl", "pg_size": len(g), "ranks": list(g)}
            for g, (name, axis) in ((_members(k), v) for k, v in names.items()) if rank in g]
    return {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": len(names) + 1,
            "pg_config": pgs, "nccl_version": "2.21.5"}


class _RankWriter:
    """The events of one rank, in microseconds on that rank's (possibly skewed) clock."""

    def __init__(self, ops: RankOps, names: dict, skew_s: float, cp: int = 1):
        self.ops, self.names, self.cp = ops, names, cp
        self.base = BASE_US + skew_s * US
        self.pid, self.device = 1000 + ops.rank, ops.rank % 8
        self.events: list = []

    def _x(self, cat, name, ts_us, dur_us, pid, tid, args) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                            "ts": round(self.base + ts_us, 3), "dur": round(dur_us, 3), "args": args})

    def steps(self) -> None:
        b = self.ops.step_start_s * US
        for k in range(len(b) - 1):
            self._x("user_annotation", f"ProfilerStep#{FIRST_STEP + k}", b[k] - STEP_LEAD_US, b[k + 1] - b[k],
                    self.pid, self.pid, {"External id": k + 1})

    def _launch_us(self, i: int) -> float:
        """Before the kernel starts and inside its step's host span."""
        b, k = self.ops.step_start_s * US, int(self.ops.step[i])
        lo, hi = b[k] - STEP_LEAD_US + 1.0, b[k + 1] - STEP_LEAD_US - 3.0
        return min(max(self.ops.start_s[i] * US - LAUNCH_LEAD_US, lo), hi)

    def op(self, i: int, corr: int) -> None:
        o = self.ops
        launch, start, dur = self._launch_us(i), o.start_s[i] * US, o.dur_s[i] * US
        stream = STREAMS[o.stream[i]] if o.stream[i] in ("ag", "rs") else STREAMS[o.axis[i]]
        args = {"device": self.device, "stream": stream, "correlation": corr, "External id": corr}
        if o.kind[i] == "comm":
            name, axis = self.names[_pg_key(o.axis[i], o.group[i], self.cp)]   # dp_cp: the gradients with CP
            self._x("user_annotation", f"diag:comm:{axis}:{o.op[i]}:{int(o.nbytes[i])}", launch - 1.0, 4.0,
                    self.pid, self.pid, {"External id": corr})
            nel, n = int(o.nbytes[i]) // 2, len(o.group[i])     # nccl-tests S: AG's output, RS's input
            inn, out = {"all_gather": (nel // n, nel), "reduce_scatter": (nel, nel // n)}.get(o.op[i], (nel, nel))
            args.update({"Collective name": COLLECTIVE[o.op[i]], "In msg nelems": inn, "Out msg nelems": out,
                         "Group size": len(o.group[i]), "dtype": "BFloat16", "Process Group Name": name,
                         "Process Group Description": axis, "Process Group Ranks": str(list(o.group[i]))})
            kernel = NCCL[o.op[i]]
        else:
            kernel = KERNELS.get(o.name[i], GEMM)
        self._x("cuda_runtime", "cudaLaunchKernel", launch, 2.0, self.pid, self.pid,
                {"correlation": corr, "External id": corr})
        self._x("kernel", kernel, start, dur, self.device, stream, args)

    def doc(self, config: Config, device_name: str) -> dict:
        self.steps()
        for i in range(len(self.ops)):
            self.op(i, corr=i + 1)
        return {"schemaVersion": 1, "traceName": f"rank-{self.ops.rank}",
                "deviceProperties": [{"id": self.device, "name": device_name, "totalGlobalMem": 85520809984,
                                      "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
                "distributedInfo": _distributed_info(self.ops.rank, config, self.names),
                "displayTimeUnit": "ms", "traceEvents": self.events}


def run_meta(config: Config, workload: Workload, shape: Shape, device_name: str) -> RunFacts:
    """diag_run.json as the trainer writes it (diag.runmeta, docs/run_metadata.md)."""
    c = config
    return RunFacts(
        tp=c.tp, pp=c.pp, dp=c.dp, cp=c.cp, world_size=c.grid.world_size,
        rank_order="tp-cp-dp-pp" if c.cp > 1 else "tp-dp-pp",
        micro_batch_size=c.micro_batch_size, num_micro_batches=c.num_micro_batches,
        global_batch_size=c.micro_batch_size * c.num_micro_batches * c.dp, seq_length=shape.seq_length,
        num_layers=workload.num_layers, hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads, vocab_size=shape.vocab_size,
        ffn_hidden_size=shape.ffn_hidden_size, dtype="bf16", device="cuda", device_name=device_name,
        peak_flops=shape.peak_flops, pipeline_schedule=c.schedule, virtual_pipeline_stages=c.virtual_stages,
        overlap_grad_reduce=c.overlap_grad_reduce, ddp_bucket_size=int(c.bucket_bytes // 2),
        recompute_granularity="full" if workload.recompute == "full" else None,
        data_parallel_sharding_strategy={z: name for name, z in SHARDING.items()}.get(c.zero),
        backend="nccl", command="synthesised by diag.advise.synth")


def write_job(timeline: Timeline, out_dir: str, config: Config, workload: Workload,
              device_name: str = "NVIDIA H100 80GB HBM3", clock_skew_s: Optional[dict] = None,
              shape: Shape = Shape(), gz: bool = True) -> list[str]:
    """One Kineto trace per rank (`rank-<r>.pt.trace.json[.gz]`) and diag_run.json; returns their paths.

    clock_skew_s {rank: s} shifts that rank's whole clock, as unaligned hosts do.
    Emit at least 3 steps: the analysis drops the last one (HTA convention).
    """
    if timeline.grid != config.grid:
        raise ValueError(f"timeline grid {timeline.grid} is not the config's {config.grid}")
    os.makedirs(out_dir, exist_ok=True)
    names, skew, paths = _pg_names(config), clock_skew_s or {}, []
    for ops in timeline.ranks:
        data = json.dumps(_RankWriter(ops, names, skew.get(ops.rank, 0.0), config.cp).doc(config, device_name)).encode()
        path = os.path.join(out_dir, f"rank-{ops.rank}.pt.trace.json" + (".gz" if gz else ""))
        with open(path, "wb") as f:
            f.write(gzip.compress(data, compresslevel=1) if gz else data)
        paths.append(path)
    meta = os.path.join(out_dir, "diag_run.json")
    runmeta.write(meta, run_meta(config, workload, shape, device_name))
    return paths + [meta]
