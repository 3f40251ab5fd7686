"""A rank's heartbeat to our own launcher: the step it is on, in a file the launcher watches.

gloo's timeouts do not fire on a stopped peer in every operation (a rank under SIGSTOP left a job
silent for minutes with --dist-timeout 30), so the launcher (launch.Watchdog) tears the job down
itself when a rank makes no progress for longer than the timeout. Progress is the training
loop's: one small positioned write per step to `<DIAG_HEARTBEAT_DIR>/rank-<r>` (a directory the
launcher made with mkdtemp, so no other user can plant a name there), and "done" after the last
step (from then on only a stopped process counts as stalled: exporting traces takes its time);
"hold" around the profiler's step, whose trace export may outlast any training step.
Under torchrun, or with the variable unset, it does nothing; a failing write warns once and
training goes on.
"""

from __future__ import annotations

import os

from .safe import guard

ENV = "DIAG_HEARTBEAT_DIR"
DONE = "done"
HOLD = "hold"                              # busy outside training (trace export): not a stall
WIDTH = 24                                 # fixed: each beat overwrites the last in place


def beat_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank-{rank}")


def read_beat(path: str) -> str:
    """What a rank last said: its step number, DONE, or '' (launcher side)."""
    try:
        with open(path, "rb") as f:
            return f.read(WIDTH).decode("ascii", "replace").strip()
    except OSError:
        return ""


class Heartbeat:
    def __init__(self, rank: int, folder: str | None = None) -> None:
        folder = os.environ.get(ENV) if folder is None else folder
        self.fd = None
        if folder:
            with guard("heartbeat"):
                self.fd = os.open(beat_path(folder, rank), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)

    def _say(self, text: str) -> None:
        if self.fd is None:
            return
        with guard("heartbeat"):
            os.pwrite(self.fd, text.ljust(WIDTH).encode("ascii"), 0)

    def beat(self, step: int) -> None:
        self._say(str(step))

    def hold(self) -> None:
        self._say(HOLD)

    def done(self) -> None:
        self._say(DONE)
        if self.fd is not None:
            with guard("heartbeat"):
                os.close(self.fd)
            self.fd = None
