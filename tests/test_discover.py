"""Directories as jobs lay them out: torchtitan's profile_traces/iteration_N, tensorboard
handler folders, several runs under one root. Real traces (tests/data) copied into those layouts."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import DATA
from diag.analysis.collect import load_summaries
from diag.analysis.summary_file import SUFFIX
from diag.trace import TraceError, load_job
from diag.trace.discover import MAX_DEPTH, MAX_NON_TRACES, find

DLRM4 = os.path.join(DATA, "dlrm_4_ranks_alltoall")          # 4 ranks of world size 4
SAMPLED = os.path.join(DATA, "sampled_2_of_128_ranks")        # 2 ranks of world size 128


def rank_files(src: str) -> list[str]:
    return sorted(os.path.join(src, n) for n in os.listdir(src) if ".json" in n)


def torchtitan_dump(dst, iterations=(10, 15, 20), src=DLRM4, mtime0=1_000_000):
    """<dst>/profile_traces/iteration_N/rank{R}_trace.json, as torchtitan's trace_handler writes."""
    for k, it in enumerate(iterations):
        d = dst / "profile_traces" / f"iteration_{it}"
        d.mkdir(parents=True)
        for r, f in enumerate(rank_files(src)):
            out = d / f"rank{r}_trace.json{'.gz' if f.endswith('.gz') else ''}"
            shutil.copy(f, out)
            os.utime(out, (mtime0 + k, mtime0 + k))
    (dst / "tb").mkdir()
    (dst / "tb" / "events.out.tfevents.1.host").write_bytes(b"\0\1")
    return dst


def test_latest_iteration_is_picked_and_said(tmp_path):
    torchtitan_dump(tmp_path)
    (tmp_path / "profile_traces" / "iteration_20" / "args.json").write_text('{"lr": 0.1}')   # not a trace
    found = find(str(tmp_path))
    assert found.directory == str(tmp_path / "profile_traces" / "iteration_20")
    assert len(found.traces) == 4
    assert found.notes == [os.path.join("picked profile_traces", "iteration_20") +
                           " (latest of 3 iterations: 10, 15, 20; --iteration N for another)"]


def test_iteration_option_picks_another_and_a_missing_one_is_refused(tmp_path):
    torchtitan_dump(tmp_path)
    found = find(str(tmp_path), iteration=15)
    assert found.directory.endswith("iteration_15")
    assert "--iteration 15 of iterations 10, 15, 20; all 4 ranks" in found.notes[0]
    with pytest.raises(TraceError, match=r"no iteration_7 folder with traces \(iterations: 10, 15, 20\)"):
        find(str(tmp_path), iteration=7)


def test_iterations_sort_by_number_not_by_name(tmp_path):
    torchtitan_dump(tmp_path, iterations=(100, 20, 5))
    assert find(str(tmp_path)).directory.endswith("iteration_100")


def test_an_incomplete_latest_dump_is_skipped_for_the_latest_complete(tmp_path):
    torchtitan_dump(tmp_path, iterations=(10, 20))
    crashed = tmp_path / "profile_traces" / "iteration_30"
    crashed.mkdir()
    shutil.copy(rank_files(DLRM4)[0], crashed / "rank0_trace.json")
    found = find(str(tmp_path))
    assert found.directory.endswith("iteration_20")
    assert "latest complete of 3 iterations: 10, 20, 30; iteration_30 skipped: 1 of 4 ranks" in found.notes[0]


def test_a_cycle_cut_short_at_the_end_is_skipped_for_the_latest_whole_one(tmp_path):
    """torch.profiler stopped while recording (the run ended mid-cycle) writes what it had: every
    rank's trace of a step barely begun, a few KB beside the others' MB. It is skipped and said,
    and --iteration still reads it."""
    torchtitan_dump(tmp_path, iterations=(10, 20))
    cut = tmp_path / "profile_traces" / "iteration_30"
    cut.mkdir()
    for r in range(4):
        (cut / f"rank{r}_trace.json").write_text(json.dumps({
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": 4},
            "traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#30", "pid": 1,
                             "tid": 1, "ts": 1000.0, "dur": 84.0}]}))
    found = find(str(tmp_path))
    assert found.directory.endswith("iteration_20")
    whole = sum(os.path.getsize(f) for f in rank_files(DLRM4))
    assert ("iteration_30 skipped: 1 KB of traces against "
            f"{whole / 1e6:,.1f} MB for the others' median: a profiler cycle cut short") in found.notes[0]
    assert find(str(tmp_path), iteration=30).directory.endswith("iteration_30")


