"""Damage inside a trace's values (issue #20): a shape past int64, a top-level number past
float64, a stray non-object among the events. Each leaves that one fact unknown, says so in a
note, and the rest of the rank (and the other ranks) is analysed as if it were not there."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, analysis
from diag.trace import load_job, schema
from kineto import TraceBuilder

BIG = 1 << 40           # two of these make a tensor of 2^80 elements: past int64


def _job(b: TraceBuilder, steps: int = 3) -> TraceBuilder:
    for i in range(steps):
        b.step(i + 1, i * 100, 100).kernel("gemm", i * 100 + 10, 30)
        b.cpu_op("aten::linear", i * 100 + 5, 2, **{"Input Dims": [[512, 64], [256, 64], [256]]})
    return b


def _text_with(b: TraceBuilder, **raw: str) -> str:
    """The trace's JSON with top-level keys whose values are written as given (JSON can carry
    numbers Python's json module cannot write, such as 1e400)."""
    text = json.dumps(b.doc())
    return text[:-1] + "".join(f', "{k}": {v}' for k, v in raw.items()) + "}"


def _rank(path: str) -> dict:
    return analysis(path)["ranks"][0]


def test_input_dims_past_int64_leave_that_shape_unknown(tmp_path):
    b = _job(TraceBuilder())
    b.cpu_op("aten::linear", 50, 1, **{"Input Dims": [[BIG, BIG], [256, BIG], [256]]})
    b.cpu_op("aten::mm", 60, 1, **{"Input Dims": [[10 ** 30, 64], [64, 256]]})   # one int past int64
    p = b.write(str(tmp_path / "rank0.json"))
    rt = load_job(p, strict=True).ranks[0]
    assert rt.gemms == {("aten::linear", ((512, 64), (256, 64), (256,))): 3}
    r = _rank(p)                                   # the whole CLI path: no traceback, exit 0
    assert "2 GEMM ops whose Input Dims pass int64 elements (their shape is taken as unknown)" in r["notes"]
    clean = _rank(_job(TraceBuilder()).write(str(tmp_path / "clean" / "rank0.json")))
    assert r["breakdown"] == clean["breakdown"]


@pytest.mark.parametrize("value", ["1e400", "-1e400", "1" + "0" * 400])
def test_base_time_out_of_range_is_unknown_with_a_note(tmp_path, value):
    good = _job(TraceBuilder(rank=1, world_size=2))
    good.write(str(tmp_path / "job" / "rank1.json"))
    p = tmp_path / "job" / "rank0.json"
    p.write_text(_text_with(_job(TraceBuilder(rank=0, world_size=2)), baseTimeNanoseconds=value))
    d = analysis(tmp_path / "job")
    assert [r["rank"] for r in d["ranks"]] == [0, 1]           # both ranks, one run
    r0, r1 = d["ranks"]
    assert any("'baseTimeNanoseconds' unreadable" in n for n in r0["notes"]), r0["notes"]
    assert not any("baseTimeNanoseconds" in n for n in r1["notes"])
    assert r0["breakdown"] == r1["breakdown"]                 # same events, same results
    # the same file alone: the start comes from the events' timestamps, as without the key
    alone = load_job(str(p), strict=True).ranks[0]
    assert alone.start_epoch_us == alone.events.t0_us


def test_out_of_range_number_in_distributed_info_names_the_key(tmp_path):
    p = tmp_path / "rank0.json"
    doc = _job(TraceBuilder()).doc()
    info = json.dumps(doc.pop("distributedInfo"))[:-1] + ', "bogus": 1e999}'
    p.write_text(json.dumps(doc)[:-1] + f', "distributedInfo": {info}}}')
    job = load_job(str(p), strict=True)
    rt = job.ranks[0]
    assert rt.world_size is None and rt.backend is None       # unknown, not a guess
    assert any("no usable rank in distributedInfo" in n for n in job.notes)   # shown as rank 0, said so
    assert any("'distributedInfo' unreadable" in k for k in rt.skipped)
    assert len(rt.events) == len(doc["traceEvents"])


def _with_strays(n_steps: int) -> tuple[str, str]:
    """(trace text with stray items among its events, the same trace without them)."""
    b = _job(TraceBuilder(), steps=n_steps)
    clean = json.dumps(b.doc())
    items = [json.dumps(e) for e in b.doc()["traceEvents"]]
    strays = ["null", "5", '"text"', '{"ph": "X", "ts": 1e400, "dur": 1}']
    for i, s in enumerate(strays):
        items.insert((i + 1) * len(items) // (len(strays) + 1), s)
    doc = b.doc()
    del doc["traceEvents"]
    return json.dumps(doc)[:-1] + ', "traceEvents": [' + ",\n".join(items) + "]}", clean


def test_stray_items_among_the_events_are_skipped_and_counted(tmp_path):
    text, clean = _with_strays(1000)                            # thousands of events
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rank0.json").write_text(text)
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "rank0.json").write_text(clean)
    bad, good = _rank(tmp_path / "bad"), _rank(tmp_path / "clean")
    assert any(n.startswith("4 items of traceEvents that are no readable event") for n in bad["notes"]), bad["notes"]
    assert bad["events"] == good["events"] and bad["breakdown"] == good["breakdown"]
    assert bad["steps"] == good["steps"]


