"""Fuzzing the trace loader and the analyses with malformed traces (hypothesis).

Every input must end in a Diagnosis that renders, or in a TraceError naming the file: never
another exception, never a hang. Cases: random events of random types (missing, extra and
wrong-typed fields; NaN, negative and enormous timestamps and durations; zero-length and
overlapping events; unknown phases, categories and args), truncated JSON and gzip, random
byte damage, non-UTF-8 bytes and deep nesting. The number of cases run is printed.
"""
import gzip
import json
import math

from hypothesis import HealthCheck, given, settings, strategies as st

from diag.analysis import diagnose
from diag.advise.recommend import with_advice
from diag.report import render
from diag.trace import TraceError, load_job

COUNT = {"cases": 0, "diagnosed": 0, "rejected": 0}

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70),
                    st.sampled_from([0, 1, 1e6, 1.7e15, 4.4e12, -1.0, 1e300]))
anything = st.recursive(st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=20)),
                        lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c, max_size=4)),
                        max_leaves=10)
NAMES = ["ProfilerStep#1", "ProfilerStep#2", "aten::mm", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)",
         "Memcpy HtoD", "gloo:all_reduce", "c10d::allreduce_", "record_param_comms", "diag:comm:tp:all_reduce:64",
         "cudaLaunchKernel", "gemm"]
CATS = ["kernel", "cpu_op", "user_annotation", "cuda_runtime", "gpu_memcpy", "gpu_memset", "Trace", "weird_new_cat"]
args = st.fixed_dictionaries({}, optional={
    "stream": st.one_of(st.integers(-2, 50), anything), "device": st.one_of(st.integers(-1, 8), anything),
    "correlation": st.one_of(st.integers(0, 20), anything), "External id": anything,
    "Collective name": st.one_of(st.sampled_from(["allreduce", "send", "all_to_all"]), anything),
    "In msg nelems": anything, "Out msg nelems": anything, "Group size": anything, "dtype": anything,
    "Process Group Ranks": st.one_of(st.just("[0, 1]"), anything), "Input Dims": anything, "unknown": anything})
event = st.fixed_dictionaries({}, optional={
    "ph": st.one_of(st.sampled_from(["X", "X", "X", "M", "s", "f", "i", "B", "E", "C"]), anything),
    "cat": st.one_of(st.sampled_from(CATS), anything), "name": st.one_of(st.sampled_from(NAMES), anything),
    "ts": st.one_of(st.floats(0, 1000), numbers, anything), "dur": st.one_of(st.floats(0, 100), numbers, anything),
    "pid": st.one_of(st.integers(0, 3), st.text(max_size=5), anything),
    "tid": st.one_of(st.integers(0, 3), st.text(max_size=5), anything), "args": st.one_of(args, anything)})
document = st.one_of(
    st.fixed_dictionaries({"traceEvents": st.lists(event, max_size=40)},
                          optional={"distributedInfo": st.one_of(anything, st.fixed_dictionaries(
                              {"rank": st.one_of(st.integers(-1, 4), anything),
                               "world_size": st.one_of(st.integers(-1, 4), anything),
                               "pg_config": anything})),
                                    "deviceProperties": anything, "baseTimeNanoseconds": anything}),
    st.lists(event, max_size=20), anything)


def encode(doc) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()     # NaN/Infinity tokens are not JSON: a case too


damage = st.one_of(st.just(None), st.tuples(st.sampled_from(["truncate", "flip", "gzip", "gzip-truncate",
                                                             "latin1", "nest"]), st.integers(0, 10**6)))


def apply(data: bytes, how) -> bytes:
    if how is None:
        return data
    kind, k = how
    if kind == "truncate":
        return data[: k % (len(data) + 1)]
    if kind == "flip" and data:
        i = k % len(data)
        return data[:i] + bytes([(data[i] + 1 + k % 254) % 256]) + data[i + 1:]
    if kind == "gzip":
        return gzip.compress(data)
    if kind == "gzip-truncate":
        z = gzip.compress(data)
        return z[: k % len(z)]
    if kind == "latin1":
        return data.replace(b"gemm", "g\xe9mm".encode("latin-1"))
    if kind == "nest":
        depth = 1000 + k % 100000
        return b'{"traceEvents": ' + b"[" * depth + b"]" * depth + b"}"
    return data


def check(path) -> None:
    COUNT["cases"] += 1
    try:
        job = load_job(str(path))
    except TraceError as e:
        assert str(path) in str(e) or e.path
        COUNT["rejected"] += 1
        return
    d = with_advice(diagnose(job))
    for fmt in ("text", "json", "markdown"):
        render(d, fmt)
    for r in d.ranks:
        b = r.breakdown
        assert all(math.isfinite(x) and x >= 0 for x in (b.span_s, b.compute_s, b.comm_s, b.idle_s))
    COUNT["diagnosed"] += 1


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(document, damage)
def test_fuzz_one_file(tmp_path_factory, doc, how):
    p = tmp_path_factory.mktemp("fuzz") / "trace.json"
    p.write_bytes(apply(encode(doc), how))
    check(p)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(document, damage), min_size=2, max_size=4))
def test_fuzz_directory(tmp_path_factory, files):
    d = tmp_path_factory.mktemp("fuzzdir")
    for i, (doc, how) in enumerate(files):
        (d / f"rank{i}.json").write_bytes(apply(encode(doc), how))
    check(d)


def test_zz_report_counts():
    print(f"\nfuzz: {COUNT['cases']} cases: {COUNT['diagnosed']} diagnosed, {COUNT['rejected']} rejected "
          f"with a clear error, 0 other exceptions")
    assert COUNT["cases"] >= 400
