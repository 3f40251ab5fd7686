"""Chunked and parallel decoding give exactly the table a whole, serial decode gives."""
import gzip
import json
import os

import numpy as np
import pytest

from conftest import DATA
from diag.trace import chunks, load_job, load_rank, schema

COLUMNS = ("ts_ns", "dur_ns", "kind", "thread", "device", "correlation", "external_id")


def table_of(path, monkeypatch, chunk_bytes, workers):
    monkeypatch.setattr(schema, "CHUNK_BYTES", chunk_bytes)
    monkeypatch.setenv("DIAG_WORKERS", str(workers))
    rt = load_rank(path)
    t = rt.events
    names = np.array(t.symbols.names, dtype=object)[t.name_id]
    return rt, {c: getattr(t, c) for c in COLUMNS}, names


def assert_same(a, b):
    (rt_a, cols_a, names_a), (rt_b, cols_b, names_b) = a, b
    for c in COLUMNS:
        assert np.array_equal(cols_a[c], cols_b[c]), c
    assert (names_a == names_b).all()
    assert len(rt_a.comms) == len(rt_b.comms)
    assert np.array_equal(rt_a.comms.in_nelems, rt_b.comms.in_nelems)
    assert rt_a.thread_names == rt_b.thread_names


@pytest.mark.parametrize("workers", [1, 2])
def test_chunked_equals_whole(monkeypatch, workers):
    path = os.path.join(DATA, "a100_rank0_of_2_nccl_args", "nccl_data.json.gz")   # ~10 MB of JSON
    whole = table_of(path, monkeypatch, 1 << 40, 1)
    chunked = table_of(path, monkeypatch, 64 << 10, workers)    # ~150 chunks
    assert_same(whole, chunked)


def test_cut_inside_an_event_falls_back_to_whole_decode(tmp_path, monkeypatch):
    """'}, {' inside an event's args (a list of objects) is not a boundary between events."""
    evs = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10.0 * i, "dur": 5.0,
            "args": {"nested": [{"a": i}, {"b": "}, {"}] * 40}} for i in range(2000)]
    p = tmp_path / "nested.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    whole = table_of(str(p), monkeypatch, 1 << 40, 1)
    for workers in (1, 2):
        assert_same(whole, table_of(str(p), monkeypatch, 4 << 10, workers))
    assert len(whole[0].events) == 2000


def test_ranges_cover_the_array_exactly(tmp_path):
    path = os.path.join(DATA, "sampled_2_of_128_ranks", "sampled_rank-0.json.gz")
    data = gzip.decompress(open(path, "rb").read())
    doc = schema.decode(data)
    old = schema.CHUNK_BYTES
    try:
        schema.CHUNK_BYTES = 32 << 10
        ranges = schema.chunk_ranges(doc.traceEvents)
    finally:
        schema.CHUNK_BYTES = old
    assert len(ranges) > 10
    n = sum(len(schema.decode_range(doc.traceEvents, a, b)) for a, b in ranges)
    assert n == len(json.loads(data)["traceEvents"])
    assert chunks.workers() >= 1


def test_directory_loaded_across_processes_equals_serial(monkeypatch):
    from diag.analysis import diagnose
    from diag.report import render
    path = os.path.join(DATA, "dlrm_4_ranks_alltoall")
    monkeypatch.setenv("DIAG_WORKERS", "1")
    serial = render(diagnose(load_job(path)), "json")
    monkeypatch.setenv("DIAG_WORKERS", "3")
    parallel = render(diagnose(load_job(path)), "json")
    assert parallel == serial


ODD_IDS = [7, 0, -1, -5, 2**53 + 1, 2**63 - 1, 2**63, 2**64 + 3, 10**400, 3.0, 2.5, "7", "x", None, True, [1], {"a": 1}]


def _both_ways(events):
    """chunk_columns of the same events decoded typed (the fast paths: ids as IdArgs, threads
    in numpy) and loosely (every value coerced, args as Args): they must agree exactly."""
    raw = json.dumps(events).encode()
    typed, loose = schema.decode_events(raw), schema._events_decoder.decode(raw)
    assert type(typed[0]) in schema.PHASE_OF and type(loose[0]) is schema.Event
    a, b = chunks.chunk_columns(typed), chunks.chunk_columns(loose)
    assert a.names == b.names and a.threads == b.threads and a.skipped == b.skipped
    assert a.cols.keys() == b.cols.keys()
    for k in a.cols:
        assert np.array_equal(a.cols[k], b.cols[k], equal_nan=k in ("ts", "dur")), k
    assert a.comm_args == b.comm_args
    return a


def _kernel(i, args, pid=0, tid=7):
    ev = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce" if i % 3 == 0 else "gemm_kernel",
          "pid": pid, "tid": tid, "ts": 10.0 * i, "dur": 5.0}
    if args is not ...:
        ev["args"] = args
    return ev


