"""Big traces are mapped and decoded chunk by chunk (plain JSON), or inflated to a temporary
file first (gzip); the result is the same as reading them into memory. The thresholds are
lowered here so a 10 MB real trace takes those paths."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import zlib

import pytest

from diag.analysis import diagnose
from diag.trace import load_job, read, schema
from diag.trace.errors import TraceError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GZ = os.path.join(ROOT, "tests", "data", "a100_rank0_of_2_nccl_args", "nccl_data.json.gz")


@pytest.fixture(scope="module")
def reference():
    return diagnose(load_job(GZ))


def _same(a, b) -> None:
    for r in (*a.ranks, *b.ranks):
        r.file = ""
    a.source = b.source = ""
    assert a == b


@pytest.mark.parametrize("workers", ["1", "2"])
def test_mapped_plain_trace_decoded_in_chunks(tmp_path, monkeypatch, reference, workers):
    plain = tmp_path / "rank0.json"
    plain.write_bytes(gzip.decompress(open(GZ, "rb").read()))
    monkeypatch.setattr(read, "MAP_MIN_BYTES", 1 << 20)
    monkeypatch.setattr(schema, "CHUNK_BYTES", 256 << 10)      # ~40 chunks: released one by one
    monkeypatch.setenv("DIAG_WORKERS", workers)                 # "2": decoded in forked workers
    data = read.read_bytes(str(plain))
    assert not isinstance(data, (bytes, bytearray))             # a map of the file
    _same(diagnose(load_job(str(plain))), reference)


def test_big_gzip_inflates_to_an_unlinked_temporary_file(tmp_path, monkeypatch, reference):
    spill = tmp_path / "spill"
    spill.mkdir()
    monkeypatch.setattr(read, "MAP_MIN_BYTES", 1 << 20)
    monkeypatch.setenv("DIAG_TMPDIR", str(spill))
    trace = tmp_path / "rank0.json.gz"
    shutil.copy(GZ, trace)
    data = read.read_bytes(str(trace))
    assert not isinstance(data, (bytes, bytearray)) and len(data) == len(gzip.decompress(trace.read_bytes()))
    assert os.listdir(spill) == []                               # unlinked: nothing left behind
    _same(diagnose(load_job(str(trace))), reference)


def test_no_room_to_inflate_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(read, "MAP_MIN_BYTES", 1 << 20)
    monkeypatch.setenv("DIAG_TMPDIR", str(tmp_path / "does-not-exist"))
    with pytest.raises(TraceError) as e:
        read.read_bytes(GZ)
    assert e.value.path == GZ and "cannot inflate to a temporary file in" in e.value.problem
    assert "DIAG_TMPDIR" in e.value.problem


@pytest.mark.parametrize("inflate", ["isal", "zlib"])
@pytest.mark.parametrize("in_piece", [7, 4096, 1 << 20])
def test_gunzip_fed_in_pieces_equals_gzip(tmp_path, monkeypatch, in_piece, inflate):
    """The compressed input is fed a piece at a time (no quadratic unconsumed-tail copies):
    three members, their boundaries inside pieces, trailing zeros, equal gzip.decompress; a
    member cut short is truncated, a damaged one corrupt, however the pieces fall. With ISA-L's
    inflate (a dependency) and with zlib's, which read.py falls back to where isal is missing."""
    monkeypatch.setattr(read, "IN_PIECE", in_piece)
    monkeypatch.setattr(read, "_inflate", __import__("isal.isal_zlib").isal_zlib if inflate == "isal" else zlib)
    text = gzip.decompress(open(GZ, "rb").read())[:300_000]
    thirds = [text[:100_003], text[100_003:200_001], text[200_001:]]
    blob = b"".join(gzip.compress(t, compresslevel=1) for t in thirds)
    assert bytes(read.gunzip("x.gz", blob + b"\0" * 5)) == text
    for cut in (len(blob) - 9, len(blob) - len(gzip.compress(thirds[2], compresslevel=1)) // 2):
        with pytest.raises(TraceError, match="truncated gzip"):
            read.gunzip("x.gz", blob[:cut])
    broken = bytearray(blob)
    broken[20:40] = b"\xff" * 20                        # inside the first member's deflate blocks
    with pytest.raises(TraceError, match="corrupt gzip") as e:
        read.gunzip("x.gz", bytes(broken))
    assert e.value.path == "x.gz"


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RssFile from Linux's /proc")
def test_cutting_a_mapped_file_into_chunks_maps_none_of_it(tmp_path):
    """chunk_ranges looks for a cut every CHUNK_BYTES; on a file just written each look can map
    a whole 2 MB folio (Linux large folios), which left half of an inflated 2 GB trace in the
    process (967 of 2,004 MB). It lets them go: the process's file pages barely move."""
    event = json.dumps({"ph": "X", "name": "k" * 200, "ts": 1, "dur": 1}).encode()
    n = (256 << 20) // (len(event) + 2)
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.write(b'{"traceEvents": [' + b", ".join([event] * n) + b"]}")
    data = read.read_bytes(str(path))
    assert read.is_mapped(data)

    def rss_file_mib() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssFile:")) / 1024

    before = rss_file_mib()
    ranges = schema.chunk_ranges(memoryview(data)[data.find(b"["):])
    assert len(ranges) > 60
    assert rss_file_mib() - before < 16, rss_file_mib() - before


def _real_traces():
    for root, _, files in os.walk(os.path.join(ROOT, "tests", "data")):
        for f in sorted(files):
            if f.endswith((".json", ".json.gz")) and f != "hta_reference.json":
                raw = open(os.path.join(root, f), "rb").read()
                yield f, gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def test_split_top_level_equals_the_whole_decode_on_every_real_trace():
    """decode_split finds the events array without reading it, on every real layout (INFO logs,
    traceName, baseTimeNanoseconds after the events; none at all), and agrees with a full decode."""
    import msgspec
    n = 0
    for name, data in _real_traces():
        whole = schema.decode(data)
        split = schema.decode_split(data)
        assert split is not None, name
        events = msgspec.json.decode(bytes(split.traceEvents), type=list[msgspec.Raw])
        assert events == msgspec.json.decode(bytes(whole.traceEvents), type=list[msgspec.Raw]), name
        for k in ("distributedInfo", "deviceProperties", "trace_id", "schemaVersion", "baseTimeNanoseconds"):
            assert getattr(split, k) == getattr(whole, k), (name, k)
        n += 1
    assert n >= 13


def _doc_bytes(**after) -> bytes:
    events = [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10.0 + i, "dur": 0.5,
               "args": {"stream": 7, "device": 0, "l": [1, {"a": "]"}]}} for i in range(50)]
    events.insert(0, {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
                      "ts": 5.0, "dur": 100.0})
    return json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1},
                       "traceEvents": events, **after}, indent=1).encode()


