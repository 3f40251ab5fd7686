"""The live exporter: values on a fresh registry, a port already in use, and the cost of being
scraped 20 times a second per rank during a real run."""

from __future__ import annotations

import http.client
import json
import math
import socket
import statistics
import threading
import time
import urllib.request

import pytest

from conftest import OtherWork, timing_verdict

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


def _scrape(ports, stop, counts, per_second=20.0):
    """GET every port's /metrics `per_second` times a second until `stop` (bounded loop)."""
    deadline = time.monotonic() + 300
    while not stop.is_set() and time.monotonic() < deadline:
        t0 = time.monotonic()
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    counts[port] = counts.get(port, 0) + ("diag_steps_total" in r.read().decode())
            except (OSError, http.client.HTTPException):
                pass  # not up yet, or already gone
        stop.wait(max(0.0, 1.0 / per_second - (time.monotonic() - t0)))


def _median_step(tmp_path, name, port, scraped: bool, iters: int = 80) -> tuple[float, dict]:
    stop, counts = threading.Event(), {}
    thread = threading.Thread(target=_scrape, args=([port, port + 1], stop, counts))
    if scraped:
        thread.start()
    run = run_trainer(tmp_path / name, 2, "--pipeline-model-parallel-size", "2",
                      "--train-iters", str(iters), "--no-profile", "--prometheus-port", str(port))
    stop.set()
    if scraped:
        thread.join(timeout=10)
    assert_ok(run)
    steps = [json.loads(x)["step_seconds"] for x in (run.out / "steps.jsonl").read_text().split()]
    return statistics.median(steps[10:]), counts


def test_concurrent_scrapes_do_not_slow_training(tmp_path):
    """Alternating runs (2 processes: the machine has 2 cores), exporter on in all of them;
    every other run is scraped 20 times a second per rank."""
    from promserver import free_ports

    # As many steps as make a run last about 5 s on this machine today (at least 80): the load
    # must span the steps it is to slow down, however fast the machine (a fixed 80 steps lasted
    # under 1 s, 18 scrapes, on a quiet day).
    step = _median_step(tmp_path, "calibrate", free_ports(2), False)[0]
    iters = max(80, math.ceil(5.0 / step))
    quiet, loaded = [], []
    with OtherWork() as other:
        for i in range(2):
            quiet.append(_median_step(tmp_path, f"quiet{i}", free_ports(2), False, iters)[0])
            median, counts = _median_step(tmp_path, f"loaded{i}", free_ports(2), True, iters)
            loaded.append(median)
            # the load really happened, on both ranks
            assert len(counts) == 2 and min(counts.values()) >= 40, counts
    ratio = statistics.median(loaded) / statistics.median(quiet)
    # the two unscraped runs differ only by the machine's other work: that is the noise, with the
    # share of the machine that other work took meanwhile (a steady load can leave the two alike)
    noise = max(max(quiet) / min(quiet) - 1, other.share or 0.0)
    print(f"\n{iters} steps a run; median step: quiet {quiet} loaded {loaded} ratio {ratio:.3f}; "
          f"other work {other.share}, noise {noise:.1%}")
    timing_verdict(ratio < 1.25, noise, 0.10, f"scraped runs {ratio:.2f}x the unscraped ones' step time")
