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
