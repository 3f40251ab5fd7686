"""Single-machine launcher: `python -m instrumented_trainer --nproc N ...` without torchrun.

Starts N copies of the trainer with the environment torchrun would give them (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, a free MASTER_PORT) and watches them: if one fails, the
others are terminated rather than left hanging in a collective until their timeout, and the
launcher returns the first failing exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from diag.ports import free_port


def _child_env(rank: int, world: int, port: int, command: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               DIAG_COMMAND=command, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    return env


def _terminate(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def spawn(world: int, argv: list[str], command: str, module: str = "instrumented_trainer",
          what: str = "trainer") -> int:
    """Run `world` processes of `python -m module`; 0 if all succeed, else the first failure's code."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", module, *argv],
                              env=_child_env(rank, world, port, command))
             for rank in range(world)]
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                print(f"error: a {what} process exited with code {failed[0]}; stopping the "
                      f"others", file=sys.stderr)
                _terminate(procs)
                return failed[0] if failed[0] > 0 else 1
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.1)
    except KeyboardInterrupt:
        _terminate(procs)
        return 130
