"""algbw / busbw / message size as nccl-tests doc/PERFORMANCE.md defines them.

Expected values are worked out by hand here, not computed with the code under test.
"""
import glob
import json
import math
import os

import numpy as np
import pytest
from conftest import DATA
from hypothesis import given, settings
from hypothesis import strategies as st

from diag.analysis import diagnose
from diag.analysis.bandwidth import (BUCKETS, algbw, algbw_array, bus_factor,
                                     bus_factor_array, busbw, busbw_array, message_bytes,
                                     size_bucket, size_bucket_array)
from diag.trace import load_job
from diag.trace.kinds import Coll

GiB, MiB, KiB = 2**30, 2**20, 2**10


def close(a, b):
    return a is not None and math.isclose(a, b, rel_tol=1e-12)


# --- bus factor --------------------------------------------------------------------------
@pytest.mark.parametrize("coll,n,f", [
    (Coll.ALL_REDUCE, 8, 14 / 8),        # 2(8-1)/8
    (Coll.ALL_REDUCE, 2, 1.0),           # 2(2-1)/2
    (Coll.ALL_GATHER, 8, 7 / 8),
    (Coll.REDUCE_SCATTER, 4, 3 / 4),
    (Coll.ALL_TO_ALL, 16, 15 / 16),
    (Coll.GATHER, 8, 7 / 8),
    (Coll.SCATTER, 8, 7 / 8),
    (Coll.BROADCAST, 8, 1.0),
    (Coll.REDUCE, 8, 1.0),
    (Coll.SEND, 2, 1.0),
    (Coll.RECV, 2, 1.0),
    (Coll.SEND_RECV, 2, 1.0),
])
def test_bus_factor(coll, n, f):
    assert close(bus_factor(coll, n), f)
    assert close(bus_factor(int(coll), n), f)


@pytest.mark.parametrize("coll", [Coll.ALL_REDUCE, Coll.ALL_GATHER, Coll.REDUCE_SCATTER,
                                  Coll.ALL_TO_ALL, Coll.GATHER, Coll.SCATTER])
def test_bus_factor_single_rank_is_zero(coll):
    assert bus_factor(coll, 1) == 0.0
    assert busbw(coll, MiB, 1e-3, 1) == 0.0


def test_bus_factor_single_rank_point_to_point_is_one():
    assert bus_factor(Coll.BROADCAST, 1) == 1.0


@pytest.mark.parametrize("n", [0, -1, None, float("nan"), 0.5])
def test_bus_factor_invalid_n(n):
    assert bus_factor(Coll.ALL_REDUCE, n) is None


@pytest.mark.parametrize("coll", [Coll.BARRIER, Coll.UNKNOWN, 99])
def test_bus_factor_unknown(coll):
    assert bus_factor(coll, 8) is None
    assert busbw(coll, MiB, 1e-3, 8) is None


# --- algbw / busbw, every collective, by hand --------------------------------------------
def test_allreduce_1gib_8_ranks_10ms():
    # 2^28 fp32 elements = 2^30 bytes, 8 ranks, 10 ms
    s = message_bytes(Coll.ALL_REDUCE, 2**28, 2**28, 4, 8)
    assert s == 1073741824
    assert close(algbw(s, 0.01), 107374182400.0)                 # 2^30 / 0.01
    assert close(busbw(Coll.ALL_REDUCE, s, 0.01, 8), 107374182400.0 * 14 / 8)
    assert close(busbw(Coll.ALL_REDUCE, s, 0.01, 8), 187904819200.0)


def test_allgather_whole_output():
    # each of 4 ranks contributes 2^20 bf16 elements: output 4 * 2^20 elements * 2 B = 8 MiB
    s = message_bytes(Coll.ALL_GATHER, 2**20, 4 * 2**20, 2, 4)
    assert s == 8 * MiB == 8388608
    # fallback when the output count is missing: in x n
    assert message_bytes(Coll.ALL_GATHER, 2**20, None, 2, 4) == 8388608
    assert message_bytes(Coll.ALL_GATHER, 2**20, 0, 2, 4) == 8388608
    # 8 MiB in 1 ms: algbw 8388608000 B/s, busbw x 3/4
    assert close(algbw(s, 1e-3), 8388608000.0)
    assert close(busbw(Coll.ALL_GATHER, s, 1e-3, 4), 6291456000.0)


