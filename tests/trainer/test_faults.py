"""Faults during training: a rank killed mid-run, and files caught half-written."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from diag.analysis import diagnose
from diag.trace import load_job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _child_with_rank(launcher: psutil.Process, rank: int) -> psutil.Process:
    for child in launcher.children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child
        except psutil.Error:
            continue
    raise AssertionError(f"no trainer process with RANK={rank}")


def test_killed_rank_stops_the_job_and_written_traces_stay_whole(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "instrumented_trainer", "--nproc", "2", "--pipeline-model-parallel-size", "2",
           "--train-iters", "100000", "--profile-wait", "0", "--profile-warmup", "1", "--profile-active", "2",
           "--out", str(out)]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        traces = [out / f"rank-{r}.pt.trace.json.gz" for r in (0, 1)]
        deadline = time.monotonic() + 120
        while not all(t.exists() for t in traces):
            assert p.poll() is None and time.monotonic() < deadline, "the run never wrote its traces"
            time.sleep(0.2)
        time.sleep(1.0)                                   # a few more steps after the profiler window
        victim = _child_with_rank(psutil.Process(p.pid), 1)
        killed_at = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        code = p.wait(timeout=60)
        stopped_in = time.monotonic() - killed_at
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read()
    assert code != 0 and "a trainer process exited with code" in err, err
    assert stopped_in < 30, stopped_in                    # bounded: no hang in a collective
    d = diagnose(load_job(str(out), strict=True))         # written traces are complete
    assert [r.rank for r in d.ranks] == [0, 1] and not d.problems
    for line in open(out / "steps.jsonl"):                # the step log holds whole records
        json.loads(line)


def test_half_written_trace_is_not_taken_for_a_trace(tmp_path):
    """A leftover partial file (a rank killed mid-write; the profiler writes in a private
    `.rank-<r>.pt.trace.json.gz.*.partial/` folder and renames when complete) is not read as a trace."""
    src = os.path.join(ROOT, "sample_traces", "pp2_m2")
    for name in os.listdir(src):
        os.symlink(os.path.join(src, name), tmp_path / name)
    whole = open(os.path.join(src, "rank-1.pt.trace.json.gz"), "rb").read()
    (tmp_path / "rank-1.pt.trace.partial.gz").write_bytes(whole[: len(whole) // 3])
    hidden = tmp_path / ".rank-1.pt.trace.json.gz.x1y2.partial"
    hidden.mkdir()
    (hidden / "rank-1.pt.trace.json.gz").write_bytes(whole[: len(whole) // 3])
    d = diagnose(load_job(str(tmp_path), strict=True))
    assert [r.rank for r in d.ranks] == [0, 1] and not d.problems


def test_disk_full_while_writing_is_a_warning_and_no_partial_trace(tmp_path):
    """Rank 1's logs land on a full disk (/dev/full: every write fails with ENOSPC) and its trace
    cannot be put in place (a directory holds its name). Training finishes, rank 1 warns, no file
    of rank 1 passes for a trace, no temporary is left, and the analysis reports rank 1 missing
    while rank 0 is analysed (from its own summary)."""
    from .runner import assert_ok, run_trainer

    out = tmp_path / "run"
    out.mkdir()
    for name in ("comm-rank-1.jsonl", "metrics-rank-1.jsonl"):
        os.symlink("/dev/full", out / name)
    (out / "rank-1.pt.trace.json.gz").mkdir()
    (out / "rank-1.pt.trace.json.gz" / "keep").write_text("x")
    victim = tmp_path / "victim"                       # the old predictable temporary, planted as a link
    victim.write_text("precious")
    os.symlink(victim, out / "rank-0.pt.trace.partial.gz")
    run = run_trainer(out, 2, "--pipeline-model-parallel-size", "2", "--train-iters", "3",
                      "--profile-wait", "0", "--profile-warmup", "1", "--profile-active", "1", "--comm-log")
    assert_ok(run)
    assert "[rank 1] warning: telemetry 'profiler export' disabled after error" in run.stderr
    assert "No space left on device" in run.stderr
    names = set(os.listdir(out))
    assert "rank-0.pt.trace.json.gz" in names and "rank-0.pt.trace.json.gz.diagsum" in names
    assert not any(n.endswith(".partial") for n in names), names
    assert victim.read_text() == "precious"
    d = diagnose(load_job(str(out), strict=True))
    assert [r.rank for r in d.ranks] == [0] and d.missing_ranks == [1]


def _start(tmp_path, *extra):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "instrumented_trainer", "--nproc", "2", "--pipeline-model-parallel-size", "2",
           "--train-iters", "100000", "--no-profile", "--out", str(out), *extra]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / "steps.jsonl").exists() or len((out / "steps.jsonl").read_text().splitlines()) < 3:
        assert p.poll() is None and time.monotonic() < deadline, "the run never trained"
        time.sleep(0.2)
    return p


def test_a_stopped_rank_ends_the_job_within_its_timeout(tmp_path):
    """SIGSTOP on one rank: gloo does not always time out on a stopped peer, so the launcher's
    watchdog must: the job ends within --dist-timeout + a margin, naming the stopped rank (also
    when the peer's own gloo timeout fires first)."""
    timeout = 10
    p = _start(tmp_path, "--dist-timeout", str(timeout))
    try:
        victim = _child_with_rank(psutil.Process(p.pid), 1)
        stopped_at = time.monotonic()
        victim.send_signal(signal.SIGSTOP)
        code = p.wait(timeout=timeout + 45)
        ended_in = time.monotonic() - stopped_at
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    err = p.stderr.read()
    assert code != 0 and f"rank 1 (pid {victim.pid}) has been stopped" in err, err
    assert timeout <= ended_in < timeout + 30, ended_in          # not before the timeout, not minutes after
    assert not psutil.pid_exists(victim.pid) or victim.status() == psutil.STATUS_ZOMBIE


def test_the_launchers_death_takes_its_ranks_down(tmp_path):
    """kill -9 of the launcher: the kernel kills its ranks (PR_SET_PDEATHSIG); none trains on."""
    p = _start(tmp_path)
    ranks = [_child_with_rank(psutil.Process(p.pid), r) for r in (0, 1)]
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    gone, alive = psutil.wait_procs(ranks, timeout=10)
    for r in alive:
        r.kill()
    assert not alive, [r.pid for r in alive]
    assert len(gone) == 2


def test_the_watchdog_names_a_rank_whose_steps_stopped(tmp_path):
    """A rank alive but stuck (not stopped): its heartbeat says step 7 and then nothing; past the
    timeout the watchdog names it and its step; a rank that said 'done' or 'hold' is not stuck."""
    from instrumented_trainer.launch import Watchdog
    from instrumented_trainer.telemetry.heartbeat import Heartbeat

    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        stuck, finished = Heartbeat(0, str(tmp_path)), Heartbeat(1, str(tmp_path))
        stuck.beat(7)
        finished.beat(9)
        finished.done()
        dog = Watchdog(procs, str(tmp_path), timeout_s=1.0)
        assert dog.stalled() is None                          # fresh beats
        old = time.time() - 5
        for r in (0, 1):
            os.utime(tmp_path / f"rank-{r}", (old, old))
        said = dog.stalled()
        assert said == f"no training progress past --dist-timeout 1 s on rank 0 (pid {procs[0].pid}, at step 7, 5 s)"
        assert Watchdog(procs, str(tmp_path), timeout_s=None).stalled() is None   # no timeout: no watchdog
        stuck.hold()                                          # exporting a trace: not a stall
        os.utime(tmp_path / "rank-0", (old, old))
        assert dog.stalled() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()
