"""Issue #20, the red team's classes outside the dashboard: summaries that do not verify, reports
written over their inputs, special files named like traces, planted temporary names.
Each test is built from hand-made inputs of the class, and checks values against the full
analysis of the same traces (--no-summaries) or the bytes on disk."""
from __future__ import annotations

import dataclasses
import json
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
    "action ends before it starts": lambda s: _set(s.pp, "act_end_ns", s.pp.act_start_ns - 1),
    "action columns differ": lambda s: _set(s.pp, "act_end_ns", s.pp.act_end_ns[:-1]),
    # the fields typed as plain lists (found by mutating each leaf of a summary: a number or a list
    # as a group key crashed the merge)
    "a number as a group key": lambda s: s.comms.group.__setitem__(0, 1 << 63),
    "a list as a group key": lambda s: s.comms.group.__setitem__(0, [1, 2]),
    "a group key of no ranks": lambda s: s.comms.group.__setitem__(0, "0,x"),
    "a number as a p2p group key": lambda s: _set(s.pp, "p2p", dataclasses.replace(
        s.pp.p2p, group=[0.5], peer=np.zeros(1, np.int32), sure=np.zeros(1, bool))),
    # times past int64 ns arithmetic (found: a clock0 of 2^63 us overflowed the clock alignment)
    "clock past int64 ns": lambda s: _set(s.comms, "clock0_us", float(1 << 63)),
    "start times near int64's end": lambda s: _set(s.comms, "start_ns", s.comms.start_ns + (1 << 62)),
    "a step of 10^300 s": lambda s: _set(s.result, "step_time_s", 1e300),
    "p2p columns differ": lambda s: _set(s.pp.p2p, "group", s.pp.p2p.group + [None]),
    "pg_config not [name, desc, ranks]": lambda s: _set(s, "pg_config", [["pg", "tp", [0, "1"]]]),
    "gemms not [op, dims, count]": lambda s: _set(s, "gemms", [["aten::mm", [[1, 2], "x"], 3]]),
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


def test_a_trace_edited_in_its_middle_makes_its_summary_stale(tmp_path):
    """A trace changed anywhere, its size kept, is not the trace its summary was made from (found:
    the fingerprint covered the first and last MiB only, and a stale summary gave rank 0 30.0%
    compute where its trace now says 81.8%)."""
    from kineto import TraceBuilder

    run = tmp_path / "run"
    run.mkdir()
    b = TraceBuilder()
    for i in range(6000):
        b.step(i, i * 100, 100).kernel("gemm", i * 100 + 10, 30)
    trace = b.write(str(run / "rank-0.pt.trace.json"), gz=False)
    assert os.path.getsize(trace) > 5 << 19                       # past 2 x the old MiB at each end
    assert cli("summarize", run)[0] == 0
    data = bytearray(open(trace, "rb").read())
    mid = len(data) // 2
    at = data.index(b'"dur": 30', mid)
    data[at:at + 9] = b'"dur": 90'                                 # same size, the middle of the file
    open(trace, "wb").write(bytes(data))
    merged = analysis(run)
    assert comparable(merged) == comparable(analysis(run, "--no-summaries"))
    assert any("made from another version" in n for n in merged["notes"]), merged["notes"]


def test_an_old_summary_version_is_named(run):
    path = os.path.join(run, _traces(run)[0] + SUFFIX)
    open(path, "wb").write(msgspec.msgpack.encode({"format": summary_file.FORMAT, "version": 3}))
    with pytest.raises(TraceError, match=f"version 3, this diag reads {summary_file.VERSION}: run `diag summarize` again"):
        summary_file.read(path)


EXTREMES = [2 ** 62, -2 ** 62, 2 ** 31, -1, 0, 2 ** 40, 10 ** 18]