@pytest.mark.parametrize("workers", [1, 2])
def test_stray_items_in_a_chunked_file(tmp_path, monkeypatch, workers):
    """The same when the file is decoded in chunks, serially or by forked workers."""
    text, clean = _with_strays(2000)
    (tmp_path / "bad.json").write_text(text)
    (tmp_path / "clean.json").write_text(clean)
    monkeypatch.setattr(schema, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setenv("DIAG_WORKERS", str(workers))
    bad = load_job(str(tmp_path / "bad.json"), strict=True).ranks[0]
    good = load_job(str(tmp_path / "clean.json"), strict=True).ranks[0]
    assert sum(n for k, n in bad.skipped.items() if k.startswith("items of traceEvents")) == 4
    assert (bad.events.ts_ns == good.events.ts_ns).all() and (bad.events.name_id == good.events.name_id).all()


def test_cli_gives_no_traceback_on_any_of_them(tmp_path):
    b = _job(TraceBuilder())
    b.cpu_op("aten::linear", 50, 1, **{"Input Dims": [[BIG, BIG], [256, BIG]]})
    p = tmp_path / "all.json"
    text, _ = _with_strays(3)
    p.write_text(text[:-1] + ', "baseTimeNanoseconds": 1e400}')
    done = subprocess.run([sys.executable, "-m", "diag", "analyze", str(p)], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "baseTimeNanoseconds" in done.stdout and "items of traceEvents" in done.stdout


def test_a_timestamp_past_int64_nanoseconds_is_a_clear_error_not_an_overflow(tmp_path):
    """Found by the fuzzer in CI: ts 9223372036854776.0 us is 2^63 ns, past int64; the clock
    alignment then overflowed converting the trace's origin to ns. Such an event is unusable,
    like one days away from the others."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "ts": 9223372036854776.0}]}))
    from diag.trace.errors import TraceError
    with pytest.raises(TraceError, match="no event has a usable timestamp"):
        load_job(str(path))
    p = subprocess.run([sys.executable, "-m", "diag", "analyze", str(path)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "usable timestamp" in p.stderr


def test_files_nested_past_the_stack_are_one_line_not_a_recursion_error(tmp_path):
    """diag_run.json, diag_bench.json, a --config file (JSON, TOML) and a summary nested 100,000
    deep (found: a RecursionError traceback from each but the Flight Recorder's reader): the run
    metadata is a problem and the ranks analysed, a --config or bench file one line naming it, a
    summary corrupt with its trace read instead."""
    import shutil

    import msgspec
    from click.testing import CliRunner

    from diag.analysis import summary_file as sfm
    from diag.cli import main

    deep = "[" * 100_000 + "]" * 100_000
    run = tmp_path / "run"
    shutil.copytree(os.path.join(ROOT, "sample_traces", "dp2_overlap"), run)
    (run / "diag_run.json").write_text(deep)
    d = analysis(run, "--no-summaries")
    assert len(d["ranks"]) == 2
    assert [p["problem"] for p in d["problems"]] == ["unusable run metadata, ignored: not a JSON object of run facts: "
                                                     "nested too deep"]
    for name, text in (("c.json", deep), ("c.toml", "a = " + "[" * 5000 + "]" * 5000 + "\n")):
        (tmp_path / name).write_text(text)
        r = CliRunner().invoke(main, ["analyze", str(run), "--config", str(tmp_path / name)])
        assert r.exit_code == 2 and isinstance(r.exception, SystemExit) and "nested too deep" in r.output, r.output
    (tmp_path / "bench.json").write_text(deep)
    r = CliRunner().invoke(main, ["analyze", str(run), "--bench", str(tmp_path / "bench.json")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit) and "nested too deep" in r.output, r.output

    assert CliRunner().invoke(main, ["summarize", str(run)]).exit_code == 0
    (run / "diag_run.json").unlink()
    summary = run / "rank-0.pt.trace.json.gz.diagsum"
    env = msgspec.msgpack.decode(summary.read_bytes(), type=sfm._Envelope)
    obj = msgspec.msgpack.decode(env.payload)
    obj["summary"]["pg_config"] = "NESTED-HERE"
    payload = msgspec.msgpack.encode(obj).replace(msgspec.msgpack.encode("NESTED-HERE"), b"\x91" * 200_000 + b"\x90")
    summary.write_bytes(msgspec.msgpack.encode(sfm._Envelope(sfm.FORMAT, sfm.VERSION, sfm._digest(payload), payload)))
    d = analysis(run)
    assert len(d["ranks"]) == 2 and any("nested too deep; analysed the trace instead" in n for n in d["notes"]), d["notes"]


def test_a_bad_diag_bench_json_beside_the_traces_is_a_problem_not_the_end(tmp_path):
    """diag_bench.json found next to the traces is the run's file, like diag_run.json: a bad one
    (nested too deep, not JSON, not a curve) is a problem naming it and the ranks are analysed
    without a curve; --strict makes it fail; --bench FILE, the user's own input, still ends the
    command with one line (test above)."""
    import shutil

    from click.testing import CliRunner

    from diag.cli import main

    run = tmp_path / "run"
    shutil.copytree(os.path.join(ROOT, "sample_traces", "dp2_overlap"), run)
    for text in ("[" * 100_000 + "]" * 100_000, "{not json", json.dumps({"schema": "something else"})):
        (run / "diag_bench.json").write_text(text)
        d = analysis(run, "--no-summaries")
        assert len(d["ranks"]) == 2
        (p,) = [p for p in d["problems"] if p["file"].endswith("diag_bench.json")]
        assert p["problem"], d["problems"]
        r = CliRunner().invoke(main, ["analyze", str(run), "--no-summaries", "--strict"])
        assert r.exit_code == 2 and "diag_bench.json" in r.output, r.output