def test_reduce_scatter_whole_input():
    # input 8 * 2^18 fp32 elements over 8 ranks: 8 * 2^18 * 4 = 8 MiB
    s = message_bytes(Coll.REDUCE_SCATTER, 8 * 2**18, 2**18, 4, 8)
    assert s == 8388608
    assert message_bytes(Coll.REDUCE_SCATTER, None, 2**18, 4, 8) == 8388608   # out x n
    # 8 MiB in 2 ms: algbw 4194304000 B/s, busbw x 7/8 = 3670016000
    assert close(busbw(Coll.REDUCE_SCATTER, s, 2e-3, 8), 3670016000.0)


def test_alltoall_per_rank_send_buffer():
    # each rank sends 2^20 fp16 elements in total (to 16 peers): S = 2 MiB
    s = message_bytes(Coll.ALL_TO_ALL, 2**20, 2**20, 2, 16)
    assert s == 2097152
    # 2 MiB in 0.5 ms: algbw 4194304000 B/s, busbw x 15/16 = 3932160000
    assert close(algbw(s, 5e-4), 4194304000.0)
    assert close(busbw(Coll.ALL_TO_ALL, s, 5e-4, 16), 3932160000.0)


@pytest.mark.parametrize("coll", [Coll.BROADCAST, Coll.REDUCE, Coll.SEND, Coll.RECV,
                                  Coll.SEND_RECV])
def test_factor_one_collectives(coll):
    # 1000 fp32 elements = 4000 B in 4 us: algbw = busbw = 1e9 B/s
    s = message_bytes(coll, 1000, 1000, 4, 8)
    assert s == 4000
    assert message_bytes(coll, None, 1000, 4, 8) == 4000     # falls back to out
    assert close(algbw(s, 4e-6), 1e9)
    assert close(busbw(coll, s, 4e-6, 8), 1e9)


def test_gather_scatter():
    # gather: 8 ranks each send 1000 fp32 -> S = 8 * 1000 * 4 = 32000 B
    assert message_bytes(Coll.GATHER, 1000, 0, 4, 8) == 32000
    # scatter: each rank receives 1000 fp32 -> S = 32000 B
    assert message_bytes(Coll.SCATTER, 0, 1000, 4, 8) == 32000
    # 32000 B in 32 us: algbw 1e9, busbw x 7/8
    assert close(busbw(Coll.GATHER, 32000, 32e-6, 8), 0.875e9)
    assert close(busbw(Coll.SCATTER, 32000, 32e-6, 8), 0.875e9)


def test_allreduce_fallback_and_unknown_pieces():
    assert message_bytes(Coll.ALL_REDUCE, None, 10, 2, 8) == 20
    assert message_bytes(Coll.ALL_REDUCE, None, None, 2, 8) is None
    assert message_bytes(Coll.ALL_REDUCE, 10, 10, None, 8) is None
    assert message_bytes(Coll.ALL_REDUCE, 10, 10, 0, 8) is None
    assert message_bytes(Coll.ALL_REDUCE, -5, 0, 4, 8) is None
    assert message_bytes(Coll.ALL_REDUCE, float("nan"), None, 4, 8) is None
    # all-gather fallback needs the group size
    assert message_bytes(Coll.ALL_GATHER, 10, None, 4, None) is None
    assert message_bytes(Coll.REDUCE_SCATTER, None, 10, 4, 0) is None
    assert message_bytes(Coll.BARRIER, 1, 1, 4, 8) is None
    assert message_bytes(Coll.UNKNOWN, 1, 1, 4, 8) is None


def test_algbw_unknown():
    assert algbw(None, 1.0) is None
    assert algbw(100, 0) is None
    assert algbw(100, -1e-3) is None
    assert algbw(0, 1.0) is None
    assert algbw(100, float("nan")) is None
    assert busbw(Coll.ALL_REDUCE, 100, None, 8) is None
    assert busbw(Coll.ALL_REDUCE, 100, 1.0, None) is None


