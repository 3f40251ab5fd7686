"""Live per-rank metrics for Prometheus (`--prometheus-port`), read at scrape time.

On a cluster nobody opens traces until something is wrong, so each rank serves `/metrics` with
the same quantities `diag analyze` reports, live. The training thread never talks to Prometheus:
once per step it hands the step's numbers to `LiveStats.publish`, which swaps in a new immutable
`Snapshot` (one attribute assignment; no GPU synchronisation: the comm log has already resolved
its timings at step end). `TrainerCollector.collect()` runs in the HTTP server's thread at scrape
time and builds the metric families from the latest snapshot and the metrics sampler's latest
sample: prometheus client_python's custom-Collector pattern, on a private registry.

Rank r serves on `--prometheus-addr`:`--prometheus-port + LOCAL_RANK` (loopback by default).
Every series carries job, rank, tp_rank, pp_rank, dp_rank and node (host name). The metric
names are documented in docs/live-metrics.md and queried as-is by the Grafana dashboard and the
recording rules in dashboards/.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field, replace

from .safe import guard

LABELS = ("job", "rank", "tp_rank", "pp_rank", "dp_rank", "node")

# Sampler key -> (metric name, scale to base units, help). NVML (GPU) first, psutil fallback.
DEVICE_METRICS = (
    ("gpu_util_percent", "diag_gpu_utilization_ratio", 0.01, "GPU busy fraction (NVML)"),
    ("mem_used_bytes", "diag_gpu_memory_used_bytes", 1.0, "GPU memory in use (NVML)"),
    ("mem_total_bytes", "diag_gpu_memory_total_bytes", 1.0, "GPU memory size (NVML)"),
    ("power_watts", "diag_gpu_power_watts", 1.0, "GPU board power (NVML)"),
    ("sm_clock_mhz", "diag_gpu_sm_clock_hertz", 1e6, "GPU SM clock (NVML)"),
    ("process_cpu_percent", "diag_host_process_cpu_ratio", 0.01,
     "CPU time of this rank's process per wall second (psutil, when NVML is absent)"),
    ("system_cpu_percent", "diag_host_cpu_ratio", 0.01, "host CPU busy fraction (psutil)"),
    ("rss_bytes", "diag_host_resident_memory_bytes", 1.0, "resident memory of this rank (psutil)"),
)
# Only NVML gives these; a CPU run has no series for them (docs/live-metrics.md).
NVML_ONLY = ("diag_gpu_power_watts", "diag_gpu_sm_clock_hertz", "diag_gpu_memory_total_bytes")


@dataclass
class CommTotals:
    """Running totals of one (axis, op) on this rank."""

    seconds: float = 0.0
    exposed: float = 0.0
    bytes: float = 0.0
    bus_bytes: float = 0.0  # bytes x nccl-tests bus factor: rate(bus) / rate(seconds) = busbw
    calls: int = 0


@dataclass(frozen=True)
class Snapshot:
    """Everything the collector exports, as of the end of the last step."""

    steps: int = 0
    step_seconds: float = 0.0
    train_seconds: float = 0.0
    timestamp: float = 0.0
    tokens_per_second: float = 0.0
    tokens: float = 0.0
    mfu: float | None = None
    bubble: float | None = None
    comm: dict = field(default_factory=dict)  # (axis, op) -> CommTotals (a copy)
    busbw: dict = field(default_factory=dict)  # (axis, op) -> bytes/s over the last step
    peak_memory: int | None = None  # the last measured step peak, largest over the ranks


@dataclass
class LiveStats:
    """Turns each step's record and resolved communication into a new Snapshot."""

    tokens_per_step: float
    train_iters: int
    world_size: int
    pp: int = 1
    num_micro_batches: int = 1
    model_flops_per_step: float | None = None
    peak_flops: float | None = None  # per device; MFU only when known
    snapshot: Snapshot = field(default_factory=Snapshot)

    @property
    def bubble_ideal(self) -> float | None:
        p, m = self.pp, self.num_micro_batches
        return (p - 1) / (m + p - 1) if p > 1 else None

    def publish(self, record: dict, comm_records: list[dict]) -> None:
        """Called by the training thread at step end with StepLog.last and CommLog.last_step."""
        old, seconds = self.snapshot, record["step_seconds"]
        totals, busbw, pp_exposed = _accumulate(old.comm, comm_records)
        mfu = None
        if self.peak_flops and self.model_flops_per_step and seconds > 0:
            mfu = self.model_flops_per_step / (seconds * self.world_size * self.peak_flops)
        self.snapshot = Snapshot(
            steps=old.steps + 1, step_seconds=seconds, train_seconds=old.train_seconds + seconds,
            timestamp=time.time(), tokens_per_second=record["tokens_per_second"],
            tokens=old.tokens + self.tokens_per_step, mfu=mfu,
            bubble=min(1.0, pp_exposed / seconds) if self.pp > 1 and seconds > 0 else None,
            comm=totals, busbw=busbw,
            peak_memory=_first(record.get("peak_memory_bytes"), old.peak_memory))

    def set_peak_memory(self, value: int) -> None:
        """A peak measured after its step was published (CPU: when the profiler window closes)."""
        self.snapshot = replace(self.snapshot, peak_memory=value)


