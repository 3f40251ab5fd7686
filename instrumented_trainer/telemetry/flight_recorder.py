"""PyTorch's Flight Recorder kept on, and every rank's buffer dumped when it matters.

On a stuck or slow job the profiler has nothing; the Flight Recorder (a ring buffer of the last
N collectives per process, `TORCH_FR_BUFFER_SIZE`) says which rank never entered which collective.
It must be configured before the process group exists, so `FlightRecorder` is entered before
training starts. It dumps this rank's buffer as JSON (`_dump_fr_trace_json`) into
`<out>/flightrec/rank-<r>.json`: when training raises (a collective timed out, a rank failed),
on SIGUSR1 and SIGTERM (a launcher stopping a stuck job), and at the end of the run.

Each dump says why and when it was taken: a top-level `diag_dump` object ({reason: failure |
SIGUSR1 | SIGTERM | end, time_ns, buffer_size, buffer_size_from}) beside torch's own keys, which
torch's readers (fr_trace) ignore; diag reads it to tell a snapshot of a healthy run from a hang.

The buffer's size: --flight-recorder-entries when given (it overrides TORCH_FR_BUFFER_SIZE), else
TORCH_FR_BUFFER_SIZE from the environment, else 2000; rank 0 logs which, and every dump records it.

Signals: a rank stuck in a collective is blocked in C++, where a Python handler would never run;
so the handler only wakes a dumper thread through `signal.set_wakeup_fd`, which the interpreter
writes from its C-level handler whatever the main thread is doing. Every failure is a warning
(telemetry.safe): the recorder never stops training.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

from diag.trace.safeio import atomic_write
from instrumented_trainer.telemetry.safe import guard, rank

DUMP_FOLDER = "flightrec"         # diag.trace.flightrec.DUMP_FOLDERS looks here


class FlightRecorder:
    """Context manager around a rank's training: on, and dumped on failure, signals and exit."""

    def __init__(self, out: str, entries: int, source: str = "default") -> None:
        self.entries, self.source = entries, source
        self.folder = os.path.join(out, DUMP_FOLDER)
        self._lock = threading.Lock()
        self._wake = None

    def __enter__(self) -> "FlightRecorder":
        if self.entries <= 0:
            return self
        os.environ["TORCH_FR_BUFFER_SIZE"] = str(self.entries)   # resolved by cli.fr_entries: the flag wins
        if rank() == "0":
            print(f"flight recorder: {self.entries} entries per rank (from {self.source})", file=sys.stderr, flush=True)
        # NCCL (gloo ignores these): durations, and the watchdog's own pickle dump on a timeout here too
        os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
        os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(self.folder, "nccl_trace_rank_"))
        with guard("flight recorder folder"):   # NCCL's watchdog writes there itself; unwritable: a warning
            os.makedirs(self.folder, exist_ok=True)
        with guard("flight recorder signals"):
            self._listen()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.entries > 0:
            self.dump("failure" if exc_type else "end")

    def dump(self, why: str) -> None:
        """Write this rank's buffer; never raises (a dump is evidence, not a reason to stop)."""
        with guard("flight recorder dump"), self._lock:
            import torch  # noqa: PLC0415 - imported where training already runs

            data = with_reason(_buffer_json(torch._C._distributed_c10d), why, self.entries, self.source)
            os.makedirs(self.folder, exist_ok=True)     # here, under the guard: an unwritable --out only warns
            path = os.path.join(self.folder, f"rank-{rank()}.json")
            # whole or absent (diag never reads half a dump), through an exclusive temporary: a
            # link planted at a predictable name is never followed
            atomic_write(path, data)

    def _listen(self) -> None:
        """SIGUSR1: dump; SIGTERM: dump, then exit."""
        if threading.current_thread() is not threading.main_thread():
            return
        prev = signal.set_wakeup_fd(-1)
        if prev != -1:       # someone else's: leave it, and go without signal dumps
            signal.set_wakeup_fd(prev)
            return
        r, w = socket.socketpair()
        r.setblocking(True)
        w.setblocking(False)
        signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        self._wake = (r, w)
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, lambda *_: None)     # the dumper thread acts; see the module docstring
        threading.Thread(target=self._dumper, args=(r,), name="flight-recorder", daemon=True).start()

    def _dumper(self, r: socket.socket) -> None:
        while True:
            try:
                got = r.recv(64)
            except OSError:
                return
            for sig in got:
                if sig == signal.SIGUSR1:
                    self.dump("SIGUSR1")
                elif sig == signal.SIGTERM:      # stopped: dump, then end as a SIGTERM would (a shell's
                    self.dump("SIGTERM")         # 128 + 15); only the main thread may reset a handler
                    os._exit(128 + signal.SIGTERM)


