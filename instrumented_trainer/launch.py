"""Single-machine launcher: `python -m instrumented_trainer --nproc N ...` without torchrun.

Starts N copies of the trainer with the environment torchrun would give them (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, a free MASTER_PORT) and watches them: if one fails, the
others are terminated rather than left hanging in a collective until their timeout, and the
launcher returns the first failing exit code. If one stops making progress (SIGSTOP, a hang)
for longer than the job's --dist-timeout, the job is torn down with a message naming the rank
(Watchdog; gloo does not time out on a stopped peer in every operation). If the launcher itself
dies, even by SIGKILL, the kernel kills its ranks (PR_SET_PDEATHSIG), so none trains on alone.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from diag.ports import free_port

from .telemetry.heartbeat import DONE, ENV, HOLD, beat_path, read_beat

_PR_SET_PDEATHSIG = 1


def gpu_for(local_rank: int, gpus: int) -> int:
    """This rank's GPU: its local rank, or, with more local ranks than GPUs (a one-GPU laptop or
    test machine), local rank modulo the GPUs. NCCL refuses two ranks of one host on one GPU
    ("Duplicate GPU detected"), so ranks that share are each given a host identity of their own
    (NCCL_HOSTID, unless already set) and talk over sockets: the traces are real NCCL, but the
    timings are not a node's (no NVLink, and the ranks' kernels take turns on the GPU)."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if gpus <= 0 or local_world <= gpus:
        return local_rank
    if "NCCL_HOSTID" not in os.environ:
        os.environ["NCCL_HOSTID"] = f"{socket.gethostname()}-diag-rank{local_rank}"
        if int(os.environ.get("WORLD_SIZE", 1)) == local_world:
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")  # one node: loopback reaches all
    if local_rank == 0:
        print(f"warning: {local_world} ranks share {gpus} GPU(s); NCCL between them goes over "
              "sockets (NCCL_HOSTID per rank): the traces are real, the timings not a node's",
              file=sys.stderr, flush=True)
    return local_rank % gpus


def _child_env(rank: int, world: int, port: int, command: str, beats: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               DIAG_COMMAND=command, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    if beats:
        env[ENV] = beats
    return env


def _die_with(parent: int):
    """preexec_fn: the child gets SIGKILL when the launcher dies (Linux; elsewhere nothing).
    If the launcher died before prctl took effect, the child exits at once."""
    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:
            os._exit(1)
    return arm


def _terminate(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()                       # works on a stopped process too
            p.wait()


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, a debugger): state T or t in /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


class Watchdog:
    """Which rank, if any, has made no progress for longer than timeout_s: stopped as a process,
    or (between its first step and its last) no new step. Polled by spawn's loop."""

    def __init__(self, procs: list[subprocess.Popen], beats: str, timeout_s: float | None) -> None:
        self.procs, self.beats, self.timeout_s = procs, beats, timeout_s
        self.stopped_since: dict[int, float] = {}

    def stalled(self) -> str | None:
        if not self.timeout_s:
            return None
        now, wall, stale, stopped = time.monotonic(), time.time(), [], []
        for rank, p in enumerate(self.procs):
            if p.poll() is not None:
                continue
            if _stopped(p.pid):
                since = self.stopped_since.setdefault(rank, now)
                stopped.append((now - since, f"rank {rank} (pid {p.pid}) has been stopped for {now - since:.0f} s"))
                continue
            self.stopped_since.pop(rank, None)
            said = read_beat(beat_path(self.beats, rank))
            if said and said not in (DONE, HOLD):
                idle = wall - os.path.getmtime(beat_path(self.beats, rank))
                if idle > self.timeout_s:
                    stale.append(f"rank {rank} (pid {p.pid}, at step {said}, {idle:.0f} s)")
        past = f"past --dist-timeout {self.timeout_s:g} s"
        cause = "; ".join(why for _, why in sorted(stopped, reverse=True))
        if stopped and (stale or max(t for t, _ in stopped) > self.timeout_s):
            return cause + f" ({past})" + ("; no training progress on " + ", ".join(stale) if stale else "")
        if stale:                    # alive but stuck (no rank stopped)
            return f"no training progress {past} on " + ", ".join(stale)
        return None


def spawn(world: int, argv: list[str], command: str, module: str = "instrumented_trainer",
          what: str = "trainer", timeout_s: float | None = None) -> int:
    """Run `world` processes of `python -m module`; 0 if all succeed, else the first failure's code.
    timeout_s: tear the job down when a rank makes no progress for that long (Watchdog)."""
    port = free_port()
    beats = tempfile.mkdtemp(prefix="diag-heartbeat-")
    procs = [subprocess.Popen([sys.executable, "-m", module, *argv],
                              env=_child_env(rank, world, port, command, beats),
                              preexec_fn=_die_with(os.getpid()))
             for rank in range(world)]
    watchdog = Watchdog(procs, beats, timeout_s)
    try:
        return _watch(procs, watchdog, what)
    except KeyboardInterrupt:
        _terminate(procs)
        return 130
    finally:
        shutil.rmtree(beats, ignore_errors=True)


def _watch(procs: list[subprocess.Popen], watchdog: Watchdog, what: str) -> int:
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:                  # a peer's own timeout may fire first: still name a stopped rank
            stopped = "".join(f"; rank {r} (pid {p.pid}) has been stopped" for r, p in enumerate(procs)
                              if p.poll() is None and _stopped(p.pid))
            print(f"error: a {what} process exited with code {failed[0]}{stopped}; stopping the "
                  f"others", file=sys.stderr)
            _terminate(procs)
            return failed[0] if failed[0] > 0 else 1
        if all(c == 0 for c in codes):
            return 0
        stall = watchdog.stalled()
        if stall:
            print(f"error: {stall}; stopping the job", file=sys.stderr, flush=True)
            _terminate(procs)
            return 1
        time.sleep(0.1)
