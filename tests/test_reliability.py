"""Issue #20, the red team's classes outside the dashboard: summaries that do not verify, reports
written over their inputs, special files named like traces, planted temporary names.
Each test is built from hand-made inputs of the class, and checks values against the full
analysis of the same traces (--no-summaries) or the bytes on disk."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import msgspec
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import DATA, ROOT, analysis, comparable
from diag.analysis import summary_file
from diag.analysis.summary_file import SUFFIX
from diag.cli import main
from diag.trace import TraceError
from diag.trace.safeio import atomic_write, read_regular

DLRM = os.path.join(DATA, "dlrm_4_ranks_alltoall")


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return r.exit_code, r.output


@pytest.fixture
def run(tmp_path):
    """A copy of a real 4-rank job, summarised."""
    d = shutil.copytree(DLRM, tmp_path / "run", ignore=shutil.ignore_patterns(f"*{SUFFIX}"))
    assert cli("summarize", d)[0] == 0
    return str(d)


def _traces(run):
    return sorted(n for n in os.listdir(run) if n.endswith(".json"))


# --- 1. summaries verify their own bytes ------------------------------------------------------
def test_every_flipped_bit_of_a_summary_is_refused(run):
    path = os.path.join(run, _traces(run)[0] + SUFFIX)
    good = open(path, "rb").read()
    rng = random.Random(20)
    spots = rng.sample(range(len(good)), min(len(good), 1500))
    for i in spots:
        bad = bytearray(good)
        bad[i] ^= 1 << rng.randrange(8)
        with open(path, "wb") as f:
            f.write(bad)
        with pytest.raises(TraceError):
            summary_file.read(path)
    open(path, "wb").write(good)
    summary_file.read(path)


def test_a_corrupt_summary_is_never_used(run, tmp_path):
    full = analysis(run, "--no-summaries")
    name = _traces(run)[1] + SUFFIX
    path = os.path.join(run, name)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10                                   # one bit, in the payload
    open(path, "wb").write(data)
    merged = analysis(run)                                         # the trace is there: read instead
    assert comparable(merged) == comparable(full)
    assert any(name in n and "checksum" in n and "analysed the trace instead" in n for n in merged["notes"])
    alone = tmp_path / "alone"                                     # no trace: the rank is a problem
    alone.mkdir()
    for n in os.listdir(run):
        if n.endswith(SUFFIX):
            shutil.copy(os.path.join(run, n), alone)
    d = analysis(alone)
    assert len(d["ranks"]) == 3 and [os.path.basename(p["file"]) for p in d["problems"]] == [name]
    assert "checksum" in d["problems"][0]["problem"]


def _forge(path, change):
    """Rewrite a summary with `change` applied and a correct digest: a forger's summary."""
    env = msgspec.msgpack.decode(open(path, "rb").read(), type=summary_file._Envelope)
    sf = summary_file._DECODER.decode(env.payload)
    change(sf.summary)
    summary_file.write(path, sf)


def _set(obj, attr, value):
    setattr(obj, attr, value)


FORGERIES = {
    "NaN time": lambda s: _set(s.result.breakdown, "compute_s", float("nan")),
    "negative time": lambda s: _set(s.result.overlap, "exposed_s", -1.0),
    "parts past the span": lambda s: _set(s.result.breakdown, "idle_s", s.result.breakdown.idle_s + 1.0),
    "floats for ids": lambda s: _set(s.comms, "coll", s.comms.coll.astype(np.float64)),
    "negative durations": lambda s: _set(s.comms, "dur_ns", -s.comms.dur_ns - 1),
    "share over 1": lambda s: _set(s.result.top_kernels[0], "share", 3.0),
    "intervals backwards": lambda s: _set(s.comms, "compute", (s.comms.compute[1], s.comms.compute[0])),
}


@pytest.mark.parametrize("what", FORGERIES)
def test_a_summary_with_impossible_values_is_refused(run, what):
    name = _traces(run)[2] + SUFFIX
    _forge(os.path.join(run, name), FORGERIES[what])
    with pytest.raises(TraceError, match="corrupt summary"):
        summary_file.read(os.path.join(run, name))
    merged = analysis(run)
    assert comparable(merged) == comparable(analysis(run, "--no-summaries"))
    assert any(name in n and "corrupt summary" in n for n in merged["notes"])


@pytest.mark.parametrize("rank", [-3, 1 << 40])
def test_an_impossible_rank_in_a_summary_is_unknown_with_a_note(run, rank):
    names = _traces(run)
    _forge(os.path.join(run, names[0] + SUFFIX), lambda s: _set(s, "rank", rank))
    for n in names:
        os.remove(os.path.join(run, n))                            # summaries alone: used as they are
    d = analysis(run)
    assert len(d["ranks"]) == 4 and not d["problems"]
    notes = "\n".join(d["notes"] + [x for r in d["ranks"] for x in r["notes"]])
    assert f"rank {rank} is not possible" in notes


