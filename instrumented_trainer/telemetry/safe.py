"""Telemetry must never break training.

Every piece of instrumentation runs behind `guard`: the first failure of a given kind prints one
warning on stderr (with the rank, so a multi-rank log says who failed) and the instrumentation
stays quiet afterwards; training goes on. Failures are counted so a run summary or a test can see
them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter

failures: Counter[str] = Counter()


def rank() -> str:
    """This process's rank as its launcher set it (RANK; "0" when run alone), for messages and file names."""
    return os.environ.get("RANK", "0")


def warn_once(what: str, exc: BaseException) -> None:
    """Record a telemetry failure; print a warning the first time `what` fails."""
    failures[what] += 1
    if failures[what] == 1:
        print(f"[rank {rank()}] warning: telemetry '{what}' disabled after error: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def guard(what: str):
    """Run the body; on any exception warn once and continue after the block."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the point is to never let telemetry raise
        warn_once(what, exc)


class JsonlWriter:
    """Buffered JSON-lines file; opening or writing failures disable it with one warning."""

    def __init__(self, path: str, what: str) -> None:
        self.path, self.what = path, what
        self._lines: list[str] = []
        self._file = None
        self._broken = False
        with guard(what):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._file = open(path, "w", encoding="utf-8")
        self._broken = self._file is None

    def append(self, record: dict) -> None:
        if self._broken:
            return
        import json  # local: keeps module import cheap

        with guard(self.what):
            self._lines.append(json.dumps(record, separators=(",", ":")))

    def flush(self) -> None:
        if self._broken or not self._lines:
            self._lines.clear()
            return
        lines, self._lines = self._lines, []
        try:
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
        except Exception as exc:  # noqa: BLE001
            self._broken = True
            warn_once(self.what, exc)

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            with guard(self.what):
                self._file.close()
            self._file = None
            self._broken = True
