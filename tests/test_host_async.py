"""Asynchronous communication on the host timeline (CPU-only gloo traces), and gloo's transfers
joined to their process groups where the traces name none.

Hand-made Kineto traces give exact cases worked by hand (µs): a `gloo:send` in flight while the
thread computes takes nothing from compute; a `wait_tensor` is blocked, not compute, and counts
as its collective's exposed time; a transfer takes the name and size of the c10d op that issued
it (gloo runs a reduce-scatter as `gloo:all_reduce`); worker threads are joined to the groups of
`pg_config` only where that is certain (sizes tell groups apart, or FSDP's annotations do),
and stay unknown where two groups ran the same collectives.

Real runs of tests/workloads/torch_native_3d.py (torchtitan-style: DeviceMesh (pp, dp, tp) =
(2, 2, 2), DTensor TP, FSDP2 on dp, torch.distributed.pipelining, gloo, no diag labels) check,
against measures made here from the raw JSON: every tensor- and data-parallel collective gets
its axis; TP's exposed time is at least the main thread's time blocked in `wait_tensor` on TP's
activations; an interleaved run's compute share is within a factor 3 of a 1F1B run's; the ops
run inside in-flight sends and receives are compute.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from diag.analysis import diagnose
from diag.trace import load_job
from kineto import TraceBuilder

US = 1e-6
WORKER = 7                                       # a gloo worker thread's tid in hand-made traces


# -- interval arithmetic of the expected values, independent of diag's ---------------------------
def union(spans) -> list:
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        elif e > s:
            out.append([s, e])
    return out


def minus(a, b) -> list:
    """Parts of the spans a not covered by the spans b."""
    out = []
    for s, e in union(a):
        for bs, be in union(b):
            if be <= s or bs >= e:
                continue
            if bs > s:
                out.append([s, bs])
            s = max(s, be)
        if e > s:
            out.append([s, e])
    return out


def length(spans) -> float:
    return sum(e - s for s, e in union(spans))


# -- hand-made traces -----------------------------------------------------------------------------
def gloo_rank(rank: int, world: int, groups: dict) -> TraceBuilder:
    """Two steps of 1000 µs (the analysis window keeps the first); groups: pg_desc -> ranks."""
    b = TraceBuilder(rank=rank, world_size=world, backend="gloo")
    b.pg_config = [{"pg_name": str(i), "pg_desc": desc, "pg_size": len(r), "ranks": r}
                   for i, (desc, r) in enumerate({"default_pg": list(range(world)), **groups}.items())]
    return b.step(1, 0, 1000).step(2, 1000, 1000).cpu_op("aten::mm", 1001, 499)


def issue(b: TraceBuilder, op: str, ts: float, dur: float, dims: list, types: list) -> None:
    b.cpu_op(f"c10d::{op}", ts, dur, **{"Input Dims": dims, "Input type": types})


def transfer(b: TraceBuilder, op: str, ts: float, dur: float, dims: list, tid: int = WORKER) -> None:
    """gloo's record of a transfer (on a worker thread, or in flight on the posting thread)."""
    b.cpu_op(f"gloo:{op}", ts, dur, tid=tid, cat="user_annotation", **{"Input Dims": [dims], "Input type": ["float"]})


def write(b: TraceBuilder, folder) -> str:
    return b.write(os.path.join(str(folder), f"rank{b.rank}_trace.json"))


def test_a_send_in_flight_holding_ops_takes_nothing_from_compute(tmp_path):
    """c10d::send 100-110 posts gloo:send 105-900 (its wait returns at 900) while the thread
    runs mm 120-300, 320-600, 620-850; mm 10-90, add 900-990. Compute is every op (860); the
    send is exposed only where the thread runs nothing inside it: 100-120, 300-320, 600-620,
    850-900 = 110; idle 90-100."""
    b = gloo_rank(0, 1, {})
    ops = [(10, 90), (120, 300), (320, 600), (620, 850), (900, 990)]
    for s, e in ops:
        b.cpu_op("aten::mm", s, e - s)
    issue(b, "send", 100, 10, [[[3, 16, 64]], [], [], []], ["TensorList", "", "Scalar", "Scalar"])
    transfer(b, "send", 105, 795, [3, 16, 64], tid=b.pid)
    r = diagnose(load_job(write(b, tmp_path))).ranks[0]
    comm = union([(100, 110), (105, 900)])
    assert r.breakdown.compute_s == pytest.approx(length(ops) * US)                  # 860
    assert r.breakdown.comm_s == pytest.approx(length(minus(comm, ops)) * US)        # 110
    assert r.breakdown.idle_s == pytest.approx(10 * US)


