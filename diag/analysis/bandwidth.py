"""Collective bandwidth: algbw and busbw exactly as nccl-tests reports them.

Problem: a collective's duration alone does not say whether the interconnect was used
well; the same 10 ms means different things for an AllReduce over 2 ranks and an
AllGather over 64. nccl-tests normalises this with two numbers:

- algbw = S / t, where S is the message size nccl-tests prints in its `size` column;
- busbw = algbw x f, where f depends on the collective and the group size n, chosen so
  that busbw is comparable with the peak unidirectional link bandwidth of the hardware
  whatever the collective and n.

Source: NVIDIA/nccl-tests `doc/PERFORMANCE.md` ("Performance reported by NCCL tests")
and the `*GetBw` / `*GetCollByteCount` functions in `src/*.cu` of the same repository.
Everything here is a pure function of (collective, bytes, seconds, n); matching the
instances of one collective across ranks (the transfer time) is done by the caller.
"""
from __future__ import annotations

import math

import numpy as np

from ..trace.kinds import Coll

# --- bus factor ------------------------------------------------------------------------
# nccl-tests doc/PERFORMANCE.md, section "Bus bandwidth":
#   AllReduce                 busbw = algbw * 2(n-1)/n
#   ReduceScatter, AllGather  busbw = algbw * (n-1)/n
#   Broadcast, Reduce         busbw = algbw
# and src/alltoall.cu, src/gather.cu, src/scatter.cu (factor (n-1)/n), src/sendrecv.cu
# (factor 1).
_TWO_N_MINUS_1_OVER_N = frozenset({Coll.ALL_REDUCE})
_N_MINUS_1_OVER_N = frozenset({Coll.ALL_GATHER, Coll.REDUCE_SCATTER, Coll.ALL_TO_ALL,
                               Coll.GATHER, Coll.SCATTER})
_ONE = frozenset({Coll.BROADCAST, Coll.REDUCE, Coll.SEND, Coll.RECV, Coll.SEND_RECV})


def _positive(x) -> bool:
    """True for a finite number > 0 (None, NaN, inf, 0 and negatives are 'unknown')."""
    try:
        return x is not None and math.isfinite(x) and x > 0
    except TypeError:
        return False


def bus_factor(coll: Coll | int, n: int | None) -> float | None:
    """nccl-tests bus-bandwidth factor f for `coll` over a group of `n` ranks.

    AllReduce 2(n-1)/n; AllGather, ReduceScatter, AlltoAll, Gather, Scatter (n-1)/n;
    Broadcast, Reduce, Send, Recv, SendRecv 1. Barrier and Unknown have no data volume:
    None. n < 1 (or unknown) is invalid: None. n == 1 gives 0 for the (n-1)/n forms:
    a one-rank collective moves nothing over the bus.
    """
    if not _positive(n) or n < 1:
        return None
    try:
        c = Coll(int(coll))
    except ValueError:
        return None
    if c in _TWO_N_MINUS_1_OVER_N:
        return 2.0 * (n - 1) / n
    if c in _N_MINUS_1_OVER_N:
        return (n - 1) / n
    if c in _ONE:
        return 1.0
    return None


# --- message size S --------------------------------------------------------------------
def message_bytes(coll: Coll | int, in_nelems, out_nelems, dtype_bytes,
                  group_size) -> int | None:
    """S in bytes as nccl-tests counts it, from a trace's element counts.

    (nccl-tests src/*.cu `*GetBw`: baseBw = count * [nranks] * typesize / t.)
    AllReduce: S = the buffer = in_nelems x dtype (fallback out).
    AllGather: S = whole output (n x per-rank) = out_nelems x dtype (fallback in x n).
    ReduceScatter: S = whole input = in_nelems x dtype (fallback out x n).
    AlltoAll: S = per-rank send buffer = in_nelems x dtype (fallback out).
    Gather: S = n x per-rank send = in_nelems x dtype x n (fallback out, the root's).
    Scatter: S = n x per-rank receive = out_nelems x dtype x n (fallback in, the root's).
    Broadcast, Reduce, Send, Recv, SendRecv: S = in (fallback out) x dtype.
    Unknown pieces (None, NaN, <= 0) make S unknown: None. Barrier / Unknown: None.
    """
    if not _positive(dtype_bytes):
        return None
    try:
        c = Coll(int(coll))
    except ValueError:
        return None
    n = group_size if _positive(group_size) else None
    i = in_nelems if _positive(in_nelems) else None
    o = out_nelems if _positive(out_nelems) else None

    def whole(primary, per_rank):
        if primary is not None:
            return primary
        if per_rank is not None and n is not None:
            return per_rank * n
        return None

    if c in (Coll.ALL_REDUCE, Coll.ALL_TO_ALL, Coll.BROADCAST, Coll.REDUCE, Coll.SEND,
             Coll.RECV, Coll.SEND_RECV):
        elems = i if i is not None else o
    elif c == Coll.ALL_GATHER:
        elems = whole(o, i)
    elif c == Coll.REDUCE_SCATTER:
        elems = whole(i, o)
    elif c == Coll.GATHER:
        elems = whole(None, i) if i is not None else o
    elif c == Coll.SCATTER:
        elems = whole(None, o) if o is not None else i
    else:
        return None
    if elems is None:
        return None
    return int(round(elems * dtype_bytes))