# --- vectorised == scalar ----------------------------------------------------------------
def test_busbw_array_examples():
    colls = np.array([Coll.ALL_REDUCE, Coll.ALL_GATHER, Coll.BARRIER, Coll.BROADCAST,
                      Coll.ALL_REDUCE, Coll.ALL_REDUCE, Coll.UNKNOWN])
    nbytes = np.array([GiB, 8 * MiB, 8, 4000, 0, GiB, 10])
    secs = np.array([0.01, 1e-3, 1e-3, 4e-6, 1.0, 0.0, 1.0])
    n = np.array([8, 4, 8, 8, 8, 8, 8])
    out = busbw_array(colls, nbytes, secs, n)
    assert out.shape == (7,)
    assert math.isclose(out[0], 187904819200.0, rel_tol=1e-12)
    assert math.isclose(out[1], 6291456000.0, rel_tol=1e-12)
    assert math.isnan(out[2])
    assert math.isclose(out[3], 1e9, rel_tol=1e-12)
    assert np.isnan(out[4:]).all()


finite = st.one_of(st.floats(min_value=-10, max_value=1e12), st.just(float("nan")),
                   st.integers(min_value=-2, max_value=2**40))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=0, max_value=14), finite, finite,
                          st.integers(min_value=-1, max_value=1024)),
                min_size=1, max_size=20))
def test_busbw_array_matches_scalar(rows):
    c, b, t, n = (np.array(x, dtype=float if i in (1, 2) else np.int64)
                  for i, x in enumerate(zip(*rows)))
    out = busbw_array(c, b, t, n)
    fa = bus_factor_array(c, n)
    aa = algbw_array(b, t)
    for k, (ci, bi, ti, ni) in enumerate(rows):
        want = busbw(ci, bi, ti, ni)
        if want is None:
            assert math.isnan(out[k])
        else:
            assert math.isclose(out[k], want, rel_tol=1e-12, abs_tol=0.0)
        f = bus_factor(ci, ni)
        assert (math.isnan(fa[k]) if f is None else math.isclose(fa[k], f, rel_tol=1e-12))
        a = algbw(bi, ti)
        assert (math.isnan(aa[k]) if a is None else math.isclose(aa[k], a, rel_tol=1e-12))


# --- size buckets ------------------------------------------------------------------------
@pytest.mark.parametrize("nbytes,label", [
    (1, "<=4KiB"), (4 * KiB, "<=4KiB"), (4 * KiB + 1, "4-64KiB"), (64 * KiB, "4-64KiB"),
    (64 * KiB + 1, "64KiB-1MiB"), (MiB, "64KiB-1MiB"), (MiB + 1, "1-16MiB"),
    (16 * MiB, "1-16MiB"), (16 * MiB + 1, "16-256MiB"), (256 * MiB, "16-256MiB"),
    (256 * MiB + 1, ">256MiB"), (GiB, ">256MiB"),
])
def test_size_bucket(nbytes, label):
    assert size_bucket(nbytes) == label
    assert BUCKETS[int(size_bucket_array([nbytes])[0])] == label


def test_size_bucket_unknown():
    assert size_bucket(0) is None
    assert size_bucket(None) is None
    assert size_bucket(float("nan")) is None
    assert list(size_bucket_array([0, -1, np.nan, 5000])) == [-1, -1, -1, 1]
    assert BUCKETS == ["<=4KiB", "4-64KiB", "64KiB-1MiB", "1-16MiB", "16-256MiB", ">256MiB"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(min_value=-5, max_value=2**34),
                          st.floats(min_value=-1, max_value=2**34),
                          st.just(float("nan"))),
                min_size=1, max_size=30))
def test_size_bucket_array_matches_scalar(xs):
    idx = size_bucket_array(np.array(xs, dtype=float))
    for x, i in zip(xs, idx):
        label = size_bucket(x)
        assert (i == -1) if label is None else (BUCKETS[i] == label)


# --- real traces that name no group: n from the match (tests/data/README.md) ---------------
# torchrec's DLRM jobs (old NCCL traces): SendRecv kernels without NCCL args, no pg_config.
# diag matches their all-to-alls across all ranks by order; a complete match says n.
DLRM = {"dlrm_2_ranks_alltoall": 2, "dlrm_4_ranks_alltoall": 4}
SIZE_ARGS = ("In msg nelems", "Out msg nelems", "Input Dims", "Input type", "dtype")


def _events(path: str) -> list:
    with open(path) as f:
        return json.load(f)["traceEvents"]