@pytest.mark.parametrize("value", ODD_IDS + [...])
def test_id_columns_fast_path_equals_loose(value):
    """Kernels' ids (stream, device, correlation, External id) of any type: decoded as integers
    where they are, else every row as Args; the columns and comm args are the same either way."""
    good = {"stream": 7, "device": 0, "correlation": 11, "External id": 3, "Collective name": "allreduce"}
    events = [_kernel(i, dict(good, correlation=11 + i)) for i in range(20)]
    for key in ("stream", "device", "correlation", "External id"):
        events.append(_kernel(len(events), ... if value is ... else dict(good, **{key: value})))
    events.append(_kernel(len(events), None if value is ... else {}))
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 0, "tid": 1,
                   "ts": 1.0, "dur": 1.0, "args": {"correlation": value if value is not ... else 4}})
    _both_ways(events)


@pytest.mark.parametrize("ids", [(1, 2), (2**63, 5), (-3, 2**64), ("12", 12), (None, 3), ("Spans", "x")])
def test_threads_fast_path_equals_loose(ids):
    """Host threads numbered by first appearance of (pid, tid): in numpy when both are integers
    in int64, by their values otherwise (a numeric string is not the integer)."""
    pid, tid = ids
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i % 4}", "pid": [pid, 1, 12][i % 3],
               "tid": [tid, 12, 2, tid][i % 4], "ts": float(i), "dur": 1.0} for i in range(40)]
    a = _both_ways(events)
    assert len(a.threads) == len(set(a.threads))


NCCL = os.path.join(DATA, "a100_rank0_of_2_nccl_args", "nccl_data.json.gz")


def test_decoded_ahead_equals_whole(monkeypatch):
    """`diag analyze FILE` forks the decoding workers once the bytes are read (prefetch.decode_ahead),
    before the analysis is imported; the loader takes their chunks: the same table."""
    from diag.trace import prefetch

    whole = table_of(NCCL, monkeypatch, 1 << 40, 1)
    monkeypatch.setenv("DIAG_WORKERS", "2")
    monkeypatch.setattr(schema, "CHUNK_BYTES", 256 << 10)
    prefetch.start(NCCL)
    prefetch.decode_ahead(NCCL)
    assert len(chunks._AHEAD) == 1 and chunks._AHEAD[0].workers
    spread, closed = chunks._AHEAD[0], []
    close = chunks.Spread.close
    monkeypatch.setattr(chunks.Spread, "close", lambda self, kill=False: closed.append(kill) or close(self, kill))
    assert_same(whole, table_of(NCCL, monkeypatch, 256 << 10, 2))
    assert chunks._AHEAD == [] and spread.workers == [] and closed == [False]   # its results taken