# --- bandwidths --------------------------------------------------------------------------
def algbw(nbytes, seconds) -> float | None:
    """Algorithm bandwidth S / t in bytes/s (nccl-tests PERFORMANCE.md "Algorithm
    bandwidth"). None when S or t is unknown or not > 0."""
    if not (_positive(nbytes) and _positive(seconds)):
        return None
    return float(nbytes) / float(seconds)


def busbw(coll: Coll | int, nbytes, seconds, n) -> float | None:
    """Bus bandwidth algbw x f(coll, n) in bytes/s (nccl-tests PERFORMANCE.md "Bus
    bandwidth"); comparable with a link's peak unidirectional bandwidth. None when any
    piece is unknown."""
    a = algbw(nbytes, seconds)
    f = bus_factor(coll, n)
    if a is None or f is None:
        return None
    return a * f


# Factor as an affine function of (n-1)/n per Coll value, for the vectorised form:
# f = _A[c] * (n-1)/n + _B[c]; NaN where undefined.
_NCOLL = max(int(c) for c in Coll) + 1
_A = np.full(_NCOLL, np.nan)
_B = np.full(_NCOLL, np.nan)
for _c in Coll:
    if _c in _TWO_N_MINUS_1_OVER_N:
        _A[_c], _B[_c] = 2.0, 0.0
    elif _c in _N_MINUS_1_OVER_N:
        _A[_c], _B[_c] = 1.0, 0.0
    elif _c in _ONE:
        _A[_c], _B[_c] = 0.0, 1.0


def bus_factor_array(coll_arr, n_arr) -> np.ndarray:
    """Vectorised `bus_factor`: float array, NaN where the scalar form gives None."""
    c = np.asarray(coll_arr, dtype=np.int64)
    n = np.asarray(n_arr, dtype=np.float64)
    c, n = np.broadcast_arrays(c, n)
    ok_c = (c >= 0) & (c < _NCOLL)
    ci = np.where(ok_c, c, 0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        frac = (n - 1.0) / n
        f = _A[ci] * frac + _B[ci]
    good = ok_c & np.isfinite(n) & (n >= 1)
    return np.where(good, f, np.nan)


def algbw_array(bytes_arr, seconds_arr) -> np.ndarray:
    """Vectorised `algbw`: bytes/s, NaN where S or t is not a finite number > 0."""
    b = np.asarray(bytes_arr, dtype=np.float64)
    t = np.asarray(seconds_arr, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        out = b / t
    good = np.isfinite(b) & (b > 0) & np.isfinite(t) & (t > 0)
    return np.where(good, out, np.nan)


def busbw_array(coll_arr, bytes_arr, seconds_arr, n_arr) -> np.ndarray:
    """Vectorised `busbw`: bytes/s, NaN where the scalar form gives None."""
    with np.errstate(invalid="ignore", over="ignore"):
        return algbw_array(bytes_arr, seconds_arr) * bus_factor_array(coll_arr, n_arr)


# --- message-size buckets ----------------------------------------------------------------
# Power-of-16 steps from 4 KiB: small messages are latency-bound, large ones bandwidth-
# bound; busbw is only comparable with a link peak in the top buckets (nccl-tests
# PERFORMANCE.md: "on large sizes, it makes more sense to look at the bandwidth").
KiB, MiB = 1 << 10, 1 << 20
BUCKET_EDGES = (4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB)  # inclusive upper bounds
BUCKETS = ["<=4KiB", "4-64KiB", "64KiB-1MiB", "1-16MiB", "16-256MiB", ">256MiB"]


def size_bucket(nbytes) -> str | None:
    """Label of the message-size bucket of `nbytes` (upper bounds inclusive: 4096 B is
    '<=4KiB', 4097 B is '4-64KiB'); None when the size is unknown (None, NaN, <= 0)."""
    if not _positive(nbytes):
        return None
    for label, edge in zip(BUCKETS, BUCKET_EDGES):
        if nbytes <= edge:
            return label
    return BUCKETS[-1]


def size_bucket_array(bytes_arr) -> np.ndarray:
    """Vectorised `size_bucket`: int64 indices into BUCKETS, -1 where unknown."""
    b = np.asarray(bytes_arr, dtype=np.float64)
    idx = np.searchsorted(np.asarray(BUCKET_EDGES, dtype=np.float64), b, side="left")
    good = np.isfinite(b) & (b > 0)
    return np.where(good, idx, -1).astype(np.int64)
