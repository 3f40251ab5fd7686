"""Helpers for the trainer tests: run `python -m instrumented_trainer` as a real job.

Every run gets its own output directory, a free port (chosen by the launcher), a wall-clock
timeout, and its own process group (session) so that a hung job is killed whole, children
included, instead of leaving processes behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "32", "--vocab-size", "128", "--micro-batch-size", "2",
        "--global-batch-size", "8", "--seed", "7", "--dist-timeout", "60"]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    def losses(self) -> list[float]:
        lines = (self.out / "steps.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines]


def run_trainer(out: Path, nproc: int, *args: str, timeout: float = 300.0) -> Run:
    cmd = [sys.executable, "-m", "instrumented_trainer", "--nproc", str(nproc),
           "--out", str(out), *TINY, *args]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"trainer timed out after {timeout}s: {' '.join(cmd)}\n{stderr[-3000:]}")
    return Run(proc.returncode, stdout, stderr, out)


def assert_ok(run: Run) -> None:
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"


def run_workers(module: str, out: Path, nproc: int, *args: str, timeout: float = 300.0) -> list[dict]:
    """Run `python -m module OUT ARGS` as `nproc` ranks of one job (the environment torchrun
    gives); returns each rank's `rank-<r>.json` record."""
    from diag.ports import free_port

    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs.append(subprocess.Popen([sys.executable, "-m", module, str(out), *TINY, *args],
                                      cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        pytest.fail(f"{module} timed out after {timeout}s")
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nproc)]