def _buffer_json(c10d) -> bytes:
    """The recorder's buffer as JSON. A CUDA build keeps NCCL's collectives in a recorder of their
    own (`_dump_nccl_trace_json`; torch 2.11 on an H100: `_dump_fr_trace_json` gave an empty dump
    for an NCCL job), the generic one holds gloo's: NCCL's when it recorded anything, else the
    generic one."""
    def dump(fn) -> bytes:
        data = fn(True, False)
        return data if isinstance(data, bytes) else data.encode()
    nccl = getattr(c10d, "_dump_nccl_trace_json", None)
    if nccl is not None:
        data = dump(nccl)
        if b'"entries"' in data:
            return data
    return dump(c10d._dump_fr_trace_json)


def with_reason(data: bytes, why: str, entries: int, source: str) -> bytes:
    """torch's JSON dump with `diag_dump` (why and when it was taken) as its first key; the rest of
    the bytes as torch wrote them. A dump that is not a JSON object is left as it is."""
    head = data.lstrip()
    if not head.startswith(b"{"):
        return data
    note = json.dumps({"reason": why, "time_ns": time.time_ns(), "buffer_size": entries,
                       "buffer_size_from": source}).encode()
    rest = head[1:].lstrip()
    return b'{"diag_dump": ' + note + (b"" if rest.startswith(b"}") else b", ") + rest


class SeqReader:
    """Per process group, the sequence number of the last operation this rank entered and
    completed (the recorder's `pg_status`; it counts point-to-point operations too), for /metrics.

    Read at scrape time from the recorder's small status part, keyed by the local pg id. The id ->
    (name, description) map comes from the entries, read in full only when an unknown id shows up
    (a new group, once), so a scrape reads the status only: 0.017 ms against 0.5 s for a dump of
    2000 entries (measured on the shared 2-core machine, json.loads included). Gloo records no send/recv entries,
    so a group with only those (a pipeline's) is named from torch's own table of this process's
    groups in creation order (the order the ids are given in), used only where it agrees with
    every id the entries name.
    """

    def __init__(self) -> None:
        self._names: dict[str, tuple[str, str]] = {}
        self._tried: set[str] = set()      # ids looked up once already: never a full dump per scrape

    def groups(self) -> list[tuple[str, str, int, int]]:
        """[(pg name, description, last entered, last completed)]; [] when the recorder is off."""
        import json

        import torch  # noqa: PLC0415 - only in a trainer process

        c10d = torch._C._distributed_c10d
        status = json.loads(c10d._dump_fr_trace_json(False, False)).get("pg_status", {})
        if any(pg not in self._names and pg not in self._tried for pg in status):
            self._tried |= set(status)
            named = {str(e["pg_id"]): tuple(e["process_group"])
                     for e in json.loads(c10d._dump_fr_trace_json(True, False)).get("entries", [])}
            table = _creation_order()
            self._names = {**table, **named} if all(table.get(k) == v for k, v in named.items()) else named
        return [(*self._names[pg], int(v["last_enqueued_collective"]), int(v["last_completed_collective"]))
                for pg, v in sorted(status.items()) if pg in self._names]


def _creation_order() -> dict[str, tuple[str, str]]:
    """Local pg id -> (name, description) as torch created this process's groups."""
    from torch.distributed import distributed_c10d as c10d  # noqa: PLC0415

    return {str(i): (name, getattr(pg, "group_desc", "") or "")
            for i, (pg, name) in enumerate(c10d._world.pg_names.items())}