def test_job_root_with_configs_and_logs_finds_the_traces_below(tmp_path):
    """A run folder holds *.json that are not traces (configs, tokenizers, wandb logs)."""
    torchtitan_dump(tmp_path / "outputs")
    (tmp_path / "config.json").write_text('{"model": {"dim": 4096}}')
    (tmp_path / "wandb").mkdir()
    (tmp_path / "wandb" / "wandb-summary.json").write_text('{"loss": 2.5}')
    found = find(str(tmp_path))
    assert found.directory == str(tmp_path / "outputs" / "profile_traces" / "iteration_20")


def test_a_folder_of_data_files_is_not_read_through(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(MAX_NON_TRACES):
        (data / f"sample_{i:03d}.json").write_text('{"text": "x"}')
    shutil.copy(rank_files(DLRM4)[0], data / "zz_rank0_trace.json")   # past the first 64: not looked at
    shutil.copytree(DLRM4, tmp_path / "traces")
    assert find(str(tmp_path)).directory == str(tmp_path / "traces")


def test_several_runs_the_newest_complete_set_is_picked(tmp_path):
    """Three sibling log folders (tensorboard_trace_handler's naming kept): an older complete run,
    a newer complete one, and a newest one with only 2 of its 128 ranks."""
    for name, src, t in (("run_a", DLRM4, 1_000), ("run_b", DLRM4, 2_000), ("run_c", SAMPLED, 3_000)):
        (tmp_path / name).mkdir()
        for f in rank_files(src):
            out = tmp_path / name / os.path.basename(f)
            shutil.copy(f, out)
            os.utime(out, (t, t))
    found = find(str(tmp_path))
    assert found.directory == str(tmp_path / "run_b")
    assert found.notes == ["picked run_b (all 4 ranks; the newest complete of 3 folders with rank traces, "
                           "also: run_a, run_c; point diag at one of them for another)"]


def test_hidden_venv_and_linked_folders_are_not_searched(tmp_path):
    outside = tmp_path / "outside"
    shutil.copytree(DLRM4, outside)
    root = tmp_path / "root"
    root.mkdir()
    for hidden in (".cache", "venv", "node_modules"):
        shutil.copytree(DLRM4, root / hidden)
    (root / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    os.symlink(outside, root / "linked")
    (root / "logs").mkdir()
    os.symlink(rank_files(str(outside))[0], root / "logs" / "rank0_trace.json")   # a file link leaving the root
    with pytest.raises(TraceError, match="no trace files .* or its subfolders"):
        find(str(root))


def test_search_depth_is_bounded(tmp_path):
    deepest = tmp_path.joinpath("ok", *[f"d{i}" for i in range(1, MAX_DEPTH)])      # MAX_DEPTH below
    shutil.copytree(DLRM4, deepest)
    assert find(str(tmp_path)).directory == str(deepest)
    shutil.copytree(DLRM4, tmp_path.joinpath("far", *[f"d{i}" for i in range(1, MAX_DEPTH + 1)]))
    shutil.rmtree(tmp_path / "ok")
    with pytest.raises(TraceError):
        find(str(tmp_path))


def test_a_folder_with_traces_is_the_job_as_before(tmp_path):
    torchtitan_dump(tmp_path)
    it = tmp_path / "profile_traces" / "iteration_10"
    assert find(str(it)).notes == [] and find(str(it)).directory == str(it)
    assert find(str(it), iteration=20).notes == [f"--iteration 20 ignored: {it} holds trace files itself"]


def test_load_job_and_summaries_analyse_the_picked_folder(tmp_path):
    torchtitan_dump(tmp_path, iterations=(10, 20))
    job = load_job(str(tmp_path))
    assert [r.rank for r in job.ranks] == [0, 1, 2, 3]
    assert all("iteration_20" in r.path for r in job.ranks)
    assert job.notes[0].startswith("picked " + os.path.join("profile_traces", "iteration_20"))
    s = load_summaries(str(tmp_path), iteration=10)
    assert all("iteration_10" in r.path for r in s.ranks) and len(s.ranks) == 4
    assert "--iteration 10" in s.notes[0]


def test_summaries_beside_their_traces_in_a_subfolder_are_used(tmp_path):
    from diag.analysis.collect import summarize_file

    torchtitan_dump(tmp_path, iterations=(10,))
    it = tmp_path / "profile_traces" / "iteration_10"
    for f in sorted(os.listdir(it)):
        summarize_file(str(it / f))
    assert len(find(str(tmp_path)).summaries) == 4
    job = load_summaries(str(tmp_path))
    assert len(job.ranks) == 4
    assert any(n.startswith(f"4 of 4 ranks read from their summaries (*{SUFFIX}") for n in job.notes)