def _first(*values):
    return next((v for v in values if v is not None), None)


def _accumulate(previous: dict, comm_records: list[dict]) -> tuple[dict, dict, float]:
    """New running totals (the previous ones are not mutated: a scrape may be reading them),
    the last step's busbw by (axis, op), and the step's exposed pipeline (PP) time."""
    totals = {k: CommTotals(**vars(v)) for k, v in previous.items()}
    step_bus: dict = {}
    pp_exposed = 0.0
    for r in comm_records:
        if r["duration"] is None:
            continue  # its wait was not seen (FSDP2's own): no time to add, not a zero
        t = totals.setdefault((r["axis"], r["op"]), CommTotals())
        bus = r["bytes"] * _bus_factor(r["op"], len(r["group_ranks"]))
        t.seconds += r["duration"]
        t.exposed += r["exposed"]
        t.bytes += r["bytes"]
        t.bus_bytes += bus
        t.calls += 1
        acc = step_bus.setdefault((r["axis"], r["op"]), [0.0, 0.0])
        acc[0], acc[1] = acc[0] + bus, acc[1] + r["duration"]
        pp_exposed += r["exposed"] if r["axis"] == "pp" else 0.0
    return totals, {k: b / s for k, (b, s) in step_bus.items() if s > 0}, pp_exposed


def _bus_factor(op: str, n: int) -> float:
    """nccl-tests bus factor (diag.analysis.bandwidth), 1 where it is undefined."""
    from diag.analysis.bandwidth import bus_factor
    from diag.trace.kinds import Coll

    factor = bus_factor(Coll[op.upper()], n) if op.upper() in Coll.__members__ else None
    return 1.0 if factor is None else factor


