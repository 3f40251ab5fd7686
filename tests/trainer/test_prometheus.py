"""The live exporter: metric names and labels from the latest values, on a fresh registry."""

from __future__ import annotations

import pytest

from diag.topology import RankGrid
from instrumented_trainer.telemetry.prometheus import Sources, TrainerCollector

prometheus_client = pytest.importorskip("prometheus_client")


class _Steps:
    last = {"step": 3, "loss": 4.2, "step_seconds": 0.5, "tokens_per_second": 512.0}
    count = 4


class _Comm:
    totals = {("dp", "all_reduce"): [0.25, 4096], ("pp", "send"): [0.125, 1024]}


class _Sampler:
    latest = {"source": "host", "process_cpu_percent": 50.0, "rss_bytes": 1000}


def test_collector_exposes_latest_values():
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    coords = RankGrid(2, 2, 2).coords(5)
    registry.register(TrainerCollector("job1", 5, coords, Sources(_Steps(), _Comm(), _Sampler())))
    labels = {"job": "job1", "rank": "5", "tp_rank": "1", "pp_rank": "1", "dp_rank": "0"}
    get = registry.get_sample_value
    assert get("diag_step_seconds", labels) == 0.5
    assert get("diag_tokens_per_second", labels) == 512.0
    assert get("diag_steps_total", labels) == 4
    dp_allreduce = {**labels, "axis": "dp", "op": "all_reduce"}
    assert get("diag_collective_seconds_total", dp_allreduce) == 0.25
    assert get("diag_collective_bytes_total", {**labels, "axis": "pp", "op": "send"}) == 1024
    assert get("diag_host_process_cpu_ratio", labels) == 0.5
    assert get("diag_host_resident_memory_bytes", labels) == 1000


def test_collector_with_no_data_yields_nothing():
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(TrainerCollector("j", 0, RankGrid(1, 1, 1).coords(0), Sources()))
    assert prometheus_client.generate_latest(registry) == b""