def test_a_receive_nobody_computes_under_is_exposed_whole(tmp_path):
    """c10d::recv_ 100-110 posts gloo:recv 105-400: nothing runs until it returns, so all of
    100-400 is exposed communication."""
    b = gloo_rank(0, 1, {})
    b.cpu_op("aten::mm", 10, 90).cpu_op("aten::mm", 400, 100)
    issue(b, "recv_", 100, 10, [[[3, 16, 64]], [], [], []], ["TensorList", "", "Scalar", "Scalar"])
    transfer(b, "recv", 105, 295, [3, 16, 64], tid=b.pid)
    r = diagnose(load_job(write(b, tmp_path))).ranks[0]
    assert r.breakdown.comm_s == pytest.approx(300 * US)
    assert r.breakdown.compute_s == pytest.approx(190 * US)


def _dtensor_all_reduce_with_compute():
    """DTensor's all-reduce as gloo records it: _c10d_functional::all_reduce 100-130 issuing
    c10d::allreduce_ 105-125, the worker's gloo:all_reduce 128-400; mm 140-300 and 500-700 on
    the main thread. (builder, the mm intervals)"""
    b = gloo_rank(0, 1, {})
    b.cpu_op("_c10d_functional::all_reduce", 100, 30, **{"Input Dims": [[64], [], []]})
    issue(b, "allreduce_", 105, 20, [[[64]], [], [], [], [], []], ["TensorList", "", "", "", "Scalar", "Scalar"])
    transfer(b, "all_reduce", 128, 272, [64])
    ops = [(140, 300), (500, 700)]
    for s, e in ops:
        b.cpu_op("aten::mm", s, e - s)
    return b, ops


def test_wait_tensor_is_blocked_and_counts_as_its_collectives_exposed_time(tmp_path):
    """DTensor's all-reduce: _c10d_functional::all_reduce 100-130 issues c10d::allreduce_ 105-125;
    the worker runs gloo:all_reduce 128-400; the main thread runs mm 140-300, blocks in wait_tensor
    300-500, runs mm 500-700. Compute 360 (the wait is not compute); communication 100-500, of
    which 100-140 and 300-500 are exposed (240). The transfer's own exposure: its span, the call
    that issued it and the wait on it, less compute: 100-140 and 300-500 = 240, all of the rank's."""
    b, ops = _dtensor_all_reduce_with_compute()
    b.cpu_op("_c10d_functional::wait_tensor", 300, 200, **{"Input Dims": [[64]], "Input type": ["float"]})
    d = diagnose(load_job(write(b, tmp_path)))
    comm = [(100, 130), (105, 125), (128, 400), (300, 500)]
    assert d.ranks[0].breakdown.compute_s == pytest.approx(length(ops) * US)
    assert d.ranks[0].breakdown.comm_s == pytest.approx(length(minus(comm, ops)) * US)          # 240
    assert d.comm.ranks[0].exposed_s == pytest.approx(length(minus([(100, 130), (128, 400), (300, 500)], ops)) * US)
    assert d.comm.ranks[0].exposed_s == pytest.approx(d.ranks[0].breakdown.comm_s)
    assert [(o.op, o.median_bytes) for o in d.comm.ops] == [("all_reduce", 64 * 4)]


