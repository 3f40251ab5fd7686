"""Background sampling of device metrics into `<out>/metrics-rank-<r>.jsonl`.

Utilisation, memory, power and clocks tell whether a slow step was starved (low utilisation),
throttled (clock/power) or memory-bound. On a GPU they come from NVML; without NVML (CPU runs,
or a machine without the driver) the sampler falls back to host metrics from psutil (process
CPU %, RSS, system CPU %). A daemon thread samples every `interval` seconds, so the training
thread never waits on it; a failing source disables itself with one warning.
"""

from __future__ import annotations

import threading
import time

from .safe import JsonlWriter, guard, warn_once


class NvmlSource:
    """GPU metrics of one device through NVML (nvidia-ml-py)."""

    kind = "nvml"

    def __init__(self, index: int) -> None:
        import pynvml  # optional: only present with the trainer extra

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def sample(self) -> dict:
        n, h = self.nvml, self.handle
        util = n.nvmlDeviceGetUtilizationRates(h)
        mem = n.nvmlDeviceGetMemoryInfo(h)
        return {"gpu_util_percent": util.gpu, "mem_util_percent": util.memory,
                "mem_used_bytes": mem.used, "mem_total_bytes": mem.total,
                "power_watts": n.nvmlDeviceGetPowerUsage(h) / 1e3,
                "sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)}


class HostSource:
    """Host metrics of this process through psutil."""

    kind = "host"

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)  # the first call only starts the measurement interval

    def sample(self) -> dict:
        return {"process_cpu_percent": self.proc.cpu_percent(None),
                "rss_bytes": self.proc.memory_info().rss,
                "system_cpu_percent": self.psutil.cpu_percent(None)}


def open_source(prefer_gpu: bool, device_index: int):
    """NVML when asked for and available, else psutil; None if neither works."""
    if prefer_gpu:
        try:
            return NvmlSource(device_index)
        except Exception as exc:  # noqa: BLE001 - missing NVML is a normal, reported case
            warn_once("nvml metrics (falling back to host metrics)", exc)
    try:
        return HostSource()
    except Exception as exc:  # noqa: BLE001
        warn_once("host metrics", exc)
        return None


class MetricsSampler:
    """Context manager running a sampling thread for the duration of training."""

    def __init__(self, path: str, rank: int, interval: float, prefer_gpu: bool,
                 device_index: int = 0, enabled: bool = True) -> None:
        self.rank, self.interval = rank, interval
        self.source = open_source(prefer_gpu, device_index) if enabled else None
        self.writer = JsonlWriter(path, "metrics") if self.source else None
        self.latest: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="diag-metrics", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)

    def sample_once(self) -> None:
        if self.source is None or self.writer is None:
            return
        try:
            record = {"time": time.time(), "rank": self.rank, "source": self.source.kind,
                      **self.source.sample()}
        except Exception as exc:  # noqa: BLE001
            warn_once("metrics sampling", exc)
            self.source = None
            return
        self.latest = record
        self.writer.append(record)
        self.writer.flush()

    def __enter__(self) -> "MetricsSampler":
        if self.source is not None:
            with guard("metrics thread"):
                self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sample_once()  # a last sample so even a short run has one
        if self.writer is not None:
            self.writer.close()
