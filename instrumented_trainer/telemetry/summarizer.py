"""The rank's own `diag summarize` of its trace: started idle-class when the trace is written,
waited for when training ends.

While training runs the subprocess is idle-class (Linux SCHED_IDLE, through `chrt` so that its
start-up is idle-class too): it runs only on CPU time nothing else wants and never slows
training. At exit the rank waits for it, SUMMARY_WAIT_S at most. On a machine whose every core
other work keeps busy (a laptop running other jobs, a shared CPU node), an idle-class process
gets no CPU at all, and the wait would run its whole length for a summary that never comes. So
the wait watches it: when over a window of STARVED_WINDOW_S the cores it may run on had no idle
time and it got no CPU, it is restarted at the priority training had, whose CPU time is free
now. psutil reads both (the trainer's extra has it); without psutil the wait is the plain one.

The subprocess writes its messages to a private file, relayed with the rank's name when it
ends, never to the trainer's own stdout or stderr: one left running past the wait then holds no
pipe of whoever started the trainer (a script reading the trainer's output waits for the pipe's
end, not the trainer's).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .safe import rank

SUMMARY_WAIT_S = 120.0
STARVED_WINDOW_S = 5.0
STARVED_SHARE = 0.02    # under 2% of the window: the subprocess's CPU, and the idle of each of its cores
RELAY_CHARS = 4000


def kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants (found through psutil, where it is installed); one
    already gone is no error."""
    try:
        import psutil

        children = psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - no psutil, or the process is gone: the process itself below
        children = []
    for child in children:
        with contextlib.suppress(Exception):
            child.kill()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class _Watch:
    """Whether a process tree is starved: since the last look, it got (almost) no CPU and the
    cores it may run on had (almost) no idle time. Never starved when psutil cannot tell."""

    def __init__(self, pid: int) -> None:
        try:
            import psutil

            self._psutil, self._proc = psutil, psutil.Process(pid)
            self._cores = self._proc.cpu_affinity() if hasattr(self._proc, "cpu_affinity") else None
            self._last = self._read()
        except Exception:  # noqa: BLE001 - no psutil, or the process is gone: nothing to watch
            self._proc = None

    def _cpu_s(self) -> float:
        t = self._proc.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in self._proc.children(recursive=True):
            try:
                c = child.cpu_times()
                total += c.user + c.system
            except self._psutil.Error:
                pass
        return total

    def _idle_s(self) -> tuple[float, int]:
        """The idle (and I/O-wait) seconds of the cores the process may run on, and their count."""
        per = self._psutil.cpu_times(percpu=True)
        cores = [per[i] for i in self._cores if i < len(per)] if self._cores else per
        return sum(c.idle + getattr(c, "iowait", 0.0) for c in cores), len(cores)

    def _read(self) -> tuple[float, float, float, int]:
        idle, n = self._idle_s()
        return time.monotonic(), self._cpu_s(), idle, n

    def starved(self) -> bool:
        if self._proc is None:
            return False
        try:
            now = self._read()
        except Exception:  # noqa: BLE001 - gone between looks: it is ending, not starved
            return False
        (t0, cpu0, idle0, _), self._last = self._last, now
        window = now[0] - t0
        return window > 0 and now[1] - cpu0 < STARVED_SHARE * window and now[2] - idle0 < STARVED_SHARE * window * now[3]


class Summarizer:
    """`diag summarize` of one trace in a subprocess; `wait()` when training is done."""

    def __init__(self, trace: str) -> None:
        self.trace = trace
        self.restarted = False
        self.proc, self._log = self._start(idle=True)

    def _argv(self, idle: bool) -> list[str]:
        argv = [sys.executable, "-m", "diag", "summarize", "--quiet", *(["--idle"] if idle else []),
                "--shard", "0/1", self.trace]
        # --idle takes effect after Python's start-up and imports (~0.5 s of CPU, which slowed a
        # 2-core CPU run's next steps 2x); chrt makes the whole process idle-class.
        return ["chrt", "--idle", "0", *argv] if idle and shutil.which("chrt") else argv

    def _start(self, idle: bool):
        log = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(self._argv(idle), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=log,
                                    env={**os.environ, "DIAG_WORKERS": os.environ.get("DIAG_WORKERS", "2")})
        except BaseException:
            log.close()
            raise
        return proc, log

    def _kill(self) -> None:
        kill_tree(self.proc.pid)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()

    def _restart(self, starved_s: float) -> None:
        self._kill()
        self.restarted = True
        print(f"[rank {rank()}] trace summary: no idle CPU for {starved_s:.0f} s (other work holds every core "
              "it may run on); summarising at training's priority now that training is done",
              file=sys.stderr, flush=True)
        self.proc, self._log = self._start(idle=False)

    def _relay(self) -> str:
        """Print what the subprocess said, with the rank's name; return its last line."""
        self._log.seek(0)
        text = self._log.read().decode("utf-8", "replace")[-RELAY_CHARS:]
        self._log.close()
        lines = [x for x in text.splitlines() if x.strip()]
        for line in lines:
            print(f"[rank {rank()}] diag summarize: {line}", file=sys.stderr, flush=True)
        return lines[-1] if lines else ""

    def wait(self, budget_s: float = SUMMARY_WAIT_S, window_s: float = STARVED_WINDOW_S) -> None:
        """Until it ends, `budget_s` at most; restarted at normal priority once if starved. Raises
        RuntimeError when it failed or is not done (then it is left running, holding no pipe)."""
        deadline = time.monotonic() + budget_s
        watch = _Watch(self.proc.pid)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._log.close()
                raise RuntimeError(f"not done after {budget_s:.0f} s; left running "
                                   "(diag analyze reads the trace itself if it does not finish)")
            try:
                rc = self.proc.wait(timeout=min(window_s, left))
                break
            except subprocess.TimeoutExpired:
                pass
            if not self.restarted and watch.starved():
                self._restart(window_s)
                watch = _Watch(self.proc.pid)
        last = self._relay()
        if rc != 0:
            raise RuntimeError(f"`diag summarize` exited {rc}" + (f" ({last})" if last else "")
                               + "; diag analyze will read the trace itself")
