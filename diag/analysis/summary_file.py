"""A rank's summary on disk: `<trace>.diagsum`, next to the trace it was made from.

MessagePack (msgspec), arrays as raw little-endian bytes with their dtype: compact, fast, and
safe to read from anyone (plain data; no pickle, nothing executed). A summary records which
trace it was made from (its size and a digest of all its bytes), so a reader can tell a summary
of the trace in front of it from a stale one (a trace edited anywhere, its size kept), and the summary of a trace that
could not be read records why, so the rank is reported as a problem wherever it is merged.

A summary is trusted only after its own bytes verify: the file is an envelope (format, version,
a BLAKE2b digest, the payload), and the payload is decoded only when its digest matches, so one
flipped bit is a corrupt summary (then the trace is read, or the rank is a problem), never a
silently different number. Decoded, its values are checked too (summary_check): every array of
the integer dtype its field has, no NaN or negative time, a breakdown that adds up.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import msgspec
import numpy as np

from ..trace.discover import SUMMARY_SUFFIX
from ..trace.safeio import atomic_write, open_regular, read_regular
from ..trace.errors import TraceError
from .rankpass import RankSummary
from .summary_check import check_values
from ..record import record

SUFFIX = SUMMARY_SUFFIX     # one place: trace.discover, which tells summaries from traces
FORMAT = "diag-rank-summary"
VERSION = 18         # 2: axes of layout.AXES, process groups; 3: gloo lanes, waits; 4: digest envelope;
                     # 5: memory; pipeline actions' start and end (the Gantt's labels); host_ops;
                     # 6: the trace's fingerprint over all its bytes (was its first and last MiB);
                     # 7: an op's axis from its own process group's description (same-member groups)
                     # 8: host_ops' FSDP2 host time; 9: a functional collective's whole call and
                     # the wrap of its output (gloo); 10: host_ops' Python dispatch modes apart;
                     # 11: host_ops' non-ATen figures are self time added up (were calls x median);
                     # 12: RankResult.backward (the backward's compute and its weight gradients' parts)
                     # 13: host_ops' FSDP2 waits and communication apart, the breakdown's compute without them
                     # 14: the trace header's host_name (a pipeline transfer timed on one host's clock)
                     # 15: RankResult.action_gaps (the idle between consecutive pipeline actions)
                     # 16: RankSummary.start_epoch_ns (the host's clock to the ns: baseTimeNanoseconds kept whole)
                     # 17: PPTrace.post_step, post_ns (each transfer's post on the main thread)
                     # 18: ActionGaps' idle on a host timeline not covered by transfers in flight (ppactions.host_gap_busy)
_PIECE = 1 << 20                      # bytes hashed at a time
_DTYPES = {"|b1", "|i1", "<i2", "<i4", "<i8", "<f8"}
MAX_SUMMARY_BYTES = 1 << 30


class _Head(msgspec.Struct):
    """What every version's file starts with: told apart before anything else is decoded."""
    format: str = ""
    version: int = 0


class _Envelope(msgspec.Struct):
    format: str
    version: int
    digest: bytes                     # BLAKE2b-128 of payload
    payload: bytes                    # the SummaryFile, MessagePack


def _digest(payload: bytes) -> bytes:
    import hashlib                    # here: ~4 ms to import (OpenSSL), and only summaries need it

    return hashlib.blake2b(payload, digest_size=16).digest()


@record
class SummaryFile:
    """A rank's summary file: its trace's fingerprint and the summary (or why there is none)."""

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
    """(bytes, BLAKE2b of all of them). Every byte: a trace edited in its middle with its size
    kept (a first-and-last-MiB fingerprint let a stale summary through: a rank's compute 30.0%
    instead of 81.8%). Hashing runs at disk speed, a second or two on a 2 GB trace, far below
    parsing it."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    size, buf = 0, bytearray(_PIECE)
    view = memoryview(buf)
    with open_regular(path) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
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
    """Atomically (safeio.atomic_write): a reader never sees half a summary under the final name."""
    payload = _ENCODER.encode(sf)
    atomic_write(path, msgspec.msgpack.encode(_Envelope(FORMAT, VERSION, _digest(payload), payload)))


def make(trace: str, summary: Optional[RankSummary], problem: Optional[str] = None) -> SummaryFile:
    import socket                     # here: ~3 ms to import, for the runs that write summaries

    try:
        size, fp = fingerprint(trace)
    except OSError:
        size, fp = -1, ""
    return SummaryFile(format=FORMAT, version=VERSION, trace=os.path.abspath(trace), trace_bytes=size,
                       fingerprint=fp, made_by=f"{socket.gethostname()} {os.getpid()}",
                       problem=problem, summary=summary)


def read(path: str) -> SummaryFile:
    """A summary file, verified (digest) and checked (values); raises TraceError naming the file and the problem."""
    data = read_regular(path, MAX_SUMMARY_BYTES)
    try:
        head = msgspec.msgpack.decode(data, type=_Head)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:     # ValueError: bad UTF-8
        raise TraceError(path, f"not a diag summary (or a corrupt one): {e}") from None
    if head.format != FORMAT:
        raise TraceError(path, f"not a diag summary (format {head.format!r})")
    if head.version != VERSION:
        raise TraceError(path, f"summary format version {head.version}, this diag reads {VERSION}: "
                               "run `diag summarize` again")
    try:
        env = msgspec.msgpack.decode(data, type=_Envelope)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
        raise TraceError(path, f"corrupt summary: {e}") from None
    if env.digest != _digest(env.payload):
        raise TraceError(path, "corrupt summary: its content does not match its checksum")
    try:
        sf = _DECODER.decode(env.payload)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
        raise TraceError(path, f"corrupt summary: {e}") from None
    except RecursionError:                     # a plain-list field nested past the stack
        raise TraceError(path, "corrupt summary: nested too deep") from None
    if sf.summary is not None:
        _check(path, sf.summary)
        check_values(path, sf.summary)
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
    pp = s.pp
    ok &= len({len(pp.p2p.group), pp.p2p.peer.size, pp.p2p.sure.size}) == 1
    ok &= pp.p2p.wait_op.size == pp.p2p.wait_lo.size == pp.p2p.wait_hi.size
    ok &= len({len(c) for c in (pp.act_step, pp.act_stage, pp.act_kind, pp.act_mb, pp.act_start_ns, pp.act_end_ns)}) == 1
    if not ok:
        raise TraceError(path, "corrupt summary: its columns differ in length")


def matches(sf: SummaryFile, trace: str) -> bool:
    """Was this summary made from this trace file (as it is now)?"""
    try:
        return (sf.trace_bytes, sf.fingerprint) == fingerprint(trace)
    except OSError:
        return False