def test_a_wait_on_a_kept_tensor_much_later_is_not_this_transfers_blocking(tmp_path):
    """As above, and the same tensor is waited on again at 900-905, after more compute (a tensor
    kept and waited a step later): no new op was issued, so that wait is on this transfer, but it
    is no blocking on it: the transfer's window is not stretched over 500-900 (idle, not
    communication), only its own wait 900-905 stays communication of the rank."""
    b, ops = _dtensor_all_reduce_with_compute()
    for s, e in ((300, 500), (900, 905)):
        b.cpu_op("_c10d_functional::wait_tensor", s, e - s, **{"Input Dims": [[64]], "Input type": ["float"]})
    d = diagnose(load_job(write(b, tmp_path)))
    assert d.comm.ranks[0].exposed_s == pytest.approx(length(minus([(100, 130), (128, 400), (300, 500)], ops)) * US)
    assert d.ranks[0].breakdown.comm_s == pytest.approx((240 + 5) * US)


@pytest.mark.parametrize("inner_at", [100, 60])
def test_the_whole_functional_call_and_its_wrap_are_the_collectives_exposed_time(tmp_path, inner_at):
    """Under a Python dispatch mode (DTensor's redistribution) the program's
    `_c10d_functional::all_reduce` 60-135 runs the op again inside itself (100-130), which issues
    c10d::allreduce_ 105-125; the worker's transfer is 110-120; funcol wraps the output,
    `_wrap_tensor_autograd` 137-150 (another inside it, 140-148); mm 160-300; wait_tensor 300-310;
    mm 500-700. The rank's exposed communication: 60-135, 137-150 and 300-310 = 98, all of it the
    collective's: the outer call is the issuing, not only the inner one (60-100 was left to no axis:
    13 of a TP=2 CPU run's 15.6 ms/step "not joined to an axis"), and the wrap is its own window, so
    the 2 us of Python between call and wrap (idle) are not taken. The same when the two calls
    start in the same us (inner_at 60). A wrap at 400-405, 250 us after the call, is no wrap of its
    output: communication of the rank, but not this collective's."""
    b = gloo_rank(0, 1, {})
    b.cpu_op("_c10d_functional::all_reduce", 60, 75, **{"Input Dims": [[64], [], []]})
    b.cpu_op("_c10d_functional::all_reduce", inner_at, 130 - inner_at, **{"Input Dims": [[64], [], []]})
    issue(b, "allreduce_", 105, 20, [[[64]], [], [], [], [], []], ["TensorList", "", "", "", "Scalar", "Scalar"])
    transfer(b, "all_reduce", 110, 10, [64])
    b.cpu_op("_c10d_functional::_wrap_tensor_autograd", 137, 13, **{"Input Dims": [[64]], "Input type": ["float"]})
    b.cpu_op("_c10d_functional::_wrap_tensor_autograd", 140, 8, **{"Input Dims": [[64]], "Input type": ["float"]})
    b.cpu_op("_c10d_functional::_wrap_tensor_autograd", 400, 5, **{"Input Dims": [[64]], "Input type": ["float"]})
    ops = [(160, 300), (500, 700)]
    for st, e in ops:
        b.cpu_op("aten::mm", st, e - st)
    b.cpu_op("_c10d_functional::wait_tensor", 300, 10, **{"Input Dims": [[64]], "Input type": ["float"]})
    d = diagnose(load_job(write(b, tmp_path)))
    comm = [(60, 135), (137, 150), (300, 310)]
    assert d.ranks[0].breakdown.comm_s == pytest.approx((length(minus(comm, ops)) + 5) * US)    # 98 + the stray wrap
    assert d.comm.ranks[0].exposed_s == pytest.approx(length(minus(comm, ops)) * US)           # 98