def _extreme(obj, rng):
    """Set some int fields, array items and pg_config/gemm ranks of a summary to extreme values."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if isinstance(v, int) and not isinstance(v, bool) and rng.random() < 0.3:
                setattr(obj, f.name, rng.choice(EXTREMES))
            elif isinstance(v, np.ndarray) and v.dtype.kind == "i" and v.size and rng.random() < 0.3:
                v = v.copy()
                v[rng.randrange(v.size)] = np.iinfo(v.dtype).max if rng.random() < 0.5 else np.iinfo(v.dtype).min
                setattr(obj, f.name, v)
            elif f.name in ("pg_config", "gemms") and v and rng.random() < 0.5:
                inner = v[0][2] if f.name == "pg_config" else v[0][1][0]
                if inner:
                    inner[0] = rng.choice(EXTREMES)
            else:
                _extreme(v, rng)
    elif isinstance(obj, list):
        for x in obj[:5]:
            _extreme(x, rng)


def test_summaries_with_extreme_values_end_in_a_report_or_a_named_problem(run, tmp_path):
    """Forged summaries (digest correct) with extreme ints anywhere: a Diagnosis where every bad
    file is a problem or a note, never a traceback (found: codes past Coll/AXES indexed the merge)."""
    from diag.runinputs import RunInputs, open_run

    sums = sorted(n for n in os.listdir(run) if n.endswith(SUFFIX))
    done = {"diagnosed": 0, "refused": 0}
    for seed in range(40):
        rng, folder = random.Random(seed), tmp_path / f"case{seed}"
        folder.mkdir()
        for n in sums:
            shutil.copy(os.path.join(run, n), folder)
            _forge(str(folder / n), lambda s: _extreme(s, rng) if rng.random() < 0.5 else None)
        try:
            d = open_run(str(folder), RunInputs())
        except TraceError:
            done["refused"] += 1             # every file refused: one line naming them
            continue
        assert len(d.ranks) + len(d.problems) + sum(map(len, d.other_runs)) == len(sums)   # each file accounted
        done["diagnosed"] += 1
    print(f"\nextreme summaries: {done}")
    assert done["diagnosed"] > 10


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
        assert code == 2 and ("not overwritten" in out or "not written (--force" in out), (args, out)
    assert {n: open(os.path.join(run, n), "rb").read() for n in os.listdir(run)} == before
    # one trace analysed: the run it belongs to (its summary, diag_run.json, the other ranks, the
    # Flight Recorder's dumps) is not written over either, by -o or --timeline
    other = _traces(run)[0]
    open(os.path.join(run, "diag_run.json"), "w").write("{}")
    os.makedirs(os.path.join(run, "flightrec"))
    open(os.path.join(run, "flightrec", "rank_0"), "w").write("{}")
    before = {n: open(os.path.join(run, n), "rb").read() for n in os.listdir(run) if n != "flightrec"}
    for target in [trace + SUFFIX, "diag_run.json", other, other + SUFFIX,
                   os.path.join("flightrec", "rank_0")]:
        for flag in ("-o", "--timeline"):
            code, out = cli("analyze", trace, flag, os.path.join(run, target))
            assert code == 2 and "not overwritten (--force" in out, (target, flag, out)
    assert {n: open(os.path.join(run, n), "rb").read() for n in os.listdir(run) if n != "flightrec"} == before
    assert open(os.path.join(run, "flightrec", "rank_0")).read() == "{}"
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
    # named like traces, not regular files: said, not passed over in silence
    assert "FIFO" in problems["rank-7.pt.trace.json"]
    assert "character device" in problems["rank-6.pt.trace.json.gz"]


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


def test_no_writer_follows_a_planted_temporary_name(tmp_path, monkeypatch):
    """The trainer's Flight Recorder dump and the Prometheus targets file were still written
    through `<path>.<pid>.partial` / `<path>.tmp<pid>` opened by name (found by grepping every
    writer): a link planted there made them overwrite its target."""
    import importlib.util
    import types

    from instrumented_trainer.telemetry.flight_recorder import FlightRecorder

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "run"
    dumps = out / "flightrec"
    dumps.mkdir(parents=True)
    dump = dumps / "rank-0.json"
    os.symlink(victim, f"{dump}.{os.getpid()}.partial")
    c10d = types.SimpleNamespace(_dump_fr_trace_json=lambda *a: b'{"entries": []}')
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(_C=types.SimpleNamespace(_distributed_c10d=c10d)))
    monkeypatch.setenv("RANK", "0")
    FlightRecorder(str(out), 10).dump("end")
    written = json.loads(dump.read_text())
    assert written["entries"] == [] and written["diag_dump"]["reason"] == "end" and victim.read_text() == "precious"

    spec = importlib.util.spec_from_file_location("targets", os.path.join(ROOT, "dashboards", "prometheus", "targets.py"))
    targets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(targets)
    sd = tmp_path / "targets.json"
    os.symlink(victim, f"{sd}.tmp{os.getpid()}")
    targets.write_atomic(str(sd), [{"targets": ["h:1"], "labels": {}}])
    assert json.loads(sd.read_text())[0]["targets"] == ["h:1"] and victim.read_text() == "precious"
    assert sorted(os.listdir(tmp_path)) == sorted(["victim.txt", "run", "targets.json", f"targets.json.tmp{os.getpid()}"])



def test_targets_file_to_a_device_or_fifo_is_written_in_place(tmp_path, dev_null_kept):
    """targets.py -o /dev/null or a FIFO writes into it (a temporary renamed over it made
    /dev/null a regular file as root, and failed for anyone else)."""
    import stat
    import threading

    script = os.path.join(ROOT, "dashboards", "prometheus", "targets.py")
    run = lambda out: subprocess.run([sys.executable, script, "hosts", "node1", "--ranks-per-node", "2",  # noqa: E731
                                      "-o", out], capture_output=True, text=True, timeout=60)
    p = run(os.devnull)
    assert p.returncode == 0, p.stderr
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    fifo = str(tmp_path / "sd.fifo")
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)   # never blocks the exit
    reader.start()
    assert run(fifo).returncode == 0
    reader.join(30)
    assert json.loads(got[0])[0]["targets"] == ["node1:9700", "node1:9701"]
    assert os.listdir(tmp_path) == ["sd.fifo"]


# --- 7. claimed sizes never drive work -------------------------------------------------------
def _two_ranks(folder, world, meta=None):
    from kineto import TraceBuilder

    os.makedirs(folder)
    for r in (0, 1):
        b = TraceBuilder(rank=r, world_size=world).step(1, 0, 100).step(2, 100, 100)
        b.kernel("gemm", 10, 30).kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 50, 20, **{
            "Collective name": "allreduce", "Group size": 2, "In msg nelems": 1024, "Out msg nelems": 1024,
            "dtype": "Float", "Process Group Ranks": "[0, 1]"})
        b.write(os.path.join(folder, f"rank-{r}.pt.trace.json"))
    if meta:
        with open(os.path.join(folder, "diag_run.json"), "w") as f:
            json.dump(meta, f)
    return str(folder)


def _peak_bytes(fn):
    import tracemalloc

    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# One int per claimed rank would be 8 bytes x 2^24 = 128 MiB; the analysis of two small traces
# peaks far below that (measured: about 1 MiB after a first run), so a per-claimed-rank list or loop fails these.
PER_CLAIMED_RANK = 8 << 24


@pytest.mark.parametrize("sizes", [{}, {"tp": 2, "pp": 2}, {"pp": 1 << 23}, {"tp": 1 << 23}])
def test_a_claimed_world_size_costs_nothing_per_claimed_rank(tmp_path, sizes):
    from diag.runinputs import RunInputs, open_run

    run = _two_ranks(tmp_path / "run", 1 << 24)
    d, peak = _peak_bytes(lambda: open_run(run, RunInputs(sizes=sizes)))
    assert peak < PER_CLAIMED_RANK / 8, peak
    assert d.world_size == 1 << 24 and d.missing_count == (1 << 24) - 2 and len(d.ranks) == 2
    assert d.missing_ranks[:3] == [2, 3, 4] and len(d.missing_ranks) == 4096
    text = render_text_of(d)
    assert "Ranks without a trace here: 16,777,214 of 16,777,216" in text


def render_text_of(d):
    from diag.report import render

    return render(d, "text")


def test_a_world_size_claimed_by_diag_run_json_costs_nothing(tmp_path):
    from diag.runinputs import RunInputs, open_run

    run = _two_ranks(tmp_path / "run", 2, meta=None)
    for r in (0, 1):                                    # traces that do not say their world size
        p = os.path.join(run, f"rank-{r}.pt.trace.json")
        doc = json.load(open(p))
        del doc["distributedInfo"]["world_size"]
        json.dump(doc, open(p, "w"))
    meta = os.path.join(run, "diag_run.json")
    json.dump({"schema_version": 2, "world_size": 1 << 24, "tp": 2, "pp": 4}, open(meta, "w"))
    d, peak = _peak_bytes(lambda: open_run(run, RunInputs()))
    assert peak < PER_CLAIMED_RANK / 8, peak
    assert len(d.ranks) == 2 and "pp4" in (d.layout or "") and not d.problems
    json.dump({"schema_version": 2, "world_size": 10 ** 12, "tp": 2}, open(meta, "w"))   # past runmeta's bound
    d = open_run(run, RunInputs())
    assert len(d.ranks) == 2 and [p.file for p in d.problems] == [meta]


SHAPE = {"schema_version": 2, "num_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "seq_length": 64,
         "vocab_size": 256, "micro_batch_size": 2, "num_micro_batches": 2, "global_batch_size": 8,
         "ddp_bucket_size": 100000}


@pytest.mark.parametrize("claim", [{"num_layers": 10 ** 9}, {"num_micro_batches": 1 << 40, "global_batch_size": 1 << 42},
                                   {"world_size": 1 << 24, "pp": 1 << 23}, {"world_size": 1 << 24, "tp": 1 << 22, "pp": 4}])
def test_claimed_sizes_with_a_model_shape_cost_nothing(tmp_path, claim):
    """With the model's shape known, the step-time and memory models run too: a claimed size must
    not drive their work (found: 10^9 layers or 2^40 micro-batches simulated for ever, a PP of
    2^23 looped per stage in calibration and the memory model)."""
    import time

    from diag.runinputs import RunInputs, open_run

    run = _two_ranks(tmp_path / "run", claim.get("world_size", 2), meta={**SHAPE, **claim})
    t = time.monotonic()
    d, peak = _peak_bytes(lambda: open_run(run, RunInputs()))
    assert time.monotonic() - t < 30 and peak < PER_CLAIMED_RANK / 8, peak
    assert len(d.ranks) == 2
    assert len(d.memory.model) <= 4096 if d.memory else True
    render_text_of(d)


# --- 10. device ids and duplicate rank files --------------------------------------------------
def test_device_ids_past_int16_are_kept_and_past_int32_are_unknown_with_a_note(tmp_path):
    from diag.trace import Kind, load_job
    from kineto import TraceBuilder

    b = TraceBuilder(device=40000).step(1, 0, 100).kernel("gemm", 10, 30).kernel("gemm", 50, 30)
    doc = b.doc()
    doc["deviceProperties"][0]["name"] = "GPU 40000"
    doc["traceEvents"][-1]["args"]["device"] = 1 << 40
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    rt = load_job(str(p), strict=True).ranks[0]
    t = rt.events
    assert t.device[t.kind == Kind.COMPUTE].tolist() == [40000, -1]          # int16 made 40000 -25536
    assert rt.skipped == {"GPU events with a device id that fits no int32 (device taken as unknown)": 1}


def test_a_duplicate_rank_file_is_named_as_such(run):
    names = _traces(run)
    dup = os.path.join(run, "copy-of-" + names[1])
    shutil.copy(os.path.join(run, names[1]), dup)
    d = analysis(run, "--no-summaries")
    assert len(d["ranks"]) == 4 and not d["other_runs"]
    (p,) = d["problems"]
    first, second = sorted([os.path.join(run, names[1]), dup])
    assert p["file"] == second and p["problem"] == (f"a duplicate of rank 1: {first} claims the same rank "
                                                    "in the same run; set aside"), p
