"""The rank's own `diag summarize` (telemetry.summarizer) on a machine that is doing other work.

Real processes throughout: an idle-class `diag summarize` of a real trace and a CPU burner
pinned with it to one core. An idle-class process gets no CPU while a normal one wants its core
(what two CPU burners did to `make test` on a 2-core machine: every trainer run waited the whole
120 s at exit, and its summariser, left running with the trainer's stderr, kept the caller's pipe
open until the burners stopped). Nothing here depends on the machine's speed: only on the
scheduler's classes, which other work on the machine can only make more starved.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from diag.analysis import summary_file
from diag.analysis.summary_file import SUFFIX
from instrumented_trainer.telemetry.summarizer import Summarizer, _Watch, kill_tree

psutil = pytest.importorskip("psutil")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACE = os.path.join(ROOT, "sample_traces", "pp2_m2", "rank-0.pt.trace.json.gz")
BURN = [sys.executable, "-c", "while True: pass"]

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not hasattr(os, "SCHED_IDLE"),
                                reason="Linux's CPU affinity and SCHED_IDLE")


@contextlib.contextmanager
def one_busy_core():
    """This process and what it starts meanwhile pinned to one core, a CPU burner running there;
    affinity restored and the burner stopped after."""
    before = os.sched_getaffinity(0)
    core = min(before)
    os.sched_setaffinity(0, {core})
    burner = subprocess.Popen(BURN)
    try:
        yield core
    finally:
        os.sched_setaffinity(0, before)
        burner.kill()
        burner.wait()


def copy_trace(tmp_path) -> str:
    dst = os.path.join(tmp_path, os.path.basename(TRACE))
    shutil.copy(TRACE, dst)
    return dst


def test_a_starved_summariser_is_restarted_and_writes_the_summary(tmp_path, capfd):
    trace = copy_trace(tmp_path)
    with one_busy_core():
        s = Summarizer(trace)
        assert s.proc.poll() is None
        s.wait(budget_s=120, window_s=1.0)
    assert s.restarted
    err = capfd.readouterr().err
    assert "[rank 0] trace summary: no idle CPU for 1 s" in err
    got = summary_file.read(trace + SUFFIX)
    assert got.problem is None and got.summary is not None
    assert got.trace == os.path.abspath(trace)


def test_a_process_that_gets_cpu_is_not_starved():
    """A CPU burner at normal priority gets a share of its core however busy the machine is."""
    burner = subprocess.Popen(BURN)
    try:
        w = _Watch(burner.pid)
        time.sleep(1.0)
        assert not w.starved()
    finally:
        burner.kill()
        burner.wait()


def test_a_summariser_left_running_holds_no_pipe_of_the_trainers_caller(tmp_path):
    """A process that starts a summariser and exits without waiting (a trainer past its wait):
    whoever reads its output gets the end of the pipe when it exits, not when the starved
    summariser does."""
    trace = copy_trace(tmp_path)
    script = textwrap.dedent(f"""
        from instrumented_trainer.telemetry.summarizer import Summarizer
        s = Summarizer({trace!r})
        print(s.proc.pid, flush=True)
    """)
    with one_busy_core():     # before the fix: the run waited for the starved summariser, past its timeout
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    pid = int(p.stdout.split()[0])
    try:
        assert p.returncode == 0, p.stderr
        assert psutil.pid_exists(pid)
        with contextlib.suppress(psutil.Error):
            assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    finally:
        kill_tree(pid)


def test_a_failed_summary_is_relayed_with_the_rank_and_raised(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    bad = os.path.join(tmp_path, "rank-3.pt.trace.json.gz")
    with open(bad, "wb") as f:
        f.write(b"\x1f\x8b not gzip")
    s = Summarizer(bad)
    with pytest.raises(RuntimeError, match=r"`diag summarize` exited 1 \(diag: .*rank-3\.pt\.trace\.json\.gz"):
        s.wait(budget_s=120)
    err = capfd.readouterr().err
    assert f"[rank 3] diag summarize: diag: {bad}" in err