@pytest.mark.parametrize("loadavg,idle", [
    ("9.00 9.00 9.00 1/80 4242\n", True),     # busy a minute ago, only this process runnable now
    ("0.10 0.10 0.10 3/80 4242\n", False),    # two others runnable now on the two cores
    ("0.10 0.10 0.10 2/80 4242\n", True),     # one other: a core left
    (None, True),                              # no such file: the one-minute average (patched 0.5)
    ("garbage\n", True),
])
def test_a_worker_is_forked_ahead_where_a_core_is_idle_now(monkeypatch, tmp_path, loadavg, idle):
    """decode_ahead forks its worker where the tasks runnable at this instant leave a core free,
    not by the one-minute load average, which stays high for a minute after a job has ended."""
    monkeypatch.delenv("DIAG_WORKERS", raising=False)
    monkeypatch.setattr(chunks, "workers", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    path = tmp_path / "loadavg"
    if loadavg is not None:
        path.write_text(loadavg)
    monkeypatch.setattr(chunks, "LOADAVG", str(path))
    assert chunks._idle_core() is idle


@pytest.mark.parametrize("to_exit", [True, False])
def test_bytes_read_ahead_are_kept_only_in_a_process_that_ends_without_teardown(monkeypatch, to_exit):
    """`diag analyze FILE` (entry.read_ahead; the process ends with os._exit) keeps the bytes read
    ahead to the end rather than free them after the load; any other process (the dashboard,
    `diag tune`, these tests) lets them go."""
    from diag.trace import prefetch
    from diag.trace.read import read_bytes

    monkeypatch.setattr(prefetch, "KEEP_TO_EXIT", to_exit)
    monkeypatch.setattr(prefetch, "KEPT", [])
    prefetch.start(NCCL)
    data = read_bytes(NCCL)
    assert len(data) == 9778890 and NCCL not in prefetch._AHEAD
    assert [len(x) for x in prefetch.KEPT] == ([len(data)] if to_exit else [])


def test_decoded_ahead_for_other_bytes_is_ended(monkeypatch, tmp_path):
    """Bytes decoded ahead that the loader does not decode (here: another file) are let go: the
    workers killed and reaped, the file loaded as if nothing had been started."""
    from diag.trace import prefetch

    whole = table_of(NCCL, monkeypatch, 1 << 40, 1)
    other = tmp_path / "other.json.gz"
    other.write_bytes(open(NCCL, "rb").read())
    monkeypatch.setenv("DIAG_WORKERS", "2")
    prefetch.start(str(other))
    prefetch.decode_ahead(str(other))
    spread = chunks._AHEAD[0]
    prefetch._AHEAD.clear()
    assert_same(whole, table_of(NCCL, monkeypatch, 1 << 20, 2))
    assert chunks._AHEAD == [] and spread.workers == []


@pytest.mark.parametrize("memfd", [True, False])
def test_workers_results_come_back_whole_by_either_way(monkeypatch, memfd):
    """A worker's results come back through a file in memory (memfd) where there is one, else
    through its pipe: the same chunks either way, and each chunk made once (by one process)."""
    if memfd and chunks._store() < 0:
        pytest.skip("no memfd_create here: the pipe is the only way")
    if not memfd:
        monkeypatch.setattr(chunks, "_store", lambda: -1)
    whole = table_of(NCCL, monkeypatch, 1 << 40, 1)
    array = schema.decode(gzip.decompress(open(NCCL, "rb").read())).traceEvents
    monkeypatch.setattr(schema, "CHUNK_BYTES", 64 << 10)
    ranges = schema.chunk_ranges(array)
    spread = chunks.Spread(array, ranges, 1)
    assert (spread.workers[0][2] >= 0) == memfd
    made = []                               # after the fork: this process takes no chunk, and
    monkeypatch.setattr(chunks, "_taken", lambda fd: iter(()))             # decodes none unless
    monkeypatch.setattr(chunks, "_work", lambda *a: made.append(a[1:]))    # one fails to come back
    got = spread.results()
    assert made == [] and len(got) == len(ranges) and all(got)
    assert sum(c.rows for c in got) == len(whole[0].events)


@pytest.mark.parametrize("memfd", [True, False])
def test_chunks_of_a_dead_worker_are_decoded_here(monkeypatch, memfd):
    import signal

    if not memfd:
        monkeypatch.setattr(chunks, "_store", lambda: -1)
    whole = table_of(NCCL, monkeypatch, 1 << 40, 1)
    data = gzip.decompress(open(NCCL, "rb").read())
    array = schema.decode(data).traceEvents
    monkeypatch.setattr(schema, "CHUNK_BYTES", 64 << 10)
    ranges = schema.chunk_ranges(array)
    spread = chunks.Spread(array, ranges, 1)
    os.kill(spread.workers[0][0], signal.SIGKILL)
    got = spread.results()
    assert len(got) == len(ranges) and all(got)
    assert sum(c.rows for c in got) == len(whole[0].events)


def test_a_directorys_first_trace_is_read_ahead(monkeypatch, tmp_path):
    """`diag analyze DIR` reads and decodes the run's first trace file ahead as for FILE (start-up
    to the first byte 0.139 -> 0.051 s, benchmarks/README.md); the loader takes what was read, and
    the diagnosis is the one of a load without read-ahead. Not where the ranks go to worker
    processes (here forced by DIAG_WORKERS), nor where a rank's summary will be read instead."""
    from diag.runinputs import RunInputs, open_run, prefetch_trace
    from diag.trace import prefetch
    from diag.trace.discover import find

    folder = os.path.dirname(NCCL)
    monkeypatch.setenv("DIAG_NO_PREFETCH", "1")
    plain = open_run(folder)
    monkeypatch.delenv("DIAG_NO_PREFETCH")
    monkeypatch.setenv("DIAG_WORKERS", "2")
    monkeypatch.setattr(schema, "CHUNK_BYTES", 1 << 20)
    prefetch_trace(folder)
    (trace,) = find(folder).traces
    assert list(prefetch._AHEAD) == [trace] and len(chunks._AHEAD) == 1     # read, and decoding
    ahead = open_run(folder)
    assert prefetch._AHEAD == {} and chunks._AHEAD == []                  # taken by the loader
    assert ahead.ranks[0].events == plain.ranks[0].events > 20_000
    assert ahead.ranks[0].breakdown == plain.ranks[0].breakdown
    two = os.path.join(DATA, "dlrm_2_ranks_alltoall")
    prefetch_trace(two)                                   # DIAG_WORKERS=2: a pool of 2 workers
    assert prefetch._AHEAD == {}
    monkeypatch.delenv("DIAG_WORKERS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)   # one core: in process
    prefetch_trace(two)
    first = find(two).traces[0]
    assert list(prefetch._AHEAD) == [first]
    assert [r.events for r in open_run(two).ranks] == [r.events for r in open_run(two).ranks]
    assert prefetch._AHEAD == {}
    one = tmp_path / "one"
    one.mkdir()
    (one / "rank0.json.gz").write_bytes(open(NCCL, "rb").read())
    (one / "rank0.json.gz.diagsum").write_bytes(b"")
    prefetch_trace(str(one))
    assert prefetch._AHEAD == {}
    prefetch_trace(str(one), RunInputs(use_summaries=False))
    assert list(prefetch._AHEAD) == [str(one / "rank0.json.gz")]
    prefetch.take(str(one / "rank0.json.gz"))
    while chunks._AHEAD:
        chunks._AHEAD.pop().close(kill=True)
