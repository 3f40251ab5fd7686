"""Read a trace's bytes while the analysis is still being imported.

`diag analyze FILE` spends its first ~0.1-0.2 s importing numpy and the analysis, on one core,
and then reads and (for .json.gz) inflates the file. The reading needs none of those imports
and the inflate (ISA-L or zlib) lets go of the GIL, so it is started first, in a thread, and
read.read_bytes takes its result when the loader asks for that file. Only a single file is read
ahead (a directory's ranks may go to worker processes), and a failure is the loader's to report:
the thread keeps the exception and read_bytes raises it, as if it had read the file itself.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional

_AHEAD: dict[str, "_Ahead"] = {}
# Set by `diag analyze FILE` (entry.read_ahead), a one-shot process that ends without the
# interpreter's teardown: the bytes read ahead are then kept to the end instead of being freed
# after the load (~3 ms to give back the pages of a 50 MB trace, on the one core the analysis has
# left). Any other process (the dashboard, `diag tune`, the tests) frees them.
KEPT: list = []
KEEP_TO_EXIT = False


class _Ahead(threading.Thread):
    def __init__(self, path: str, read: Callable[[str], Any]) -> None:
        super().__init__(name="diag-prefetch", daemon=True)
        self.path, self.read = path, read
        self.data: Any = None
        self.error: Optional[BaseException] = None
        self.decoding = False             # decode_ahead has been asked for

    def run(self) -> None:
        try:
            self.data = self.read(self.path)
        except BaseException as e:        # handed to the loader, which reports it (TraceError)
            self.error = e


def start(path: str) -> None:
    """Begin reading path's bytes (read.read_bytes) in a thread when it is one regular file."""
    if path in _AHEAD or os.environ.get("DIAG_NO_PREFETCH") or not os.path.isfile(path):
        return
    from .read import read_file        # light: no numpy, no decoder

    ahead = _AHEAD[path] = _Ahead(path, read_file)
    ahead.start()


def single(path: str, use_summaries: bool = True) -> None:
    """Read one trace file ahead (start) and decode its events ahead (decode_ahead), unless its
    summary (`diag summarize`) is what will be read."""
    from .discover import SUMMARY_SUFFIX

    if not (use_summaries and os.path.exists(path + SUMMARY_SUFFIX)):
        start(path)
        decode_ahead(path)


def take(path: str) -> tuple[bool, Any]:
    """(True, bytes) when path was read ahead (waiting for the thread to finish), else (False,
    None). Raises what the read raised. Each read-ahead is taken once."""
    ahead = _AHEAD.pop(path, None)
    if ahead is None:
        return False, None
    ahead.join()
    if ahead.error is not None:
        raise ahead.error
    if KEEP_TO_EXIT:
        KEPT.append(ahead.data)
    return True, ahead.data


def decode_ahead(path: str) -> None:
    """Once path's bytes, read ahead (start), are there, fork workers that decode its events
    (chunks.decode_ahead) while this process goes on importing the analysis on the other core.
    Imports numpy and the decoder (this process needs them anyway; the workers inherit them) and
    waits for the read first: no thread runs when the workers are forked (none is forked where
    other threads run, as in the dashboard's server)."""
    ahead = _AHEAD.get(path)
    if ahead is None or ahead.decoding:
        return
    ahead.decoding = True
    from . import chunks

    if not chunks.forks():
        return
    ahead.join()
    if ahead.error is None and threading.active_count() == 1:     # a server's threads: no fork here
        chunks.decode_ahead(path, ahead.data)
