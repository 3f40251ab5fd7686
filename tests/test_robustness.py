"""Robustness of the analyser against what real jobs leave behind (issue: bad input)."""
import gzip
import json
import os
import subprocess
import sys

from conftest import ROOT
from diag.analysis import diagnose
from diag.advise.recommend import with_advice
from diag.trace import Kind, load_job
from kineto import TraceBuilder


# ru_maxrss survives exec: a child forked straight from this (large) test process would report
# our memory. A small trampoline process forks the command and reports its peak instead.
TRAMPOLINE = ("import os, sys, subprocess\n"
              "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
              "_, status, usage = os.wait4(p.pid, 0)\n"
              "print('PEAK', os.waitstatus_to_exitcode(status), usage.ru_maxrss, file=sys.stderr)")


def peak_mib_of(cmd, env=None):
    """Run cmd; (exit code, its stderr, its own peak RSS in MiB)."""
    p = subprocess.run([sys.executable, "-c", TRAMPOLINE, *cmd], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})}, cwd=ROOT)
    lines = p.stderr.strip().splitlines()
    _, code, kib = lines[-1].split()
    return int(code), "\n".join(lines[:-1]), int(kib) / 1024


def test_decompression_bomb_is_refused_with_bounded_memory(tmp_path):
    bomb = tmp_path / "bomb.json.gz"
    payload = b'{"traceEvents": [' + b" " * (300 << 20) + b"]}"          # 300 MiB of JSON whitespace
    bomb.write_bytes(gzip.compress(payload, compresslevel=9))
    del payload
    assert bomb.stat().st_size < 3 << 20
    code, err, peak = peak_mib_of([sys.executable, "-m", "diag.cli", "analyze", str(bomb)])
    assert code == 2 and "decompression bomb" in err and str(bomb) in err, err
    assert peak < 160, peak          # stops at the limit (64 MiB here), never inflates 300 MiB
    code, err, _ = peak_mib_of([sys.executable, "-m", "diag.cli", "analyze", str(bomb)],
                               env={"DIAG_MAX_TRACE_BYTES": str(8 << 20)})
    assert code == 2 and "8,388,608 bytes" in err
    # ...and the same variable lets a user allow it: then it is simply not a trace (only spaces).
    code, err, _ = peak_mib_of([sys.executable, "-m", "diag.cli", "analyze", str(bomb)],
                               env={"DIAG_MAX_TRACE_BYTES": str(400 << 20)})
    assert code == 2 and "no events" in err, err


def test_multi_member_gzip_and_limit_override(tmp_path):
    doc = TraceBuilder().step(1, 0, 10).kernel("k", 1, 2).doc()
    text = json.dumps(doc).encode()
    half = len(text) // 2
    p = tmp_path / "two_members.json.gz"
    p.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]))   # `cat a.gz b.gz` style
    job = load_job(str(p), strict=True)
    assert len(job.ranks[0].events) == len(doc["traceEvents"])


def test_unknown_categories_phases_and_args_are_not_fatal(tmp_path):
    b = TraceBuilder().step(1, 0, 100).step(2, 100, 100).step(3, 200, 100)
    b.kernel("gemm", 10, 30, brand_new_arg={"nested": [1, 2]}).kernel("gemm", 110, 30)
    b.events.append({"ph": "X", "cat": "cuda_graph_replay_v9", "name": "graph", "pid": 100, "tid": 100,
                     "ts": 1_000_050.0, "dur": 5.0, "args": {"Graph id": 7}})
    b.events.append({"ph": "C", "name": "counter", "pid": 100, "ts": 1_000_001.0, "args": {"v": 3}})
    b.events.append({"ph": "X", "cat": "kernel", "name": 12345, "pid": 0, "tid": 7, "ts": 1_000_020.0,
                     "dur": [1], "args": "not an object"})          # odd types: kept, coerced
    job = load_job(b.write(str(tmp_path / "new.json")), strict=True)
    t = job.ranks[0].events
    assert (t.kind == Kind.OTHER).sum() == 1                          # the new category is kept as OTHER
    d = with_advice(diagnose(job))
    r = d.ranks[0]
    assert r.breakdown.compute_s > 0
    assert any("phase 'C'" in n for n in r.notes)                     # the counter event is counted, not fatal
    assert any("duration" in n for n in r.notes)                      # the list-valued dur is reported


# The one unpickling: a chunk's columns sent back by diag's own forked decode worker
# (trace/chunks.py `_gathered`), through a memfd or a pipe only the two processes hold, as multiprocessing's
# Connection.recv does for a Pool; trace content is in it only as the values of strings and arrays
# that diag's own pickling wrote, never as opcodes. Flight Recorder pickles go through
# trace/flightrec.py's restricted unpickler, which this pattern does not match.
UNPICKLED_HERE = {("chunks.py", "pickle.load(f)")}


def test_no_eval_pickle_or_shell_on_trace_content():
    """The analyser never hands trace content to eval/exec/pickle/a shell."""
    import re
    bad = re.compile(r"\b(eval|exec)\(|pickle\.loads?(\(\w*\))?|shell=True|os\.system\(")
    seen = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "diag")):
        for f in files:
            if f.endswith(".py"):
                src = open(os.path.join(dirpath, f)).read()
                for m in bad.finditer(src):
                    assert (f, m.group(0)) in UNPICKLED_HERE, (f, m.group(0))
                    seen.append((f, m.group(0)))
    assert sorted(seen) == sorted(UNPICKLED_HERE)      # each exception is still needed, and used once


def test_implausible_rank_or_world_size_is_unknown_not_a_crash(tmp_path):
    """Found by the atheris fuzzer: rank 10^113 overflowed the int64 rank columns in diagnose."""
    for rank, world, want_rank, want_world in [(10**113, 300, 0, 300), (5, 4, 0, 4), (True, 2, 0, 2),
                                               (1, 10**30, 1, None), (3, 8, 3, 8)]:
        b = TraceBuilder(rank=rank, world_size=world).step(1, 0, 100)
        b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 10, 30, **{"Collective name": "allreduce",
                 "In msg nelems": 1024, "Out msg nelems": 1024, "Group size": 2, "dtype": "Float"})
        job = load_job(b.write(str(tmp_path / "r.json")), strict=True)
        d = with_advice(diagnose(job))
        assert (d.ranks[0].rank, job.world_size) == (want_rank, want_world), (rank, world)
        if want_rank != rank:
            assert any("no usable rank" in n for n in job.notes)


def test_integer_fields_past_their_type_are_missing_not_wrapped():
    import warnings

    import numpy as np

    from diag.trace.columns import num_column
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # no "invalid value encountered in cast" either
        got = num_column([1, 2**63, 2**63 - 1024, -2**63, -2**64, 1e300, None, "7"], np.int64)
        assert got.tolist() == [1, -1, 2**63 - 1024, -2**63, -1, -1, -1, 7]
        assert num_column([2**31, 2**31 - 1, 5], np.int32).tolist() == [-1, 2**31 - 1, 5]
