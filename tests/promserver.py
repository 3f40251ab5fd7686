"""Test helpers for the live-metrics tests: a real Prometheus server and a real trainer run.

`prometheus_server` starts the Debian `prometheus` binary on 127.0.0.1 with a temporary config
and data directory (1 s scrape and rule evaluation), waits a bounded time for it to be ready and
always kills it. `start_trainer` runs `python -m instrumented_trainer` in its own session so a
hung job is killed whole. Only loopback is used, and every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import statistics

from diag.ports import free_ports  # noqa: F401 - re-exported for the tests
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROM_DIR = ROOT / "dashboards" / "prometheus"
TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--vocab-size", "128", "--micro-batch-size", "2",
        "--global-batch-size", "8", "--seed", "7", "--dist-timeout", "60", "--no-profile"]


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def config_text(targets: list[str]) -> str:
    rules = [str(PROM_DIR / "rules" / f) for f in ("diag-recording.yml", "diag-alerts.yml")]
    return json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": rules,
        "scrape_configs": [{"job_name": "diag-test", "honor_labels": True,
                            "static_configs": [{"targets": targets}]}]})


@contextlib.contextmanager
def prometheus_server(tmp: Path, targets: list[str], ready_s: float = 60.0):
    """Yields the server's base URL; the process is killed on exit whatever happens."""
    port = free_ports(1)
    (tmp / "prometheus.yml").write_text(config_text(targets))
    cmd = ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
           f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
           "--log.level=warn"]
    log = open(tmp / "prometheus.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_s
        while True:
            with contextlib.suppress(OSError):
                if get(f"{url}/-/ready", 1.0):
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                log_text = (tmp / "prometheus.log").read_text()
                raise RuntimeError(f"prometheus did not start: {log_text}")
            time.sleep(0.2)
        yield url
    finally:
        _kill(proc)
        log.close()


def query(url: str, expr: str, at: float | None = None) -> list[dict]:
    """An instant query through the HTTP API; raises on an invalid expression."""
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    body = json.loads(get(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}"))
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def start_trainer(out: Path, base_port: int, iters: int, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "instrumented_trainer", "--nproc", "2",
           "--pipeline-model-parallel-size", "2", "--train-iters", str(iters), "--out", str(out),
           "--prometheus-port", str(base_port), *TINY, *args]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def iters_lasting(seconds: float, out: Path, floor: int) -> int:
    """Train iterations that take about `seconds` on this machine today, at least `floor`: a test
    that watches a live run needs it to outlast its scrapes however fast the machine is."""
    proc = start_trainer(out, free_ports(2), 40)
    code, _, err = finish(proc)
    if code != 0:
        raise RuntimeError(f"calibration run failed ({code}): {err[-3000:]}")
    steps = [json.loads(x)["step_seconds"] for x in (out / "steps.jsonl").read_text().split()]
    return max(floor, math.ceil(seconds / statistics.median(steps)))


def scrape(ports: list[int], stop, seen: dict, per_second: float = 20.0, limit_s: float = 300.0):
    """GET every port's /metrics `per_second` times a second until the event `stop` is set (or
    `limit_s` passed), as a busy Prometheus would; `seen[port]` gets the `diag_steps_total` value
    of every answer that had one, in order. Ports not up yet (or gone) are tried again."""
    import http.client

    deadline = time.monotonic() + limit_s
    while not stop.is_set() and time.monotonic() < deadline:
        t0 = time.monotonic()
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except (OSError, http.client.HTTPException):
                continue  # not up yet, or already gone
            for line in text.splitlines():
                if line.startswith("diag_steps_total{"):
                    seen.setdefault(port, []).append(float(line.rsplit(" ", 1)[1]))
        stop.wait(max(0.0, 1.0 / per_second - (time.monotonic() - t0)))


def finish(proc: subprocess.Popen, timeout: float = 180.0) -> tuple[int, str, str]:
    """Wait for the trainer (killed whole after `timeout`); returns (code, stdout, stderr)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, err = proc.communicate()
        return -9, out, err
    return proc.returncode, out, err


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