def test_a_transfer_takes_the_name_and_size_of_the_op_that_issued_it(tmp_path):
    """FSDP2's `c10d::_reduce_scatter_base_(output [4096], input [8192])` runs as gloo:all_reduce
    of 8192 floats: a reduce-scatter of S = 8192 x 4 B (nccl-tests: the whole input). DTensor's
    `allgather_into_tensor_coalesced_` (outputs [[6,16,64]], inputs [[3,16,64]]) runs as
    gloo:all_gather of 3072: an all-gather of S = 6144 x 4 B (the whole output)."""
    b = gloo_rank(0, 1, {})
    issue(b, "_reduce_scatter_base_", 100, 10, [[4096], [8192], [], [], [], []],
          ["float", "float", "", "", "Scalar", "Scalar"])
    transfer(b, "all_reduce", 105, 195, [8192])
    issue(b, "allgather_into_tensor_coalesced_", 400, 10, [[[6, 16, 64]], [[3, 16, 64]], [], []],
          ["TensorList", "TensorList", "", "Scalar"])
    transfer(b, "all_gather", 405, 95, [3, 16, 64])
    d = diagnose(load_job(write(b, tmp_path)))
    assert sorted((o.op, o.median_bytes) for o in d.comm.ops) == [("all_gather", 6 * 16 * 64 * 4),
                                                                  ("reduce_scatter", 8192 * 4)]


def test_buckets_in_flight_together_wait_for_a_late_rank_once(tmp_path):
    """DP over 2 ranks, gloo: rank 1 posts three gradient buckets' all-reduces at 100, 110 and
    120 on three worker threads; rank 0, late, runs them at 600-650, 650-700 and 700-750. Each
    of rank 1's transfers lasts until its pair is done (650, 700, 750), so their waits are 500,
    540 and 580 (duration less the shortest member's 50), 1,620 in all: more than the 1,000 us
    step. Rank 1 was waiting for rank 0 from 100 to 700: 600, the union of [start, start + wait].
    The finding "waiting for rank 0" and rank 1's wait are that (they were the sum, 162% of the
    step)."""
    ranks = [gloo_rank(r, 2, {}) for r in (0, 1)]
    for k in range(3):
        transfer(ranks[0], "all_reduce", 600 + 50 * k, 50, [4096])
        transfer(ranks[1], "all_reduce", 100 + 10 * k, 550 + 40 * k, [4096], tid=WORKER + k)
    for b in ranks:
        write(b, tmp_path)
    d = diagnose(load_job(str(tmp_path)))
    want = length([(100 + 10 * k, 100 + 10 * k + 500 + 40 * k) for k in range(3)]) * US     # 600
    assert sorted(r.wait_s for r in d.comm.ranks) == [pytest.approx(0.0), pytest.approx(want)]
    (op,) = d.comm.ops                       # the op row sums its instances' waits, as its durations
    assert op.wait_s == pytest.approx((500 + 540 + 580) * US / 2)
    (s,) = [x for x in d.comm.stragglers if x.ranks == [0]]
    assert s.others_wait_s == pytest.approx(want)
    (f,) = [f for f in d.findings if f.what == "waiting for rank 0"]
    assert f.seconds_per_step == pytest.approx(want) and f.seconds_per_step <= d.throughput.step_time_s


# -- process groups of worker threads -------------------------------------------------------------
def mesh_rank(rank: int, tp_elems: int, dp_elems: int, split: bool, fsdp: bool) -> TraceBuilder:
    """4 ranks, DeviceMesh (dp, tp) = (2, 2): tp {0,1} {2,3}, dp {0,2} {1,3}. DTensor's two
    all-gathers run on the tp group's worker threads 10 and 11 (both on 10, or one on each: gloo's
    two threads take a group's ops as they come), FSDP's all-gather on thread 20."""
    b = gloo_rank(rank, 4, {"mesh_dp": [rank % 2, rank % 2 + 2], "mesh_tp": [rank - rank % 2, rank - rank % 2 + 1]})
    for k, ts in enumerate((100, 300)):
        b.cpu_op("_c10d_functional::all_gather_into_tensor", ts, 20, **{"Input Dims": [[tp_elems], [], []]})
        issue(b, "allgather_into_tensor_coalesced_", ts + 5, 10, [[[2 * tp_elems]], [[tp_elems]], [], []],
              ["TensorList", "TensorList", "", "Scalar"])
        transfer(b, "all_gather", ts + 10, 100, [tp_elems], tid=11 if split and k else 10)
    if fsdp:
        b.cpu_op("FSDP::all_gather (layers.0)", 500, 30, cat="user_annotation")
    issue(b, "_allgather_base_", 505, 10, [[2 * dp_elems], [dp_elems], [], [], []],
          ["float", "float", "", "Scalar", "Scalar"])
    transfer(b, "all_gather", 510, 100, [dp_elems], tid=20)
    return b


