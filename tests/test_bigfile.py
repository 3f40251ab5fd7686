"""Big traces are mapped and decoded chunk by chunk (plain JSON), or inflated to a temporary
file first (gzip); the result is the same as reading them into memory. The thresholds are
lowered here so a 10 MB real trace takes those paths."""
from __future__ import annotations

import gzip
import os
import shutil

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
