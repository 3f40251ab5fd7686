"""Per-rank summaries (`diag summarize`, the trainer's own) merged by `diag analyze` give the
same diagnosis as the full analysis of the traces: on every real trace folder, the trainer's
samples, a synthesised 40-rank job (worker pool on), and summaries alone without the traces.
Stale, corrupt and unreadable files are handled as the full analysis handles bad traces."""
from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import DATA, REAL_FOLDERS, analysis, comparable
from diag.analysis import summary_file
from diag.analysis.summary_file import SUFFIX
from diag.cli import main
from diag.ports import free_port
from diag.commands.summarize import shard_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = [os.path.join(ROOT, "sample_traces", d) for d in ("tp2_pp2_dp2", "pp2_m2", "dp2_overlap")]
BIN = os.path.dirname(sys.executable)


def cli(*args, env=None):
    r = CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)
    return r.exit_code, r.output


def copy_run(src: str, dst) -> str:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(f"*{SUFFIX}"))
    return str(dst)


def summaries_alone(run: str, dst) -> str:
    """What a user copies off the cluster: the summaries, diag_run.json and the Flight Recorder's dumps."""
    os.makedirs(dst)
    for n in os.listdir(run):
        if n.endswith(SUFFIX) or n == "diag_run.json":
            shutil.copy(os.path.join(run, n), dst)
    if os.path.isdir(os.path.join(run, "flightrec")):
        shutil.copytree(os.path.join(run, "flightrec"), os.path.join(dst, "flightrec"))
    return str(dst)


@pytest.mark.parametrize("src", [os.path.join(DATA, d) for d in REAL_FOLDERS] + SAMPLES, ids=os.path.basename)
def test_summaries_give_the_full_analysis(src, tmp_path):
    run = copy_run(src, tmp_path / "run")
    code, out = cli("summarize", run)
    assert code == 0, out
    traces = [n for n in os.listdir(run) if n.endswith((".json", ".json.gz")) and n != "diag_run.json"]
    assert sorted(n for n in os.listdir(run) if n.endswith(SUFFIX)) == sorted(t + SUFFIX for t in traces)

    full = analysis(run, "--no-summaries")
    merged = analysis(run)
    assert comparable(merged) == comparable(full)
    assert any(f"{len(traces)} of {len(traces)} ranks read from their summaries" in n for n in merged["notes"])
    assert not any("summaries" in n for n in full["notes"])
    # the traces stayed on the cluster: the summaries (and diag_run.json) alone
    alone = analysis(summaries_alone(run, tmp_path / "alone"))
    assert comparable(alone) == comparable(full)


def test_top_beyond_the_summary_reads_the_trace(tmp_path):
    run = copy_run(os.path.join(ROOT, "tests/data/dlrm_2_ranks_alltoall"), tmp_path / "run")
    assert cli("summarize", run, "--top", "5")[0] == 0
    full = analysis(run, "--no-summaries", "--top", "8")
    merged = analysis(run, "--top", "8")
    assert comparable(merged) == comparable(full)
    assert len(merged["ranks"][0]["top_kernels"]) == 8
    assert not any("from their summaries" in n for n in merged["notes"])
    assert comparable(analysis(run, "--top", "3")) == comparable(analysis(run, "--no-summaries", "--top", "3"))


def test_many_ranks_through_the_worker_pool(tmp_path):
    from diag.advise import Config, Links, Workload, simulate
    from diag.advise.synth import write_job

    w = Workload(num_layers=4, fwd_s_per_layer=2e-3, tp_bytes_per_layer=8e6, p2p_bytes=4e6, grad_bytes=4e8,
                 optimizer_s=1e-3)
    c = Config(tp=2, pp=2, dp=10, num_micro_batches=4, overlap_grad_reduce=True, bucket_bytes=1e8)
    run = str(tmp_path / "run")
    write_job(simulate(w, c, Links(tp=200e9, pp=50e9, dp=25e9), steps=3), run, c, w, gz=True)
    env = {"DIAG_WORKERS": "2"}                    # 40 files: the pool runs (and is forced on)
    code, out = cli("summarize", run, env=env)
    assert code == 0 and "40 of 40 traces summarised" in out
    full = analysis(run, "--no-summaries")
    merged = analysis(run)
    assert comparable(merged) == comparable(full)
    assert len(merged["ranks"]) == 40 and merged["pipeline"] and merged["comm"]["stragglers"] is not None
    assert comparable(analysis(summaries_alone(run, tmp_path / "alone"))) == comparable(full)
    # a second summarize finds everything up to date
    assert "0 of 40 traces summarised, 40 already up to date" in cli("summarize", run, env=env)[1]


def test_stale_and_corrupt_summaries_fall_back_to_the_trace(tmp_path):
    run = copy_run(os.path.join(ROOT, "tests/data/dlrm_4_ranks_alltoall"), tmp_path / "run")
    assert cli("summarize", run)[0] == 0
    traces = sorted(n for n in os.listdir(run) if n.endswith(".json"))
    with open(os.path.join(run, traces[0]), "a") as f:          # the trace changed since
        f.write("\n")
    with open(os.path.join(run, traces[1] + SUFFIX), "r+b") as f:  # the summary got damaged
        f.seek(100)
        f.write(b"\xff" * 50)
    merged = analysis(run)
    assert comparable(merged) == comparable(analysis(run, "--no-summaries"))
    notes = "\n".join(merged["notes"])
    assert f"{traces[0]}{SUFFIX} was made from another version of {traces[0]}" in notes
    assert f"{traces[1]}{SUFFIX}:" in notes and "analysed the trace instead" in notes
    assert "2 of 4 ranks read from their summaries" in notes