def joined(tmp_path, ranks):
    """The diagnosis of these ranks, and its collectives' calls by axis."""
    for b in ranks:
        write(b, tmp_path)
    d = diagnose(load_job(str(tmp_path)))
    calls = {}
    for o in d.comm.ops:
        calls[o.axis] = calls.get(o.axis, 0) + o.calls
    return calls, d


def test_threads_join_their_group_where_the_sizes_tell_them_apart(tmp_path):
    """tp {0,1} gathers 3072 elements, tp {2,3} 1024; dp {0,2} 4096, dp {1,3} 2048. Rank 1 splits
    its tp gathers over both threads, rank 0 runs both on one: only the pair matches. Each thread's
    group is then certain (no other group of its rank has members that ran the same), though no
    FSDP annotation is there: all 8 tp and 4 dp gathers get their axis, and match across ranks."""
    ranks = [mesh_rank(r, 3072 if r < 2 else 1024, 4096 if r % 2 == 0 else 2048, split=r == 1, fsdp=False)
             for r in range(4)]
    calls, d = joined(tmp_path, ranks)
    assert calls == {"tp": 8, "dp": 4}
    assert all(rc.matched == 3 for rc in d.comm.ranks)


def test_fsdp_tells_symmetric_groups_apart_and_the_rest_stays_unknown(tmp_path):
    """Every rank runs the same: tp gathers 3072, dp gathers 4096. Each thread's collectives are
    then also those of any other group of its rank (the world's included). FSDP's annotation puts
    thread 20 in a data-parallel group: dp. The tp threads could still serve tp or the world: their
    axis stays unknown, not guessed. Without the annotation, nothing is certain."""
    calls, _ = joined(tmp_path / "fsdp", [mesh_rank(r, 3072, 4096, split=False, fsdp=True) for r in range(4)])
    assert calls == {"dp": 4, "unknown": 8}
    calls, _ = joined(tmp_path / "none", [mesh_rank(r, 3072, 4096, split=False, fsdp=False) for r in range(4)])
    assert calls == {"unknown": 12}


def test_sends_and_receives_join_a_two_rank_pipeline_group(tmp_path):
    """Rank 0 sends (c10d::send 100-101, gloo:send 100.5-300), rank 1 receives (c10d::recv_
    100-101, gloo:recv 100.5-200): the layout's pp group is these two ranks, so both are in it,
    and the pair matches: the transfer is the shorter (99.5), the send waited 100 more."""
    ranks = []
    for rank, (op, end) in enumerate((("send", 300), ("recv_", 200))):
        b = gloo_rank(rank, 2, {"mesh_pp": [0, 1]})
        issue(b, op, 100, 1, [[[3, 16, 64]], [], [], []], ["TensorList", "", "Scalar", "Scalar"])
        transfer(b, op.rstrip("_"), 100.5, end - 100.5, [3, 16, 64], tid=b.pid)
        ranks.append(b)
    calls, d = joined(tmp_path, ranks)
    assert calls == {"pp": 2}
    assert [rc.matched for rc in d.comm.ranks] == [1, 1]
    assert d.comm.ranks[0].wait_s == pytest.approx(100 * US)


def pp_pair(spans, hosts) -> list:
    """A two-rank pipeline group whose rank 0 sends and rank 1 receives, hand-made: spans
    ((send start, end), (recv start, end)) µs, each c10d op 1 µs from its start and gloo's span from
    0.5 µs on; hosts: each rank's host_name (None: none)."""
    ranks = []
    for rank, (op, (start, end)) in enumerate(zip(("send", "recv_"), spans)):
        b = gloo_rank(rank, 2, {"mesh_pp": [0, 1]})
        b.host = hosts[rank]
        issue(b, op, start, 1, [[[3, 16, 64]], [], [], []], ["TensorList", "", "Scalar", "Scalar"])
        transfer(b, op.rstrip("_"), start + 0.5, end - start - 0.5, [3, 16, 64], tid=b.pid)
        ranks.append(b)
    return ranks