@pytest.mark.parametrize("after", [
    {}, {"INFO": []}, {"INFO": ["a]", "CuptiActivityProfiler.cpp:1217] Traces"], "traceName": "x]"},
    {"later": [{"id": 1}, {"id": 2}], "baseTimeNanoseconds": 7},      # objects after: a wrong guess
    {"nested": {"traceEvents": [{"ph": "X"}]}},
])
def test_mapped_trace_of_any_layout_loads_as_in_memory(tmp_path, monkeypatch, after):
    data = _doc_bytes(**after)
    small = tmp_path / "small.json"
    small.write_bytes(data)
    want = diagnose(load_job(str(small)))
    monkeypatch.setattr(read, "MAP_MIN_BYTES", 1)                # every file mapped: split first
    monkeypatch.setattr(schema, "CHUNK_BYTES", 512)              # and decoded in many chunks
    big = tmp_path / "big.json"
    big.write_bytes(data)
    _same(diagnose(load_job(str(big))), want)
    doc = schema.decode_split(data)
    if "later" not in after and "nested" not in after:
        assert doc is not None and len(msgspec_list(doc.traceEvents)) == 51


def msgspec_list(raw):
    import msgspec
    return msgspec.json.decode(bytes(raw), type=list[msgspec.Raw])


def test_mapped_truncated_or_broken_trace_names_the_problem(tmp_path, monkeypatch):
    monkeypatch.setattr(read, "MAP_MIN_BYTES", 1)
    data = _doc_bytes(traceName="t")
    (tmp_path / "cut.json").write_bytes(data[: len(data) - 40])
    with pytest.raises(TraceError, match="truncated JSON"):
        load_job(str(tmp_path / "cut.json"))
    (tmp_path / "bad.json").write_bytes(data.replace(b'"dur": 0.5', b'"dur": 0.5,,', 1))
    with pytest.raises(TraceError, match="JSON is malformed"):
        load_job(str(tmp_path / "bad.json"))