def test_unreadable_trace_is_reported_from_its_summary(tmp_path):
    run = copy_run(os.path.join(ROOT, "tests/data/dlrm_4_ranks_alltoall"), tmp_path / "run")
    bad = sorted(n for n in os.listdir(run) if n.endswith(".json"))[2]
    with open(os.path.join(run, bad), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(run, bad)) // 2)
    code, out = cli("summarize", run)
    assert code == 1 and bad in out and "truncated JSON" in out
    assert "3 of 4 traces summarised" in out
    sf = summary_file.read(os.path.join(run, bad + SUFFIX))
    assert sf.summary is None and "truncated" in sf.problem
    full = analysis(run, "--no-summaries")
    assert comparable(analysis(run)) == comparable(full)
    alone = analysis(summaries_alone(run, tmp_path / "alone"))
    assert comparable(alone) == comparable(full)
    assert [os.path.basename(p["file"]) for p in alone["problems"]] == [bad]
    assert len(alone["ranks"]) == 3


def test_a_corrupt_summary_alone_is_a_problem_not_a_failure(tmp_path):
    run = copy_run(os.path.join(ROOT, "tests/data/dlrm_2_ranks_alltoall"), tmp_path / "run")
    assert cli("summarize", run)[0] == 0
    alone = summaries_alone(run, tmp_path / "alone")
    victim = sorted(os.listdir(alone))[0]
    with open(os.path.join(alone, victim), "wb") as f:
        f.write(b"\x00not msgpack")
    d = analysis(alone)
    assert len(d["ranks"]) == 1
    assert d["problems"] == [{"file": os.path.join(alone, victim),
                              "problem": d["problems"][0]["problem"]}]
    assert "not a diag summary" in d["problems"][0]["problem"]
    code, out = cli("analyze", alone, "--strict")
    assert code == 2 and victim in out


def test_shard_from_the_launcher_environment(tmp_path):
    assert shard_of("auto", {"SLURM_PROCID": "3", "SLURM_NTASKS": "8"})[:2] == (3, 8)
    assert shard_of("auto", {"RANK": "1", "WORLD_SIZE": "2"})[:2] == (1, 2)
    assert shard_of("auto", {})[:2] == (0, 1)
    assert shard_of("2/5", {"RANK": "1", "WORLD_SIZE": "2"})[:2] == (2, 5)
    run = copy_run(os.path.join(ROOT, "tests/data/dlrm_4_ranks_alltoall"), tmp_path / "run")
    traces = sorted(n for n in os.listdir(run) if n.endswith(".json"))
    code, out = cli("summarize", run, env={"SLURM_PROCID": "1", "SLURM_NTASKS": "2"})
    assert code == 0 and "task 1 of 2, from srun" in out
    assert sorted(n for n in os.listdir(run) if n.endswith(SUFFIX)) == [t + SUFFIX for t in traces[1::2]]


def test_under_torchrun_each_file_is_summarised_once(tmp_path):
    """The real launcher: 2 tasks share the 4 ranks' files, each written by one of them."""
    run = copy_run(os.path.join(ROOT, "tests/data/dlrm_4_ranks_alltoall"), tmp_path / "run")
    port = free_port()
    r = subprocess.run([os.path.join(BIN, "torchrun"), "--nnodes", "1", "--nproc-per-node", "2",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--no-python",
                        os.path.join(BIN, "diag"), "summarize", run],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "task 0 of 2, from torchrun" in r.stderr and "task 1 of 2, from torchrun" in r.stderr
    sums = sorted(n for n in os.listdir(run) if n.endswith(SUFFIX))
    assert len(sums) == 4
    makers = [summary_file.read(os.path.join(run, n)).made_by for n in sums]
    assert makers[0] == makers[2] and makers[1] == makers[3] and makers[0] != makers[1]
    assert comparable(analysis(run)) == comparable(analysis(run, "--no-summaries"))


def test_on_a_local_dask_cluster(tmp_path):
    run = copy_run(os.path.join(ROOT, "tests/data/dlrm_4_ranks_alltoall"), tmp_path / "run")
    r = subprocess.run([os.path.join(BIN, "diag"), "summarize", "--dask", "local", run],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "4 of 4 traces summarised" in r.stderr
    sums = sorted(n for n in os.listdir(run) if n.endswith(SUFFIX))
    assert len(sums) == 4
    assert all(str(os.getpid()) not in summary_file.read(os.path.join(run, n)).made_by for n in sums)
    assert comparable(analysis(run)) == comparable(analysis(run, "--no-summaries"))


def test_out_dir_takes_the_run_metadata_along(tmp_path):
    run = copy_run(os.path.join(ROOT, "sample_traces", "tp2_pp2_dp2"), tmp_path / "run")
    out = tmp_path / "sums"
    assert cli("summarize", run, "-o", out)[0] == 0
    assert (out / "diag_run.json").exists() and not any(n.endswith(SUFFIX) for n in os.listdir(run))
    assert sorted(os.listdir(out / "flightrec")) == sorted(os.listdir(os.path.join(run, "flightrec")))
    assert comparable(analysis(str(out))) == comparable(analysis(run))


def test_summary_is_small_and_gz_trace_roundtrips(tmp_path):
    """A summary is much smaller than its trace (here a GPU trace with NCCL collectives)."""
    src = os.path.join(ROOT, "tests/data/a100_rank0_of_2_nccl_args/nccl_data.json.gz")
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(src, run)
    assert cli("summarize", run)[0] == 0
    with gzip.open(src, "rb") as f:
        raw = len(f.read())
    assert os.path.getsize(str(run / ("nccl_data.json.gz" + SUFFIX))) < raw / 20
