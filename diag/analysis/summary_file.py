"""A rank's summary on disk: `<trace>.diagsum`, next to the trace it was made from.

MessagePack (msgspec), arrays as raw little-endian bytes with their dtype: compact, fast, and
safe to read from anyone (plain data; no pickle, nothing executed). A summary records which
trace it was made from (its size and a fingerprint of its first and last MiB), so a reader can
tell a summary of the trace in front of it from a stale one, and the summary of a trace that
could not be read records why, so the rank is reported as a problem wherever it is merged.
"""
from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from typing import Any, Optional

import msgspec
import numpy as np

from ..trace.errors import TraceError
from .rankpass import RankSummary

SUFFIX = ".diagsum"
FORMAT = "diag-rank-summary"
VERSION = 3                           # 2: axes of layout.AXES, process groups; 3: gloo lanes, waits
_EDGE = 1 << 20                       # bytes fingerprinted at each end of the trace
_DTYPES = {"|b1", "|i1", "<i2", "<i4", "<i8", "<f8"}
MAX_SUMMARY_BYTES = 1 << 30


@dataclass
class SummaryFile:
    format: str
    version: int
    trace: str                        # the trace's path when the summary was made
    trace_bytes: int
    fingerprint: str
    made_by: str                      # "host pid"
    problem: Optional[str] = None     # why the trace could not be read (then no summary)
    summary: Optional[RankSummary] = None


def summary_path(trace: str, out_dir: Optional[str] = None) -> str:
    name = os.path.basename(trace) + SUFFIX
    return os.path.join(out_dir if out_dir else os.path.dirname(os.path.abspath(trace)), name)


def fingerprint(path: str) -> tuple[int, str]:
    """(size, digest of the first and last MiB): cheap on a 2 GB trace, changes when it does."""
    size = os.path.getsize(path)
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        h.update(f.read(_EDGE))
        if size > _EDGE:
            f.seek(max(_EDGE, size - _EDGE))
            h.update(f.read(_EDGE))
    return size, h.hexdigest()


def _enc(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        if a.dtype.str not in _DTYPES or a.ndim != 1:
            raise TypeError(f"array of {a.dtype.str} x {a.shape} has no summary encoding")
        return {"dtype": a.dtype.str, "data": a.tobytes()}
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    raise TypeError(f"{type(obj).__name__} has no summary encoding")


def _dec(typ: type, obj: Any) -> Any:
    if typ is np.ndarray:
        if not (isinstance(obj, dict) and obj.get("dtype") in _DTYPES and isinstance(obj.get("data"), bytes)):
            raise ValueError("not an encoded array")
        dt = np.dtype(obj["dtype"])
        if len(obj["data"]) % dt.itemsize:
            raise ValueError("array bytes not a whole number of items")
        return np.frombuffer(bytearray(obj["data"]), dtype=dt)      # writable: the merge fills in axes
    raise NotImplementedError(typ)


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc)
_DECODER = msgspec.msgpack.Decoder(SummaryFile, dec_hook=_dec)


def write(path: str, sf: SummaryFile) -> None:
    """Atomically: a reader never sees half a summary under the final name."""
    data = _ENCODER.encode(sf)
    tmp = f"{path}.{os.getpid()}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def make(trace: str, summary: Optional[RankSummary], problem: Optional[str] = None) -> SummaryFile:
    try:
        size, fp = fingerprint(trace)
    except OSError:
        size, fp = -1, ""
    return SummaryFile(format=FORMAT, version=VERSION, trace=os.path.abspath(trace), trace_bytes=size,
                       fingerprint=fp, made_by=f"{socket.gethostname()} {os.getpid()}",
                       problem=problem, summary=summary)


def read(path: str) -> SummaryFile:
    """A summary file, checked; raises TraceError naming the file and the problem."""
    try:
        if os.path.getsize(path) > MAX_SUMMARY_BYTES:
            raise TraceError(path, f"summary larger than {MAX_SUMMARY_BYTES:,} bytes: not a diag summary")
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    try:
        sf = _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
        raise TraceError(path, f"not a diag summary (or a corrupt one): {e}") from None
    if sf.format != FORMAT:
        raise TraceError(path, f"not a diag summary (format {sf.format!r})")
    if sf.version != VERSION:
        raise TraceError(path, f"summary format version {sf.version}, this diag reads {VERSION}: "
                               "run `diag summarize` again")
    if sf.summary is not None:
        _check(path, sf.summary)
    elif not sf.problem:
        raise TraceError(path, "summary holds neither a rank nor a problem")
    return sf


def _check(path: str, s: RankSummary) -> None:
    rc, g = s.comms, s.gantt
    n = len(rc.coll)
    cols = (rc.axis, rc.group_size, rc.nbytes, rc.start_ns, rc.dur_ns, rc.exposed_ns, rc.step)
    ok = all(len(c) == n for c in cols) and len(rc.group) == n
    ok &= all(len(a) == len(b) for a, b in (rc.compute, g.backward, g.optimizer))
    ok &= len({len(g.number), len(g.host_ns), len(g.lo_ns), len(g.hi_ns)}) == 1
    if not ok:
        raise TraceError(path, "corrupt summary: its columns differ in length")


def matches(sf: SummaryFile, trace: str) -> bool:
    """Was this summary made from this trace file (as it is now)?"""
    try:
        return (sf.trace_bytes, sf.fingerprint) == fingerprint(trace)
    except OSError:
        return False