def _window_sendrecv(events: list) -> list:
    """The SendRecv kernels launched before the last ProfilerStep starts (the analysis window,
    HTA's convention), in time order."""
    last = max(e["ts"] for e in events if e.get("name", "").startswith("ProfilerStep"))
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    kernels = sorted((e for e in events if "SendRecv" in e.get("name", "")), key=lambda e: e["ts"])
    return [e for e in kernels if launch.get(e["args"]["correlation"], math.inf) < last]


def _traces(folder: str) -> list:
    return sorted(glob.glob(os.path.join(DATA, folder, "*.json")))


@pytest.mark.parametrize("folder,n", DLRM.items())
def test_inferred_group_size_on_real_traces(folder, n):
    """n is the ranks matched; busbw stays unknown because no event of these traces says a
    message size (no NCCL args, no Input Dims): unknown, not guessed."""
    files = _traces(folder)
    assert len(files) == n
    assert not any(k in e.get("args", {}) for f in files for e in _events(f) for k in SIZE_ARGS)
    d = diagnose(load_job(os.path.dirname(files[0])))
    (op,) = d.comm.ops
    assert (op.op, op.group_size, op.calls) == ("all_to_all", n, n * len(_window_sendrecv(_events(files[0]))))
    assert op.busbw_median_gbps is None and op.size_bucket == "unknown"
    assert [n for n in d.comm.notes if n.startswith("busbw unknown")] == [
        "busbw unknown for unknown:all_to_all: the traces record no message size (neither NCCL's `In msg nelems` "
        "nor the ops' `Input Dims`: torch.profiler's record_shapes=True)"]


def test_busbw_of_an_inferred_group_from_a_real_trace_given_sizes(tmp_path):
    """dlrm_4 with a message size written on every SendRecv kernel (1 Mi float32 elements; the
    trace has none): busbw = S / t x (n-1)/n with t the shortest of the k-th all-to-all over the
    4 ranks (nccl-tests; S = the per-rank send buffer), median over the window's all-to-alls."""
    nelems, n = 2**20, 4
    windows = []
    for f in _traces("dlrm_4_ranks_alltoall"):
        with open(f) as fh:
            doc = json.load(fh)
        for e in doc["traceEvents"]:
            if "SendRecv" in e.get("name", ""):
                e["args"].update({"In msg nelems": nelems, "Out msg nelems": nelems, "dtype": "Float"})
        windows.append(_window_sendrecv(doc["traceEvents"]))
        with open(tmp_path / os.path.basename(f), "w") as fh:
            json.dump(doc, fh)
    shortest_us = [min(k["dur"] for k in ks) for ks in zip(*windows)]      # the k-th on every rank
    want = float(np.median([nelems * 4 / (t * 1e-6) * (n - 1) / n / 1e9 for t in shortest_us]))
    comm = diagnose(load_job(str(tmp_path))).comm
    (op,) = comm.ops
    assert (op.group_size, op.busbw_basis, op.median_bytes) == (n, "transfer", nelems * 4)
    assert not [note for note in comm.notes if note.startswith("busbw unknown")]
    assert op.busbw_median_gbps == pytest.approx(want, rel=1e-9)


def test_a_damaged_pg_size_leaves_an_unnamed_groups_size_unknown():
    """implied_group_size: every group of 8 gives an unnamed group 8; a group whose pg_size is not a size (a
    list, a bool, a string, missing, 0, past MAX_RANKS: the fuzzer's list once raised `unhashable type`) or
    two sizes leave it 0 (unknown), and the named groups' sizes are kept."""
    from types import SimpleNamespace

    import numpy as np

    from diag.analysis.collectives import implied_group_size
    from diag.runmeta import MAX_RANKS

    def implied(*sizes):
        rc = SimpleNamespace(group_size=np.array([0, 4, 0], np.int32))
        implied_group_size(rc, [{"pg_name": str(i), "pg_size": s} for i, s in enumerate(sizes)] + ["not a group"])
        return rc.group_size.tolist()

    assert implied(8, 8) == [8, 4, 8]
    for bad in ([8], True, "8", None, 0, MAX_RANKS + 1, 2 ** 40):
        assert implied(8, bad) == [0, 4, 0], bad
    assert implied(8, 4) == [0, 4, 0]
    rc = SimpleNamespace(group_size=np.array([0], np.int32))
    implied_group_size(rc, [{"pg_name": "0"}])
    assert rc.group_size.tolist() == [0]
