"""The command line as a user runs it: real subprocesses, exit codes, messages, formats."""
import gzip
import json
import os
import subprocess
import sys

import pytest

from conftest import DATA
from kineto import TraceBuilder


def diag(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "diag.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_text_report_fits_80_columns():
    p = diag("analyze", os.path.join(DATA, "dlrm_4_ranks_alltoall"))
    assert p.returncode == 0, p.stderr
    assert "Temporal breakdown, GPU timeline" in p.stdout
    assert max(len(line) for line in p.stdout.splitlines()) <= 80
    assert p.stderr == ""           # no progress bar when not on a terminal


def test_json_report_schema(tmp_path):
    out = tmp_path / "r.json"
    p = diag("analyze", os.path.join(DATA, "dlrm_2_ranks_alltoall"), "--format", "json", "-o", str(out))
    assert p.returncode == 0 and p.stdout == ""
    d = json.loads(out.read_text())
    assert d["schema_version"] == "1.23" and d["world_size"] == 2
    assert d["run"] is None and d["facts"]["tp"] is None and d["facts"]["world_size"] is None   # nothing said it
    (s,) = d["comm"]["stragglers"]        # rank 1 arrives last (README); a set's keys say it is one rank
    assert (s["rank"], s["ranks"], s["kind"], s["basis"], s["who"]) == (1, [1], "rank", "collectives", "rank 1")
    assert d["comm"]["stragglers_unknown"] is None and d["comm"]["ops"][0]["group_size"] == 2
    assert [(f["kind"], f["ranks"]) for f in d["findings"] if f["kind"] == "straggler"] == [("straggler", [1])]
    r = d["ranks"][0]
    assert set(r["breakdown"]) >= {"timeline", "span_s", "compute_s", "comm_s", "memory_s", "other_s", "idle_s"}
    assert set(r["overlap"]) >= {"comm_s", "overlapped_s", "ratio", "exposed_s", "exposed_per_step_s"}
    assert r["backward"] is None          # its traces record no autograd nodes: unknown, not zero
    b = r["breakdown"]
    assert b["compute_s"] + b["comm_s"] + b["memory_s"] + b["other_s"] + b["idle_s"] == pytest.approx(b["span_s"])


def test_markdown_report():
    p = diag("analyze", os.path.join(DATA, "gloo_cpu_only_rank34"), "--format", "markdown")
    assert p.returncode == 0
    assert "| rank |" in p.stdout and "| 34 |" in p.stdout


def bad_inputs(tmp_path):
    good = json.dumps(TraceBuilder().step(1, 0, 10).kernel("k", 1, 2).doc()).encode()
    files = {
        "not_json.json": b"hello, world",
        "truncated.json.gz": gzip.compress(good)[:40],
        "truncated.json": good[: len(good) // 2],
        "no_events.json": b'{"traceEvents": []}',
        "not_a_trace.json": b'{"foo": 1}',
        "numbers.json": b"[1, 2, 3]",
        "empty.json": b"",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return files


@pytest.mark.parametrize("name,message", [
    ("not_json.json", "not JSON"), ("truncated.json.gz", "truncated gzip"),
    ("truncated.json", "truncated JSON"), ("no_events.json", "no events"),
    ("not_a_trace.json", "not a PyTorch profiler trace"), ("numbers.json", "not a PyTorch profiler trace"),
    ("empty.json", "empty file"), ("missing.json", "no such file"),
])
def test_bad_input_exit_2_one_line(tmp_path, name, message):
    bad_inputs(tmp_path)
    path = str(tmp_path / name)
    p = diag("analyze", path)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and path in lines[0] and message in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_directory_with_corrupt_rank_analyses_the_others(tmp_path):
    for rank in (0, 1):
        TraceBuilder(rank=rank, world_size=3).step(1, 0, 10).kernel("k", 1, 2).write(str(tmp_path / f"r{rank}.json"))
    (tmp_path / "r2.json").write_bytes(b'{"traceEvents": [{"ph": "X", "ts": 1')
    p = diag("analyze", str(tmp_path), "--format", "json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    assert d["problems"][0]["file"].endswith("r2.json") and "truncated JSON" in d["problems"][0]["problem"]
    text = diag("analyze", str(tmp_path)).stdout
    assert "r2.json: truncated JSON" in text
    strict = diag("analyze", str(tmp_path), "--strict")
    assert strict.returncode == 2 and "r2.json" in strict.stderr


def test_analyser_runs_without_torch(tmp_path):
    """The analyser must not need torch: block its import and run the CLI."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from diag.cli import main\n"
            f"sys.argv = ['diag', 'analyze', {os.path.join(DATA, 'mi250_rocm_single')!r}]\n"
            "main()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Temporal breakdown" in p.stdout


def test_output_to_dev_null_or_a_fifo_is_written_in_place(tmp_path, dev_null_kept):
    """`-o /dev/null` and `--timeline` to a device or a FIFO write into it, as a shell's `>` does.
    They went through a temporary renamed over the target: as root that turned /dev/null into a
    regular file holding the report (the benchmarks' `--output /dev/null` did it on every run);
    as anyone else it failed, /dev not being theirs to write."""
    import stat
    import threading

    trace = os.path.join(DATA, "dlrm_2_ranks_alltoall")
    p = diag("analyze", trace, "--format", "json", "-o", os.devnull, "--timeline", os.devnull, "--force")
    assert p.returncode == 0, p.stderr
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)          # still the device
    assert p.stdout == "" and "written to /dev/null" in p.stderr
    fifo = str(tmp_path / "report.fifo")
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)   # never blocks the exit
    reader.start()
    p = diag("analyze", trace, "--format", "json", "-o", fifo)
    reader.join(60)
    assert p.returncode == 0, p.stderr
    assert json.loads(got[0])["world_size"] == 2
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["report.fifo"]   # no temporary beside it


def test_the_command_ends_as_an_exit_would_without_the_teardown(tmp_path):
    """entry.run (the `diag` command): the exit functions run, stdout is flushed whole into a pipe,
    the exit code is kept, and nothing after it runs (the process ends there)."""
    trace = os.path.join(DATA, "dlrm_2_ranks_alltoall")
    marker = tmp_path / "atexit"

    def run(*args):
        code = ("import atexit, sys\nfrom diag.entry import run\n"
                f"atexit.register(lambda: open({str(marker)!r}, 'a').write('ran;'))\n"
                f"sys.argv = ['diag', *{list(args)!r}]\nrun()\nprint('after run')\n")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    p = run("analyze", trace, "--format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["world_size"] == 2 and "after run" not in p.stdout
    assert json.loads(p.stdout) == json.loads(diag("analyze", trace, "--format", "json").stdout)
    bad = run("analyze", str(tmp_path / "missing"))
    assert bad.returncode == 2 and "missing" in bad.stderr and "after run" not in bad.stdout
    assert marker.read_text() == "ran;ran;"