class TrainerCollector:
    """Builds the metric families from `live.snapshot` and `sampler.latest` at scrape time."""

    def __init__(self, labels: dict[str, str], live: LiveStats, sampler=None, seqs=None) -> None:
        self.values = [labels[k] for k in LABELS]
        self.live, self.sampler, self.seqs = live, sampler, seqs   # seqs: flight_recorder.SeqReader

    def _family(self, kind: str, name: str, doc: str, extra: tuple = ()):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        return cls(name, doc, labels=[*LABELS, *extra])

    def _one(self, kind: str, name: str, doc: str, value: float):
        fam = self._family(kind, name, doc)
        fam.add_metric(self.values, value)
        return fam

    def collect(self):
        live, snap = self.live, self.live.snapshot
        yield self._one("gauge", "diag_train_iters", "steps this run will do", live.train_iters)
        if snap.steps:
            yield from self._step_metrics(snap)
            yield from self._comm_metrics(snap)
        if live.bubble_ideal is not None:
            yield self._one("gauge", "diag_pipeline_bubble_ideal_ratio",
                            "schedule's ideal bubble (p-1)/(m+p-1)", live.bubble_ideal)
        yield from self._device_metrics(getattr(self.sampler, "latest", None) or {})
        if self.seqs is not None:
            with guard("prometheus collective sequence numbers"):
                yield from self._seq_metrics(self.seqs.groups())

    def _seq_metrics(self, groups: list):
        """The last collective entered / completed per process group (Flight Recorder): a rank
        whose number stops while its group's others are ahead is the one a hang waits for."""
        from diag.layout import axis_of_desc

        for name, doc, i in (("diag_collective_last_enqueued_seq", "last collective this rank entered", 2),
                             ("diag_collective_last_completed_seq", "last collective this rank completed", 3)):
            fam = self._family("gauge", name, doc + ", per process group (sequence number)",
                               ("pg", "group", "axis"))
            for g in groups:
                fam.add_metric([*self.values, g[0], g[1], axis_of_desc(g[1]) or "unknown"], g[i])
            yield fam

    def _step_metrics(self, s: Snapshot):
        yield self._one("counter", "diag_steps", "training steps done", s.steps)
        yield self._one("counter", "diag_train_seconds", "wall time spent in steps",
                        s.train_seconds)
        yield self._one("counter", "diag_tokens", "tokens the job processed", s.tokens)
        yield self._one("gauge", "diag_step_seconds", "last step's wall time", s.step_seconds)
        yield self._one("gauge", "diag_last_step_timestamp_seconds",
                        "Unix time the last step ended", s.timestamp)
        yield self._one("gauge", "diag_tokens_per_second", "job tokens/s of the last step",
                        s.tokens_per_second)
        if s.mfu is not None:
            yield self._one("gauge", "diag_mfu_ratio", "model FLOPs utilisation, last step",
                            s.mfu)
        if s.bubble is not None:
            yield self._one("gauge", "diag_pipeline_bubble_ratio",
                            "last step's share spent waiting on pipeline send/recv", s.bubble)
        if s.peak_memory is not None:
            yield self._one("gauge", "diag_peak_memory_bytes",
                            "largest allocated-memory peak of any rank in the last measured step "
                            "(CUDA allocator; on CPU the profiled steps' allocation events)",
                            s.peak_memory)

    def _comm_metrics(self, s: Snapshot):
        table = (("diag_collective_seconds", "time from launch to completion", "seconds"),
                 ("diag_collective_exposed_seconds", "time training stood still for it",
                  "exposed"),
                 ("diag_collective_bytes", "bytes handed to the call", "bytes"),
                 ("diag_collective_bus_bytes", "bytes x nccl-tests bus factor", "bus_bytes"),
                 ("diag_collective_calls", "operations issued", "calls"))
        for name, doc, attr in table:
            fam = self._family("counter", name, doc + ", by axis and op", ("axis", "op"))
            for (axis, op), t in sorted(s.comm.items()):
                fam.add_metric([*self.values, axis, op], getattr(t, attr))
            yield fam
        fam = self._family("gauge", "diag_collective_busbw_bytes_per_second",
                           "bus bandwidth over the last step (includes waiting)", ("axis", "op"))
        for (axis, op), value in sorted(s.busbw.items()):
            fam.add_metric([*self.values, axis, op], value)
        yield fam

    def _device_metrics(self, latest: dict):
        for key, name, scale, doc in DEVICE_METRICS:
            if latest.get(key) is not None:
                yield self._one("gauge", name, doc, latest[key] * scale)


def exporter_port(base: int, local_rank: int) -> int:
    """Each rank of a node on its own port: base + local rank."""
    port = base + local_rank
    if not 0 < port < 65536:
        raise ValueError(f"--prometheus-port {base} + local rank {local_rank} is not a port")
    return port


def start_live_metrics(job, rank: int, coords, sampler, peak_flops: float | None):
    """Start this rank's exporter; returns the LiveStats to publish to, or None (off/failed)."""
    from diag.analysis.throughput import model_flops_per_step

    tel, m, grid = job.telemetry, job.model, job.parallel.grid
    tokens = job.train.global_batch_size * m.seq_length
    live = LiveStats(tokens_per_step=tokens, train_iters=job.train.train_iters,
                     world_size=grid.world_size, pp=grid.pp,
                     num_micro_batches=job.num_micro_batches, peak_flops=peak_flops,
                     model_flops_per_step=model_flops_per_step(
                         m.num_layers, m.hidden_size, m.seq_length, m.vocab_size, tokens,
                         m.ffn_hidden_size))
    labels = {"job": tel.prometheus_job or os.path.basename(os.path.abspath(tel.out)),
              "rank": str(rank), "tp_rank": str(coords.tp_rank), "pp_rank": str(coords.pp_rank),
              "dp_rank": str(coords.dp_rank), "node": socket.gethostname()}
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    registry = None
    with guard("prometheus exporter"):
        port = exporter_port(tel.prometheus_port, local_rank)
        from .flight_recorder import SeqReader

        collector = TrainerCollector(labels, live, sampler, SeqReader() if tel.flight_recorder_entries else None)
        registry = start_exporter(tel.prometheus_addr, port, collector)
    return live if registry is not None else None


def start_exporter(addr: str, port: int, collector: TrainerCollector):
    """Serve `collector` on a private registry; a failure (port in use) warns once, returns None."""
    with guard(f"prometheus exporter on {addr}:{port}"):
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        start_http_server(port, addr=addr, registry=registry)
        return registry
    return None