@pytest.mark.parametrize("hosts", [("h", "h"), ("a", "b"), (None, None), ("localhost", "localhost")])
def test_a_pipeline_transfer_on_one_host_is_timed_on_its_clock(tmp_path, hosts):
    """The runtime schedules' way (torch.distributed.pipelining): rank 1 posts its receive early
    (c10d::recv_ 100-101, gloo:recv 100.5-450: the bytes land at 450), rank 0 sends late
    (c10d::send 400-401, gloo:send 400.5-900: its wait is at the step's end). On one host the two
    traces share a clock: the transfer is 450 - 400.5 = 49.5. Hosts apart or unknown, the clocks
    are not compared: the shorter span (349.5) stands. The waits are the excess over the shorter
    span either way (the stragglers' basis): the send 150, the receive 0."""
    _, d = joined(tmp_path, pp_pair(((400, 900), (100, 450)), hosts))
    one_clock = hosts[0] not in (None, "localhost") and hosts[0] == hosts[1]    # any machine is localhost
    xfer = 49.5 if one_clock else 349.5
    assert [rc.wait_s for rc in d.comm.ranks] == pytest.approx([150 * US, 0.0])
    (o,) = {(o.axis, o.busbw_median_gbps, o.busbw_basis) for o in d.comm.ops}
    assert o == ("pp", pytest.approx(3 * 16 * 64 * 4 / (xfer * US) / 1e9), "transfer")   # fp32, p2p bus factor 1


def test_a_clock_past_int64_is_not_compared(tmp_path):
    """baseTimeNanoseconds 1e25 (no real clock's) on both ranks of one host: their clocks are not
    compared (in ns it overflows int64) and the shorter span (349.5) stands; nothing fails."""
    for b in pp_pair(((400, 900), (100, 450)), ("h", "h")):
        doc = b.doc()
        doc["baseTimeNanoseconds"] = 10 ** 25
        with open(os.path.join(str(tmp_path), f"rank{b.rank}_trace.json"), "w") as f:
            json.dump(doc, f)
    d = diagnose(load_job(str(tmp_path)))
    assert [o.busbw_median_gbps for o in d.comm.ops] == pytest.approx([3 * 16 * 64 * 4 / (349.5 * US) / 1e9] * 2)


def test_a_receive_posted_after_its_send_keeps_the_shorter_span(tmp_path):
    """On one host, a receive posted after the send began (send 100.5-900, recv 400.5-420) may
    have found the bytes there: the receive's end less the send's start (319.5) is the receiver's
    delay, not the transfer, and the shorter span (19.5) stands: 12288 B in 19.5 µs."""
    _, d = joined(tmp_path, pp_pair(((100, 900), (400, 420)), ("h", "h")))
    assert [rc.wait_s for rc in d.comm.ranks] == pytest.approx([780 * US, 0.0])
    assert [o.busbw_median_gbps for o in d.comm.ops] == pytest.approx([3 * 16 * 64 * 4 / (19.5 * US) / 1e9] * 2)


# -- real runs of a torchtitan-style job ----------------------------------------------------------
SCHEDULES = ("1f1b", "interleaved-1f1b")
COMM_PREFIXES = ("gloo:", "c10d::", "_c10d_functional::", "_c10d_functional_autograd::")


@pytest.fixture(scope="module")
def native3d(native3d_run):
    """One small run per schedule: its folder and its diagnosis."""
    return {s: (native3d_run(s), diagnose(load_job(native3d_run(s)))) for s in SCHEDULES}


def raw_ranks(folder: str):
    """Per rank: (main thread id, the events of the analysis window: those starting before the
    last ProfilerStep, as diag's host window)."""
    top = os.path.join(folder, "profile_traces")
    it = os.path.join(top, sorted(os.listdir(top), key=lambda s: int(s.split("_")[-1]))[-1])
    for name in sorted(os.listdir(it)):
        ev = [e for e in json.load(open(os.path.join(it, name)))["traceEvents"] if e.get("ph") == "X"]
        steps = [e for e in ev if e["name"].startswith("ProfilerStep")]
        last = max(e["ts"] for e in steps)
        yield steps[0]["tid"], [e for e in ev if e["ts"] < last and not e["name"].startswith("ProfilerStep")]


