"""Live per-rank metrics for Prometheus (`--prometheus-port`), read at scrape time.

A custom Collector on a private registry (prometheus client_python's pattern): the training loop
never pushes anything; `collect()` builds the metric families from the latest values of the data
sources it was given (the step log, the comm log's running totals, the metrics sampler). Rank r
serves on port `base + r`. Labels: job, rank, tp_rank, pp_rank, dp_rank. The analyser-derived
metrics (MFU, busbw, bubble ratio) come from `diag export`, not from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .safe import guard


@dataclass
class Sources:
    """What the collector reads; any of them may be None."""

    steps: object = None  # StepLog: .last (dict) and .count
    comm: object = None  # CommLog: .totals {(axis, op): [seconds, bytes]}
    sampler: object = None  # MetricsSampler: .latest (dict)


class TrainerCollector:
    def __init__(self, job: str, rank: int, coords, sources: Sources) -> None:
        self.sources = sources
        self.labels = {"job": job, "rank": str(rank), "tp_rank": str(coords.tp_rank),
                       "pp_rank": str(coords.pp_rank), "dp_rank": str(coords.dp_rank)}

    def _family(self, kind, name, doc, extra=()):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        return cls(name, doc, labels=[*self.labels, *extra])

    def collect(self):
        values = list(self.labels.values())
        steps, comm, sampler = self.sources.steps, self.sources.comm, self.sources.sampler
        if steps is not None and getattr(steps, "last", None):
            for name, key, doc in (("diag_step_seconds", "step_seconds", "last step's time"),
                                   ("diag_tokens_per_second", "tokens_per_second",
                                    "job tokens/s of the last step")):
                fam = self._family("gauge", name, doc)
                fam.add_metric(values, steps.last[key])
                yield fam
            fam = self._family("counter", "diag_steps", "training steps done")
            fam.add_metric(values, steps.count)
            yield fam
        if comm is not None and comm.totals:
            secs = self._family("counter", "diag_collective_seconds",
                                "time in communication by axis and op", ("axis", "op"))
            nbytes = self._family("counter", "diag_collective_bytes",
                                  "bytes communicated by axis and op", ("axis", "op"))
            for (axis, op), (s, b) in sorted(comm.totals.items()):
                secs.add_metric([*values, axis, op], s)
                nbytes.add_metric([*values, axis, op], b)
            yield secs
            yield nbytes
        latest = getattr(sampler, "latest", None) or {}
        yield from self._device_metrics(values, latest)

    def _device_metrics(self, values, latest):
        table = (("gpu_util_percent", "diag_gpu_utilization_ratio", 0.01),
                 ("mem_used_bytes", "diag_gpu_memory_used_bytes", 1.0),
                 ("power_watts", "diag_gpu_power_watts", 1.0),
                 ("sm_clock_mhz", "diag_gpu_sm_clock_hertz", 1e6),
                 ("process_cpu_percent", "diag_host_process_cpu_ratio", 0.01),
                 ("rss_bytes", "diag_host_resident_memory_bytes", 1.0))
        for key, name, scale in table:
            if key in latest:
                fam = self._family("gauge", name, f"{key} from the metrics sampler")
                fam.add_metric(values, latest[key] * scale)
                yield fam


def start_exporter(port: int, collector: TrainerCollector):
    """Serve `collector` on its own registry; returns the registry (None if it failed)."""
    with guard("prometheus exporter"):
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        start_http_server(port, registry=registry)
        return registry
    return None