def test_an_old_summary_version_is_named(run):
    path = os.path.join(run, _traces(run)[0] + SUFFIX)
    open(path, "wb").write(msgspec.msgpack.encode({"format": summary_file.FORMAT, "version": 3}))
    with pytest.raises(TraceError, match="version 3, this diag reads 4"):
        summary_file.read(path)


# --- 2. -o never destroys what it analyses ----------------------------------------------------
def test_output_over_an_input_is_refused(run):
    trace = os.path.join(run, _traces(run)[1])
    before = {n: open(os.path.join(run, n), "rb").read() for n in os.listdir(run)}
    cases = [("analyze", trace, "-o", trace), ("analyze", run, "-o", trace),
             ("analyze", run, "-o", os.path.join(run, "diag_run.json")),
             ("analyze", run, "-o", os.path.join(run, "report.txt")),
             ("recommend", run, "-o", trace), ("compare", run, DATA, "-o", trace),
             ("export", run, "--prometheus", os.path.join(run, "x.prom"))]
    for args in cases:
        code, out = cli(*args)
        assert code == 2 and ("not overwritten" in out or "not written there" in out), (args, out)
    assert {n: open(os.path.join(run, n), "rb").read() for n in os.listdir(run)} == before
    link = os.path.join(os.path.dirname(run), "link.json")          # a symlink to an input is the input
    os.symlink(trace, link)
    assert cli("analyze", trace, "-o", link)[0] == 2 and open(trace, "rb").read() == before[os.path.basename(trace)]


def test_output_with_force_is_written_atomically(run):
    out = os.path.join(run, "report.txt")
    code, _ = cli("analyze", run, "-o", out, "--force")
    assert code == 0
    assert open(out).read() == CliRunner().invoke(main, ["analyze", run]).output
    assert not [n for n in os.listdir(run) if n.endswith(".partial")]


# --- 3. special files are not read -----------------------------------------------------------
def _analyze_subprocess(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "diag.cli", "analyze", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})


def test_fifo_and_devices_named_like_traces_neither_hang_nor_grow(run, tmp_path):
    fifo = tmp_path / "rank-9.pt.trace.json"
    os.mkfifo(fifo)
    p = _analyze_subprocess(fifo)
    assert p.returncode == 2 and f"{fifo}: is a FIFO (named pipe), not a regular file" in p.stderr, p.stderr
    p = _analyze_subprocess("/dev/zero")
    assert p.returncode == 2 and "/dev/zero: is a character device" in p.stderr, p.stderr
    # in a job's folder: a FIFO trace, a FIFO summary, a link to /dev/zero; the real ranks are analysed
    os.mkfifo(os.path.join(run, "rank-7.pt.trace.json"))
    os.mkfifo(os.path.join(run, "rank-8.pt.trace.json.diagsum"))
    os.symlink("/dev/zero", os.path.join(run, "rank-6.pt.trace.json.gz"))
    os.symlink("/dev/zero", os.path.join(run, "diag_run.json"))
    p = _analyze_subprocess(run, "--format", "json", "--bench", fifo)
    assert p.returncode == 2 and "FIFO" in p.stderr                 # a --bench that is a FIFO: named
    p = _analyze_subprocess(run, "--format", "json")
    assert p.returncode == 0, p.stderr
    import json

    d = json.loads(p.stdout)
    assert len(d["ranks"]) == 4
    problems = {os.path.basename(x["file"]): x["problem"] for x in d["problems"]}
    assert "FIFO" in problems["rank-8.pt.trace.json.diagsum"]
    assert "character device" in problems["diag_run.json"]


def test_reads_are_bounded_by_bytes_read_not_claimed(tmp_path):
    f = tmp_path / "big.json"
    f.write_bytes(b" " * 1001)
    with pytest.raises(TraceError, match="larger than 1,000 bytes"):
        read_regular(str(f), 1000)
    assert read_regular("/proc/self/status", 1 << 20).startswith(b"Name:")   # claims size 0, has bytes
    with pytest.raises(TraceError, match="larger than 10 bytes"):
        read_regular("/proc/self/status", 10)


# --- 8. temporaries are created exclusively ---------------------------------------------------
def test_planted_temporary_names_are_not_followed(run, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    trace = os.path.join(run, _traces(run)[0])
    for pid in (os.getpid(), os.getpid() + 1):                      # the old predictable names
        os.symlink(victim, f"{trace}{SUFFIX}.{pid}.partial")
    os.symlink(victim, os.path.join(run, "rank-0.pt.trace.partial.gz"))
    code, out = cli("summarize", "--force", run)
    assert code == 0, out
    assert victim.read_text() == "precious"
    summary_file.read(trace + SUFFIX)
    out = tmp_path / "report.txt"
    os.symlink(victim, f"{out}.{os.getpid()}.partial")
    atomic_write(str(out), "report")
    assert out.read_text() == "report" and victim.read_text() == "precious"