def span(e) -> tuple:
    return e["ts"], e["ts"] + e["dur"]


def nelems(e) -> int:
    dims = e["args"]["Input Dims"][0]
    n = 1
    for d in dims:
        n *= d
    return n


@pytest.mark.slow
def test_every_tensor_and_data_parallel_collective_gets_its_axis(native3d):
    """From the raw events: a worker thread that ran a 3-D tensor (sequence-parallel activations)
    serves tp; one that ran FSDP's flat shards (1-D, >= 4096 elements) serves dp. Their transfers
    are the tp and dp instances, every one; what is left unknown is only the one-element
    all-reduces (clip_grad_norm_'s over pp: nothing tells that group from the world's)."""
    for folder, d in native3d.values():
        want = {"tp": 0, "dp": 0, "unknown": 0}
        for main, ev in raw_ranks(folder):
            by_thread = {}
            for e in ev:
                if e["name"].startswith("gloo:") and e["tid"] != main:
                    by_thread.setdefault(e["tid"], []).append(e)
            for spans in by_thread.values():
                dims = [len(e["args"]["Input Dims"][0]) for e in spans]
                axis = "tp" if 3 in dims else "dp" if any(k == 1 and nelems(e) >= 4096 for k, e in zip(dims, spans)) \
                    else "unknown"
                want[axis] += len(spans)
                assert axis != "unknown" or all(nelems(e) == 1 for e in spans)
        got = {a: sum(o.calls for o in d.comm.ops if o.axis == a and o.op not in ("send", "recv")) for a in want}
        assert got == want
        assert all(rc.matched > 0 for rc in d.comm.ranks)


@pytest.mark.slow
def test_tp_exposed_time_holds_the_main_threads_waits_on_tp(native3d):
    """The main thread's time in `_c10d_functional::wait_tensor` on 3-D tensors (DTensor's
    tensor-parallel activations), per rank, union, mean over ranks: TP's exposed time is at least
    that (it was 93% hidden when the wait counted as compute)."""
    for folder, d in native3d.values():
        waits = [length([span(e) for e in ev if e["tid"] == main and e["name"] == "_c10d_functional::wait_tensor"
                         and len(e["args"]["Input Dims"][0]) == 3]) for main, ev in raw_ranks(folder)]
        tp = next(a for a in d.comm.axes if a.axis == "tp")
        assert tp.exposed_s >= sum(waits) / len(waits) * US > 0


