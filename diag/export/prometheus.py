"""A Diagnosis as Prometheus metrics, for node_exporter's textfile collector or a Pushgateway.

The trainer's live exporter says how fast a job runs; a diagnosis made from its traces says why
(exposed communication by axis, busbw next to the link, bubble next to the ideal, who the
straggler is). `diag export --prometheus` puts that second half where the cluster already looks.
Metric names use the `diag_trace_` prefix (the live ones use `diag_`), base units (seconds,
bytes per second, ratios 0..1); per-step quantities say so in their help text. Every series is
labelled with `job`; a value the traces cannot give (None) is left out, never written as 0.

prometheus_client is an optional dependency of the analyser (the `trainer` extra installs it):
it is imported only when an export is made, with a clear message when it is missing.
"""

from __future__ import annotations

from ..analysis.results import Diagnosis

MISSING = ("diag export --prometheus needs prometheus-client: "
           "pip install prometheus-client  (or pip install 'diag[trainer]')")

BREAKDOWN_KINDS = (("compute", "compute_s"), ("communication", "comm_s"),
                   ("memory", "memory_s"), ("other", "other_s"), ("idle", "idle_s"))


def _client():
    try:
        import prometheus_client
    except ImportError as exc:
        raise RuntimeError(MISSING) from exc
    return prometheus_client


class DiagnosisCollector:
    """Metric families of one Diagnosis (a custom Collector: nothing is global)."""

    def __init__(self, diagnosis: Diagnosis, job: str) -> None:
        self.d, self.job = diagnosis, job
        self._families: dict = {}

    def _add(self, name: str, doc: str, value, **labels) -> None:
        if value is None:
            return
        from prometheus_client.core import GaugeMetricFamily

        key = (name, tuple(labels))
        if key not in self._families:
            self._families[key] = GaugeMetricFamily(name, doc, labels=["job", *labels])
        self._families[key].add_metric([self.job, *map(str, labels.values())], float(value))

    def collect(self):
        self._families = {}
        self._job_level()
        self._ranks()
        self._comm()
        self._pipeline()
        yield from self._families.values()

    def _job_level(self) -> None:
        d, t = self.d, self.d.throughput
        self._add("diag_trace_ranks", "rank traces analysed", len(d.ranks))
        self._add("diag_trace_world_size", "ranks in the job", d.world_size)
        self._add("diag_trace_problems", "rank files that could not be read", len(d.problems))
        if t is not None:
            self._add("diag_trace_step_seconds", "median step time", t.step_time_s)
            self._add("diag_trace_tokens_per_second_per_gpu", "tokens/s per GPU",
                      t.tokens_per_s_per_gpu)
            self._add("diag_trace_mfu_ratio", "model FLOPs utilisation", t.mfu)
        for f in d.findings:
            self._add("diag_trace_finding_seconds", "time lost per step, by cause",
                      f.seconds_per_step, what=f.what)
            self._add("diag_trace_finding_ratio", "share of the step lost, by cause",
                      f.share_of_step, what=f.what)

    def _ranks(self) -> None:
        for r in self.d.ranks:
            self._add("diag_trace_rank_step_seconds", "median host step time of the rank",
                      r.step_time_s, rank=r.rank)
            b = r.breakdown
            for kind, attr in BREAKDOWN_KINDS:
                self._add("diag_trace_time_ratio", "share of the rank's span by kind of work "
                          "(communication: exposed)", b.pct(getattr(b, attr)) / 100.0,
                          rank=r.rank, kind=kind)
            self._add("diag_trace_overlap_ratio", "communication hidden behind compute",
                      r.overlap.ratio, rank=r.rank)

    def _comm(self) -> None:
        c = self.d.comm
        if c is None:
            return
        for o in c.ops:
            lab = {"axis": o.axis, "op": o.op, "size": o.size_bucket}
            self._add("diag_trace_collective_calls", "instances over all ranks", o.calls, **lab)
            for name, value, doc in (("seconds", o.time_s, "time per rank"),
                                     ("exposed_seconds", o.exposed_s, "exposed time per rank"),
                                     ("wait_seconds", o.wait_s, "waiting for the last rank")):
                self._add(f"diag_trace_collective_{name}", doc + ", whole window", value, **lab)
            gbps = o.busbw_median_gbps
            self._add("diag_trace_collective_busbw_bytes_per_second", "median nccl-tests busbw",
                      None if gbps is None else gbps * 1e9, **lab)
            self._add("diag_trace_collective_efficiency_ratio", "median busbw / link peak",
                      o.efficiency, **lab)
        for a in c.axes:
            self._add("diag_trace_comm_exposed_seconds", "exposed communication per step",
                      a.exposed_per_step_s, axis=a.axis)
            self._add("diag_trace_comm_hidden_ratio", "communication hidden behind compute",
                      a.hidden_ratio, axis=a.axis)
        for s in c.stragglers:
            for r in s.ranks:          # a set (ranks taking turns, a node): one series per member
                self._add("diag_trace_straggler", "1 for a rank the others wait for", 1, rank=r, reason=s.reason)

    def _pipeline(self) -> None:
        p = self.d.pipeline
        if p is None:
            return
        self._add("diag_trace_pipeline_bubble_ideal_ratio", "schedule's ideal bubble",
                  p.ideal_fraction)
        for s in p.stages:
            self._add("diag_trace_pipeline_bubble_ratio", "bubble share of the step, by stage",
                      s.bubble_fraction, stage=s.stage)
            self._add("diag_trace_pipeline_bubble_seconds", "bubble per step, by stage",
                      s.bubble_s, stage=s.stage)


def registry_for(diagnosis: Diagnosis, job: str):
    """A private registry holding only this diagnosis."""
    client = _client()
    registry = client.CollectorRegistry(auto_describe=False)
    registry.register(DiagnosisCollector(diagnosis, job))
    return registry


def to_text(diagnosis: Diagnosis, job: str) -> str:
    """The Prometheus text exposition format of the diagnosis."""
    return _client().generate_latest(registry_for(diagnosis, job)).decode()


def write_textfile(diagnosis: Diagnosis, job: str, path: str) -> None:
    """Write atomically (an exclusive temporary, then rename): node_exporter never reads half a
    file, and no predictable temporary name is followed (client_python's write_to_textfile uses one)."""
    from ..trace.safeio import atomic_write

    atomic_write(path, to_text(diagnosis, job))


def push(diagnosis: Diagnosis, job: str, url: str, timeout: float = 10.0) -> None:
    """Replace the job's group on a Pushgateway (HTTP PUT /metrics/job/<job>)."""
    _client().push_to_gateway(url, job=job, registry=registry_for(diagnosis, job),
                              timeout=timeout)
