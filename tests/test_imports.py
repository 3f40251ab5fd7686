"""`diag --help` and `diag analyze` import only what they use (issue #22: start-up).

Each command runs in a fresh interpreter that reports the modules loaded at the moment that
matters: when --help has printed, when analyze first opens the trace (an audit hook, PEP 578),
and when analyze has printed its JSON report."""
import json
import os
import subprocess
import sys

import click
import pytest

from conftest import DATA, ROOT

TRACE = os.path.join(DATA, "a100_single_ns_resolution", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")

CHILD = r"""
import json, os, sys
args, target = sys.argv[1:-1], sys.argv[-1]
loaded = {}

def hook(event, a):
    if "first_open" not in loaded and event == "open" and isinstance(a[0], str) and target \
            and os.path.abspath(a[0]) == target:
        loaded["first_open"] = sorted(sys.modules)

sys.addaudithook(hook)

def at_decode(frame, event, arg):     # the modules loaded when the trace's events start being decoded
    if event == "call" and frame.f_code.co_name == "_decode_parts" and "decode" not in loaded:
        loaded["decode"] = sorted(sys.modules)

sys.setprofile(at_decode)
from diag.cli import main
try:
    main(args)
except SystemExit as e:
    loaded["exit"] = e.code
loaded["end"] = sorted(sys.modules)
sys.stderr.write("MODULES " + json.dumps(loaded) + "\n")
"""

# Packages a command must not load unless it prints with them (rich: the text report; plotly,
# streamlit: the dashboard and HTML report; pandas, hta: the cross-check reference).
NEVER_FOR_JSON = ("rich", "plotly", "streamlit", "pandas", "hta", "diag.report.text", "diag.report.html",
                  "diag.commands.dashboard", "diag.commands.bench", "diag.export")
NOT_BEFORE_FIRST_BYTE = ("numpy", "diag.analysis", "diag.advise", "diag.trace.build", "diag.trace.chunks")


def modules_of(*args: str, target: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, *args, target], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    line = [x for x in done.stderr.splitlines() if x.startswith("MODULES ")]
    assert line, done.stderr
    return json.loads(line[-1][len("MODULES "):])


def loaded(modules: list[str], prefixes) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_help_imports_no_analysis():
    got = modules_of("--help")
    assert got["exit"] in (0, None)
    assert loaded(got["end"], ("numpy", "msgspec", "diag.analysis", "diag.advise", "diag.trace.job",
                               *NEVER_FOR_JSON)) == []


def test_analyze_reads_before_heavy_imports_and_never_loads_renderers(tmp_path):
    out = tmp_path / "d.json"
    got = modules_of("analyze", TRACE, "--format", "json", "--output", str(out), target=TRACE)
    assert got["exit"] in (0, None)
    assert json.loads(out.read_text())["ranks"][0]["events"] > 0        # it did analyse the trace
    assert "first_open" in got, "the trace was never opened"
    assert loaded(got["first_open"], NOT_BEFORE_FIRST_BYTE) == []
    assert loaded(got["end"], NEVER_FOR_JSON) == []
    # stdlib modules a single trace does not need (~15 ms between them): multiprocessing (its
    # workers are forked with a pipe), hashlib and socket (summaries), tempfile (big gzip spills)
    assert loaded(got["end"], ("multiprocessing", "hashlib", "socket")) == []
    assert loaded(got["end"], ("diag.analysis.flightrec", "diag.analysis.frresults")) == []   # no dump here
    assert "numpy" in got["end"]             # the check can fail: the analysis did import it after


def test_analyze_imports_the_recommender_and_renderer_before_decoding(tmp_path):
    """What the report needs after the analysis is imported before the events are decoded: forked
    workers decode a single file's events meanwhile, and after the load the rest runs on one core."""
    for fmt, renderer in (("json", "diag.report.jsonfmt"), ("text", "diag.report.text")):
        got = modules_of("analyze", TRACE, "--format", fmt, "--output", str(tmp_path / f"d.{fmt}"))
        assert got["exit"] in (0, None)
        assert "decode" in got, "the events were never decoded"
        assert {"diag.advise.recommend", renderer} <= set(got["decode"])


COMMAND = r"""
import json, os, runpy, sys
target = os.path.abspath(sys.argv[1])
sys.argv = ["diag", *sys.argv[2:]]

def hook(event, a):
    if event == "open" and isinstance(a[0], str) and os.path.abspath(a[0]) == target:
        if not getattr(hook, "done", False):
            hook.done = True
            os.write(2, ("FIRST_OPEN " + json.dumps(sorted(sys.modules)) + "\n").encode())

sys.addaudithook(hook)
os.register_at_fork(after_in_child=lambda: os.write(2, f"WORKER {os.getpid()}\n".encode()))
runpy.run_module("diag", run_name="__main__")     # `python -m diag`: entry.run, which ends the process
"""


def command(*args: str, target: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", COMMAND, target, *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, **env}, timeout=120)


def first_open(p: subprocess.CompletedProcess) -> list:
    line = [x for x in p.stderr.splitlines() if x.startswith("FIRST_OPEN ")]
    assert line, p.stderr
    return json.loads(line[0][len("FIRST_OPEN "):])


def test_the_command_reads_the_file_before_parsing_its_command_line(tmp_path):
    """`diag analyze FILE ...` (entry.read_ahead): FILE is opened, and numpy and the decoder are
    loaded to decode it in forked workers, before click or the analysis is imported; the report is
    the one main makes. With an option before FILE nothing is guessed: click parses first. A command
    line click refuses still fails as it did, naming the option."""
    out = tmp_path / "d.json"
    p = command("analyze", TRACE, "--format", "json", "-o", str(out), target=TRACE)
    assert p.returncode == 0, p.stderr
    early = first_open(p)
    assert loaded(early, ("click", "diag.cli", "diag.runinputs", "diag.analysis", "diag.advise")) == []
    assert json.loads(out.read_text()) == json.loads(command("analyze", "--format", "json", TRACE,
                                                              target=TRACE).stdout)
    p = command("analyze", "--format", "json", TRACE, "-o", str(tmp_path / "e.json"), target=TRACE)
    assert p.returncode == 0 and "click" in first_open(p)
    p = command("analyze", TRACE, "--no-such-option", target=TRACE, DIAG_WORKERS="2")   # a worker even when busy
    assert p.returncode == 2 and "--no-such-option" in p.stderr
    assert "click" not in first_open(p)          # read ahead, then refused
    workers = [int(x.split()[1]) for x in p.stderr.splitlines() if x.startswith("WORKER ")]
    assert workers
    for pid in workers:
        with pytest.raises(ProcessLookupError):  # the workers it forked were ended and reaped
            os.kill(pid, 0)


def test_lazy_help_is_each_commands_own():
    from diag.cli import LAZY_COMMANDS, LAZY_HELP, main

    assert set(LAZY_HELP) == set(LAZY_COMMANDS)
    ctx = click.Context(main)
    for name, line in LAZY_HELP.items():
        cmd = main.get_command(ctx, name)
        assert cmd.short_help is None and (cmd.help or "").split("\n\n")[0].strip() == line, name


def test_analysis_never_imports_numpy_ma(tmp_path, monkeypatch):
    """numpy.ma costs ~10 ms a process, in each worker too; np.unique, np.median and np.percentile
    import it on first use, so the analysis uses trace.columns' distinct, median and percentile. One
    process (DIAG_WORKERS=1) decodes and analyses: a single GPU trace with NCCL collectives (busbw
    percentiles), a gloo CPU trace, a multi-rank all-to-all job and the trainer's 3D-parallel job."""
    monkeypatch.setenv("DIAG_WORKERS", "1")
    for path in (os.path.join(DATA, "a100_rank0_of_2_nccl_args"), os.path.join(DATA, "gloo_cpu_only_rank34"),
                 os.path.join(DATA, "dlrm_4_ranks_alltoall"), os.path.join(ROOT, "sample_traces", "tp2_pp2_dp2")):
        got = modules_of("analyze", path, "--format", "json", "--output", str(tmp_path / "d.json"))
        assert got["exit"] in (0, None), path
        assert "numpy.ma" not in got["end"], path
        assert "diag.analysis.stragglers" in got["end"]       # it did run the analysis


BLAS = r"""
import json, os, sys
from diag.entry import one_blas_thread
if sys.argv[1] == "diag":
    one_blas_thread()
import numpy
sys.stdout.write(json.dumps({"threads": len(os.listdir("/proc/self/task")),
                             "var": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""


def blas_child(mode: str, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", BLAS, mode], capture_output=True, text=True, cwd=ROOT,
                          env={**base, "PYTHONPATH": ROOT, **env}, timeout=120, check=True)
    return json.loads(done.stdout)


def test_numpy_loads_with_one_blas_thread_and_leaves_no_variable():
    """diag's numpy starts no OpenBLAS threads (they spin beside the read-ahead), and no process
    diag starts inherits the setting; a user's own OPENBLAS_NUM_THREADS is left as it is."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("no /proc/self/task to count threads with")
    plain, ours = blas_child("plain"), blas_child("diag")
    assert ours == {"threads": 1, "var": None}
    assert plain["var"] is None
    if plain["threads"] == 1:
        pytest.skip("numpy's BLAS starts no threads here (one core, or no OpenBLAS): nothing to compare")
    assert blas_child("diag", OPENBLAS_NUM_THREADS="2") == {"threads": min(2, plain["threads"]), "var": "2"}