def pp_transfers(folder: str) -> list:
    """From the raw JSON of a one-host run, each pipeline send/recv pair's transfer by the rule
    worked by hand above: the k-th `gloo:send` of a rank meets the k-th `gloo:recv` of its pp peer
    (the only peer it sends to); on the host's clock (baseTimeNanoseconds + ts), a receive posted
    first times it from the send's start to its own end where that is shorter than both spans,
    else the shorter span stands (in integer ns, as the trace gives them). µs, one per pair."""
    top = os.path.join(folder, "profile_traces")
    it = os.path.join(top, sorted(os.listdir(top), key=lambda s: int(s.split("_")[-1]))[-1])
    ranks = {}
    for name in os.listdir(it):
        doc = json.load(open(os.path.join(it, name)))
        info = doc["distributedInfo"]
        (peer,) = [r for g in info["pg_config"] if "pp" in g["pg_desc"] and len(g["ranks"]) == 2
                   for r in g["ranks"] if r != info["rank"]]
        ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        steps = [e for e in ev if e["name"].startswith("ProfilerStep")]
        last, main = max(e["ts"] for e in steps), steps[0]["tid"]
        # integer nanoseconds: the host clock's epoch (~1.7e18 ns) as float microseconds keeps a quarter of a
        # microsecond, 0.3% of an 80 us transfer, enough to move a median between two far-apart middle values
        base = int(doc["baseTimeNanoseconds"])
        spans = {op: [(base + round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in sorted(ev, key=lambda e: e["ts"])
                      if e["name"] == f"gloo:{op}" and e["tid"] == main and e["ts"] < last] for op in ("send", "recv")}
        ranks[info["rank"]] = (doc["host_name"], peer, spans)
    out = []
    for rank, (host, peer, spans) in ranks.items():
        assert ranks[peer][0] == host                       # one host: its clock is both traces'
        for (ss, sd), (rs, rd) in zip(spans["send"], ranks[peer][2]["recv"], strict=True):
            on_clock = rs + rd - ss
            out.append((on_clock if rs <= ss and 0 < on_clock < min(sd, rd) else min(sd, rd)) / 1000)
    return out


def test_the_hosts_clock_is_kept_to_the_nanosecond(tmp_path):
    """A send/recv pair of one host is timed across two traces on the host's clock: baseTimeNanoseconds
    (~1.8e18 on a 2026 clock) plus each event's ts. As float microseconds that sum keeps only a quarter of a
    microsecond, 0.3% of an 80 us transfer (a CI run's pp busbw read 0.4% off its raw JSON): every event's
    place on the host's clock is base + ts, to the nanosecond."""
    b = TraceBuilder(base_ts=5154873304966.396)
    b.step(1, 0.0, 100.0).cpu_op("aten::mm", 10.123, 5.0)
    doc = b.doc()
    doc["baseTimeNanoseconds"] = base = 1764470000123456789
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    rt = load_job(str(path)).ranks[0]
    assert sorted(rt.start_epoch_ns + int(x) for x in rt.events.ts_ns) == \
        sorted(base + round(e["ts"] * 1000) for e in doc["traceEvents"])


@pytest.mark.slow
def test_pipeline_transfers_are_timed_on_the_hosts_clock(native3d):
    """Every pipeline send/recv of both runs, from the raw JSON (pp_transfers): diag's pp busbw is
    the median over the pairs of the bytes over that transfer. The interleaved run's runtime posts
    receives early and waits on its sends at the step's end: there the shorter span was a wait,
    most of a step, and the link read 100x slow (0.016 GB/s against 1.6 on the trainer's CPU runs)."""
    for folder, d in native3d.values():
        want = pp_transfers(folder)
        pp = [o for o in d.comm.ops if o.axis == "pp"]
        assert sorted(o.op for o in pp) == ["recv", "send"]
        for o in pp:
            assert o.busbw_basis == "transfer" and o.calls == len(want)
            assert o.busbw_median_gbps == pytest.approx(
                float(np.median([o.median_bytes / (t * US) for t in want])) / 1e9, rel=1e-9)


def compute_share(d) -> float:
    return sum(r.breakdown.compute_s / r.breakdown.span_s for r in d.ranks) / len(d.ranks)


@pytest.mark.slow
def test_an_interleaved_runs_compute_share_is_like_1f1bs(native3d):
    """The same model and batch: interleaving changes the order of the work, not how much there
    is. Counting the ops inside the long-open sends as communication made it 3% against 50%."""
    ratio = compute_share(native3d["interleaved-1f1b"][1]) / compute_share(native3d["1f1b"][1])
    assert 1 / 3 < ratio < 3


@pytest.mark.slow
def test_ops_inside_sends_and_receives_in_flight_are_compute(native3d):
    """Per rank, from the raw events: the main thread's ops (not communication, and not inside a
    communication call) that run inside its gloo:send / gloo:recv spans are all compute."""
    for folder, d in native3d.values():
        for (main, ev), r in zip(raw_ranks(folder), d.ranks):
            mine = [e for e in ev if e["tid"] == main and e.get("cat") == "cpu_op"]
            calls = [span(e) for e in mine if e["name"].startswith(COMM_PREFIXES)]
            ops = [span(e) for e in mine if not e["name"].startswith(COMM_PREFIXES)]
            open_p2p = [span(e) for e in ev if e["tid"] == main and e["name"] in ("gloo:send", "gloo:recv")]
            inside = [(max(s, a), min(e, b)) for s, e in ops for a, b in open_p2p if s < b and e > a]
            assert r.breakdown.compute_s >= length(minus(inside, calls)) * US * (1 - 1e-9)
