"""The live exporter: values on a fresh registry, a port already in use, and scrapes 20 times a
second per rank answered during a real run without changing it."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from instrumented_trainer.telemetry.prometheus import (LiveStats, TrainerCollector,
                                                       exporter_port)

from .runner import assert_ok, run_trainer

prometheus_client = pytest.importorskip("prometheus_client")
LABELS = {"job": "job1", "rank": "5", "tp_rank": "1", "pp_rank": "1", "dp_rank": "0",
          "node": "n1"}


class _Sampler:
    latest = {"source": "host", "process_cpu_percent": 50.0, "rss_bytes": 1000}


def _comm(axis, op, ranks, nbytes, duration, exposed):
    return {"axis": axis, "op": op, "group_ranks": ranks, "bytes": nbytes,
            "duration": duration, "exposed": exposed}


def _registry(live, sampler=None):
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(TrainerCollector(LABELS, live, sampler))
    return registry


def test_collector_exposes_latest_snapshot():
    live = LiveStats(tokens_per_step=256, train_iters=10, world_size=8, pp=2,
                     num_micro_batches=4, model_flops_per_step=1e9, peak_flops=1e10)
    step = [_comm("dp", "all_reduce", [1, 3, 5, 7], 4096, 0.25, 0.125),
            _comm("pp", "recv", [1, 5], 1024, 0.1, 0.05)]
    live.publish({"step_seconds": 0.5, "tokens_per_second": 512.0}, step)
    live.publish({"step_seconds": 0.25, "tokens_per_second": 1024.0}, step)
    get = _registry(live, _Sampler()).get_sample_value
    assert get("diag_steps_total", LABELS) == 2
    assert get("diag_train_seconds_total", LABELS) == 0.75
    assert get("diag_tokens_total", LABELS) == 512
    assert get("diag_step_seconds", LABELS) == 0.25
    assert get("diag_tokens_per_second", LABELS) == 1024.0
    assert get("diag_mfu_ratio", LABELS) == pytest.approx(1e9 / (0.25 * 8 * 1e10))
    assert get("diag_pipeline_bubble_ratio", LABELS) == pytest.approx(0.05 / 0.25)
    assert get("diag_pipeline_bubble_ideal_ratio", LABELS) == pytest.approx(1 / 5)
    dp = {**LABELS, "axis": "dp", "op": "all_reduce"}
    assert get("diag_collective_seconds_total", dp) == 0.5
    assert get("diag_collective_exposed_seconds_total", dp) == 0.25
    assert get("diag_collective_bytes_total", dp) == 8192
    assert get("diag_collective_bus_bytes_total", dp) == 8192 * 2 * 3 / 4  # 2(n-1)/n
    assert get("diag_collective_calls_total", dp) == 2
    assert get("diag_collective_busbw_bytes_per_second", dp) == 4096 * 1.5 / 0.25
    assert get("diag_host_process_cpu_ratio", LABELS) == 0.5
    assert get("diag_host_resident_memory_bytes", LABELS) == 1000
    assert get("diag_gpu_power_watts", LABELS) is None


def test_peak_memory_is_the_last_measured_one():
    """GPU steps carry their peak; a CPU run's arrives when the profiler window closes; a step
    without a measurement keeps the last one, and none measured is no series (not a 0)."""
    live = LiveStats(tokens_per_step=1, train_iters=3, world_size=1)
    get = _registry(live).get_sample_value
    live.publish({"step_seconds": 1.0, "tokens_per_second": 1.0, "peak_memory_bytes": None}, [])
    assert get("diag_peak_memory_bytes", LABELS) is None
    live.publish({"step_seconds": 1.0, "tokens_per_second": 1.0, "peak_memory_bytes": 4096}, [])
    live.publish({"step_seconds": 1.0, "tokens_per_second": 1.0, "peak_memory_bytes": None}, [])
    assert get("diag_peak_memory_bytes", LABELS) == 4096
    live.set_peak_memory(5000)
    assert get("diag_peak_memory_bytes", LABELS) == 5000
    assert get("diag_steps_total", LABELS) == 3


def test_before_the_first_step_only_the_plan_is_exported():
    live = LiveStats(tokens_per_step=1, train_iters=3, world_size=1)
    text = prometheus_client.generate_latest(_registry(live)).decode()
    assert [line.split("{")[0] for line in text.splitlines()
            if not line.startswith("#")] == ["diag_train_iters"]


def test_port_is_base_plus_local_rank():
    assert exporter_port(9700, 3) == 9703
    with pytest.raises(ValueError):
        exporter_port(65535, 1)


def test_port_in_use_warns_once_and_training_goes_on(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = run_trainer(tmp_path / "busy", 1, "--train-iters", "3", "--no-profile",
                          "--prometheus-port", str(port))
    assert_ok(run)
    warnings = [x for x in run.stderr.splitlines() if "prometheus exporter" in x]
    assert len(warnings) == 1 and "Address already in use" in warnings[0], run.stderr
    assert len(run.losses()) == 3


def _run(out, iters: int, scraped: bool) -> tuple[list[float], dict[int, list[float]]]:
    """One PP 2 run (2 ranks) with the exporter on; scraped 20 times a second per rank while it
    trains, or not at all. Returns its losses and, per local rank, the step counts it answered."""
    from promserver import finish, free_ports, scrape, start_trainer

    port = free_ports(2)
    stop, seen = threading.Event(), {}
    thread = threading.Thread(target=scrape, args=([port, port + 1], stop, seen))
    proc = start_trainer(out, port, iters)
    if scraped:
        thread.start()
    code, _, err = finish(proc)
    stop.set()
    if scraped:
        thread.join(timeout=10)
    assert code == 0, err[-4000:]
    losses = [json.loads(x)["loss"] for x in (out / "steps.jsonl").read_text().split()]
    return losses, {p - port: v for p, v in seen.items()}


def test_scrapes_during_training_are_answered_and_change_nothing(tmp_path):
    """The same job twice with the exporter on, the second run scraped 20 times a second per rank
    (400x Prometheus' default rate): every rank answers all through the run, its step counter only
    grows and never passes the run's steps, and training computes exactly the same losses.

    What scraping costs in step time is a timing claim, for a benchmark
    (`benchmarks/scrape_overhead.py`; its reading is in docs/live-metrics.md): with two ranks on a
    2-core machine the scraper's own CPU competes with training, and a wall-clock ratio in a test
    read 0.96-1.29 on quiet machines."""
    from promserver import iters_lasting

    # long enough (about 3 s today, at least 80 steps) for dozens of scrapes however fast the machine
    iters = iters_lasting(3.0, tmp_path / "calibrate", 80)
    quiet, _ = _run(tmp_path / "quiet", iters, scraped=False)
    losses, seen = _run(tmp_path / "scraped", iters, scraped=True)
    assert len(quiet) == iters and losses == quiet
    assert sorted(seen) == [0, 1], seen
    for rank, counts in seen.items():
        assert len(counts) >= 20, (rank, len(counts))
        assert counts == sorted(counts) and 0 <= counts[0] and counts[-1] <= iters, (rank, counts)
        # answered while it trained, not only before the first step or after the last one
        assert len([c for c in set(counts) if 0 < c < iters]) >= 3, (rank, counts)
