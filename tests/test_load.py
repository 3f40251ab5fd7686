"""Loading real traces from public projects (tests/data) and the run/rank rules."""
import os

import numpy as np
import pytest

from conftest import DATA
from diag.trace import Coll, Kind, load_job, load_rank
from kineto import TraceBuilder


def test_every_real_folder_loads(real_folder):
    job = load_job(real_folder, strict=True)
    assert job.ranks and not job.problems
    for rt in job.ranks:
        t = rt.events
        assert len(t) > 0
        assert (t.dur_ns >= 0).all()
        assert t.name_id.max() < len(t.symbols)


def test_rank_comes_from_distributed_info_not_file_name():
    job = load_job(os.path.join(DATA, "dlrm_4_ranks_alltoall"))
    assert [r.rank for r in job.ranks] == [0, 1, 2, 3]
    assert job.world_size == 4 and not job.missing_ranks
    # GPU pid is the device index on these traces (pid 2 on rank 2), not 0.
    assert set(np.unique(job.ranks[2].events.device[job.ranks[2].events.gpu_mask()])) == {2}


def test_sampled_job_reports_missing_ranks():
    job = load_job(os.path.join(DATA, "sampled_2_of_128_ranks"))
    assert [r.rank for r in job.ranks] == [0, 1]
    assert len(job.missing_ranks) == 126


def test_no_distributed_info_is_said_not_guessed():
    job = load_job(os.path.join(DATA, "mi250_rocm_single"))
    assert job.ranks[0].rank == 0 and job.ranks[0].world_size is None
    assert any("no usable rank in distributedInfo" in n for n in job.notes)


def test_nanosecond_timestamps_keep_their_fraction():
    job = load_job(os.path.join(DATA, "a100_single_ns_resolution"))
    t = job.ranks[0].events
    assert (t.dur_ns[t.gpu_mask()] % 1000 != 0).mean() > 0.5


def test_nccl_args_and_old_kernel_names():
    new = load_job(os.path.join(DATA, "a100_rank0_of_2_nccl_args")).ranks[0]
    gpu = new.events.kind[new.comms.row] == Kind.COMM
    assert gpu.sum() == 21
    # 15 float all-reduces, 3 float and 3 int64 broadcasts (the kernel name says int8_t: it moves bytes)
    assert sorted(new.comms.dtype_bytes[gpu].tolist()) == [4] * 18 + [8] * 3
    assert (new.comms.group_size[gpu] == 2).all()
    assert {new.events.symbols[g] for g in new.comms.group[gpu]} == {"0,1"}
    old = load_job(os.path.join(DATA, "dlrm_2_ranks_alltoall")).ranks[0]
    gpu = old.events.kind[old.comms.row] == Kind.COMM
    assert gpu.sum() == 12 and (old.comms.group_size[gpu] == 0).all()   # args absent: unknown, not guessed
    # ...but the host op that launched them says what they are
    host_colls = {Coll(c).name for c in old.comms.coll[~gpu]}
    assert "ALL_TO_ALL" in host_colls


def test_cpu_only_trace_has_no_gpu_timeline():
    rt = load_job(os.path.join(DATA, "gloo_cpu_only_rank34")).ranks[0]
    assert not rt.has_gpu and rt.rank == 34 and rt.world_size == 300 and rt.backend == "gloo"
    assert len(rt.pg_config) == 11


def test_string_gpu_pid_and_bare_array_trace(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 50).kernel("k", 5, 10)
    for e in b.events:
        if e["cat"] == "kernel":
            e["pid"] = "0"
            del e["args"]["device"]
    import json
    p = tmp_path / "array.json"
    p.write_text(json.dumps(b.events))       # Chrome trace "JSON array format"
    rt = load_rank(str(p))
    t = rt.events
    assert t.device[t.kind == Kind.COMPUTE].tolist() == [0]


def two_runs_dir(tmp_path):
    for rank in (0, 1):
        TraceBuilder(rank=rank, world_size=2).step(1, 0, 10).kernel("k", 1, 2).write(str(tmp_path / f"a{rank}.json"))
    # the same ranks again, one hour later: another run
    for rank in (0, 1):
        TraceBuilder(rank=rank, world_size=2, base_ts=1_000_000.0 + 3.6e9).step(1, 0, 10).kernel("k", 1, 2).write(
            str(tmp_path / f"b{rank}.json"))
    TraceBuilder(rank=0, world_size=4).step(1, 0, 10).kernel("k", 1, 2).write(str(tmp_path / "c0.json"))
    return tmp_path


def test_files_of_other_runs_are_reported_not_mixed(tmp_path):
    job = load_job(str(two_runs_dir(tmp_path)))
    assert [r.rank for r in job.ranks] == [0, 1]
    runs = sorted(sorted(os.path.basename(p) for p in run) for run in job.other_runs)
    assert runs == [["a0.json", "a1.json"], ["c0.json"]] or runs == [["b0.json", "b1.json"], ["c0.json"]]
    assert len(job.notes) == 2 and all("another run" in n for n in job.notes)


def test_corrupt_rank_is_reported_and_others_load(tmp_path):
    for rank in (0, 1, 2):
        TraceBuilder(rank=rank, world_size=3).step(1, 0, 10).kernel("k", 1, 2).write(str(tmp_path / f"r{rank}.json.gz"))
    data = (tmp_path / "r1.json.gz").read_bytes()
    (tmp_path / "r1.json.gz").write_bytes(data[: len(data) // 2])
    job = load_job(str(tmp_path))
    assert [r.rank for r in job.ranks] == [0, 2]
    assert job.missing_ranks == [1]
    assert len(job.problems) == 1 and job.problems[0].path.endswith("r1.json.gz")
    assert "truncated gzip" in job.problems[0].problem
    from diag.trace import TraceError
    with pytest.raises(TraceError, match="r1.json.gz"):
        load_job(str(tmp_path), strict=True)
