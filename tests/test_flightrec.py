"""Flight Recorder dumps of a real gloo job: the hang verdict against PyTorch's fr_trace, the safe
pickle loader, bad dumps, and timings worked by hand.

The job (tests/workloads/fr_gloo_job.py) is a DeviceMesh dp 2 × tp 2 on gloo where rank 3 skips
its DP all-reduce of step 4 (after 4 completed ones) and so everything after it.
"""
import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest

from diag.analysis.flightrec import flight_record
from diag.trace.errors import TraceError
from diag.trace.flightrec import load_plain, read_dump

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_RANK, SKIP_STEP = 3, 4
MESH = {"mesh_dp": [[0, 2], [1, 3]], "mesh_tp": [[0, 1], [2, 3]], "default_pg": [[0, 1, 2, 3]]}


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("frjob")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "workloads", "fr_gloo_job.py"), "--out", str(out),
                    "--skip-rank", str(SKIP_RANK), "--skip-step", str(SKIP_STEP)], check=True, timeout=300,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert sorted(os.listdir(out)) == ["pickle", "rank-0.json", "rank-1.json", "rank-2.json", "rank-3.json"]
    return out


@pytest.fixture(scope="module")
def plain_job(tmp_path_factory):
    """The same job with groups from dist.new_group(): no description, so no axis is known."""
    out = tmp_path_factory.mktemp("frplain")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "workloads", "fr_gloo_job.py"), "--out", str(out),
                    "--skip-rank", str(SKIP_RANK), "--skip-step", str(SKIP_STEP), "--plain", "--port", "29743"],
                   check=True, timeout=300, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def test_plain_torch_dumps_name_groups_by_ranks_not_a_guessed_axis(plain_job):
    """torch's own _dump_fr_trace_json and pickled _dump_fr_trace from a job with no mesh: the groups
    are named by their ranks and pg, 'axis unknown'; the default group is the world."""
    for sub, name in (("", "rank-{}.json"), ("pickle", "rank_{}")):
        folder = plain_job / sub if sub else plain_job
        if sub:
            for r in range(4):
                assert read_dump(str(folder / name.format(r))).entries == read_dump(
                    str(plain_job / f"rank-{r}.json")).entries
        fr, problems = flight_record(str(folder))
        assert not problems and fr.cause == [SKIP_RANK] and fr.backend == "gloo" and fr.world_size == 4
        assert {g.axis for g in fr.groups} <= {"unknown", "world"}
        (g,) = [g for g in fr.groups if g.ranks == [1, 3]]
        assert g.axis == "unknown" and g.missing == [3]
        assert g.verdict.startswith(f"group [1, 3] (pg {g.pg}, axis unknown): rank 3 never entered all_reduce "
                                    f"#{SKIP_STEP + 1} (16 KiB); rank 1 waits in it since ")
        assert {t.axis for t in fr.timings} <= {"unknown", "world"}
    text = subprocess.run([sys.executable, "-m", "diag.cli", "analyze", str(plain_job / "pickle")], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    # torch's own dumps record neither why nor when: a hang, its wait a lower bound, and why it may not be
    assert "hang: the others wait for rank 3, which waits in no collective" in text.stdout, text
    assert ("hang: no dump reason recorded (torch's watchdog dumps on a timeout; a dump taken on request can catch "
            "ranks mid-collective); the longest wait at least ") in text.stdout
    assert "Groups named by: unknown" in text.stdout and " dp " not in text.stdout


def test_hang_names_the_rank_group_collective_and_number(job):
    fr, problems = flight_record(str(job))
    assert not problems and fr.ranks == [0, 1, 2, 3] and fr.cause == [SKIP_RANK]
    g = fr.groups[0]                                   # the cause first
    assert (g.axis, g.ranks, g.missing, [w.rank for w in g.waiting]) == ("dp", [1, 3], [3], [1])
    assert g.next_seq == SKIP_STEP + 1 and g.next_op == "all_reduce"
    assert g.next_bytes == 4096 * 4                    # torch.ones(4096), float32: all-reduce S = the buffer
    assert g.verdict.startswith(f"dp group [1, 3]: rank 3 never entered all_reduce #{SKIP_STEP + 1} (16 KiB); "
                                "rank 1 waits in it since ")


def _fr_trace_first_missing(folder) -> dict:
    """PyTorch's own analyser on the same dumps: {group name: (first seq not joined, missing ranks)}."""
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder),
                          "--prefix", "rank_"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found, seq = {}, None
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("Not all ranks joining collective, sequence number:"):
            seq = int(line.rsplit(":", 1)[1])
        elif line.startswith("group info:") and seq is not None:
            group = line.split(":", 1)[1].strip().split(":")[0]
        elif line.startswith("missing ranks:") and seq is not None:
            missing = sorted(int(x) for x in line.split(":", 1)[1].strip(" {}").split(","))
            if group not in found or seq < found[group][0]:
                found[group] = (seq, missing)
            seq = None
    return found


def test_hang_agrees_with_pytorch_fr_trace(job, tmp_path):
    """fr_trace needs pg_config, which gloo leaves empty: give it the mesh's groups (as NCCL writes
    them), in copies of the same pickles, read with diag's safe loader and written back."""
    for r in range(4):
        raw = load_plain(str(job / "pickle" / f"rank_{r}"))
        raw["pg_config"] = {e["process_group"][0]: {"name": e["process_group"][0], "desc": e["process_group"][1],
                                                    "ranks": str(next(g for g in MESH[e["process_group"][1]] if r in g))}
                            for e in raw["entries"]}
        with open(tmp_path / f"rank_{r}", "wb") as f:
            pickle.dump(raw, f)
    theirs = _fr_trace_first_missing(tmp_path)
    fr, _ = flight_record(str(job))
    ours = {g.pg: (g.next_seq, g.missing) for g in fr.hangs}
    assert ours == theirs and len(ours) == 3


def test_pickle_dump_reads_as_its_json(job):
    for r in range(4):
        a, b = read_dump(str(job / f"rank-{r}.json")), read_dump(str(job / "pickle" / f"rank_{r}"))
        assert a.rank == b.rank == r and a.entries == b.entries and len(a.entries) > 4


class _Boom:
    def __reduce__(self):
        return (os.system, (f"touch {_Boom.marker}",))


def test_pickle_naming_a_class_is_refused_and_nothing_runs(tmp_path):
    _Boom.marker = tmp_path / "ran"
    bad = tmp_path / "rank_0"
    bad.write_bytes(pickle.dumps({"version": "2.10", "entries": [_Boom()]}))
    with pytest.raises(TraceError) as e:
        read_dump(str(bad))
    assert str(bad) in str(e.value) and "only plain containers" in str(e.value) and "system" in str(e.value)
    assert not _Boom.marker.exists()


def _corrupt(raw: dict, how: str):
    e = raw["entries"][2]
    if how == "seq":
        e["collective_seq_id"] = "abc"
    elif how == "group":
        e["process_group"] = 5
    elif how == "duration":
        e["duration_ms"] = -1
    elif how == "sizes":
        e["input_sizes"] = [["x"]]
    elif how == "ranks":
        raw["pg_config"] = {"1": {"desc": "mesh_dp", "ranks": "[0, oops"}}
    elif how == "top":
        return [raw]
    elif how == "seq past int64":
        e["collective_seq_id"] = 1 << 63
    elif how == "time past int64":
        e["time_created_ns"] = 10 ** 30
    return raw


@pytest.mark.parametrize("how,problem", [
    ("seq", "entry 2: collective_seq_id is 'abc', not an integer"),
    ("group", "entry 2: process_group is 5, not [name, description]"),
    ("duration", "entry 2: duration_ms is -1, not a duration"),
    ("sizes", "entry 2: input/output sizes are not lists of dimensions"),
    ("ranks", "pg_config['1'].ranks is '[0, oops', not a list of ranks"),
    ("top", "not a Flight Recorder dump: no 'entries' list at the top"),
    ("truncated", "not valid JSON"),
    # #20: numbers past int64 (found: an OverflowError in the timings, an IndexError in the hang verdict)
    ("seq past int64", f"entry 2: collective_seq_id is {1 << 63}, not an integer from 0 to 2^63"),
    ("time past int64", f"entry 2: time_created_ns is {10 ** 30}, not an integer from 0 to 2^63"),
])
def test_bad_dump_is_one_line_and_the_others_are_analysed(job, tmp_path, how, problem):
    (tmp_path / "flightrec").mkdir()          # the trainer's folder: every rank file in it is a dump
    for r in range(4):
        shutil.copy(job / f"rank-{r}.json", tmp_path / "flightrec" / f"rank-{r}.json")
    bad = tmp_path / "flightrec" / "rank-2.json"
    if how == "truncated":
        bad.write_bytes(bad.read_bytes()[:3000])
    else:
        bad.write_text(json.dumps(_corrupt(json.loads(bad.read_text()), how)))
    fr, problems = flight_record(str(tmp_path))
    assert [(p.file, p.problem.split(" (")[0]) for p in problems] == [(str(bad), problem.split(" (")[0])]
    assert fr.ranks == [0, 1, 3]
    dp13 = next(g for g in fr.groups if g.ranks == [1, 3])
    assert dp13.missing == [3] and dp13.next_seq == SKIP_STEP + 1     # unaffected by rank 2's file
    text = subprocess.run([sys.executable, "-m", "diag.cli", "analyze", str(tmp_path)], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert f"problem: {bad}: {problem.split(' (')[0]}" in text.stdout and text.returncode == 0, text


def test_timed_dumps_give_transfer_wait_and_busbw_by_hand(job, tmp_path):
    """NCCL with TORCH_NCCL_ENABLE_TIMING writes duration_ms; gloo none. Durations set by hand on the
    real dumps: in every DP all-reduce the even rank of a pair 3 ms, the odd rank 1 ms."""
    for r in range(4):
        raw = json.loads((job / f"rank-{r}.json").read_text())
        for e in raw["entries"]:
            e["duration_ms"] = (3.0 if r % 2 == 0 else 1.0) if e["process_group"][1] == "mesh_dp" else 0.5
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(raw))
    fr, _ = flight_record(str(tmp_path))
    dp = next(t for t in fr.timings if (t.axis, t.op) == ("dp", "all_reduce"))
    # pairs [0,2] and [1,3]: transfer = the shorter member's 1 ms only where the pair differs
    # ([1,3]: 1 ms and 1 ms -> transfer 1 ms, wait 0; [0,2]: 3 and 3 -> transfer 3 ms, wait 0).
    matched = {0: SKIP_STEP + 1 - 0, 1: SKIP_STEP}    # [0,2] finished #1..#5 on both, [1,3] #1..#4
    assert dp.instances == matched[0] + matched[1]
    transfers = sorted([3e-3] * matched[0] + [1e-3] * matched[1])
    assert dp.transfer_median_s == pytest.approx(transfers[len(transfers) // 2])
    # busbw: S = 16384 B, n = 2, f = 2(n-1)/n = 1: S / t, GB/s
    assert dp.busbw_median_gbps == pytest.approx(16384 / transfers[len(transfers) // 2] / 1e9)
    assert dp.wait_median_s == 0 and dp.unknown is None


def test_a_dump_that_skips_sequence_numbers_gives_a_verdict(job, tmp_path):
    """Rank 2's numbers jump by 2^40 past its first entries (a wrapped or damaged buffer): the group's
    next collective is the first one past the last common number that a member entered, named as
    such (found: an IndexError when nobody had entered last common + 1)."""
    (tmp_path / "flightrec").mkdir()
    for r in range(4):
        shutil.copy(job / f"rank-{r}.json", tmp_path / "flightrec" / f"rank-{r}.json")
    bad = tmp_path / "flightrec" / "rank-2.json"
    raw = json.loads(bad.read_text())
    for e in raw["entries"][3:]:
        e["collective_seq_id"] += 1 << 40
    bad.write_text(json.dumps(raw))
    fr, problems = flight_record(str(tmp_path))
    assert not problems and fr.ranks == [0, 1, 2, 3]
    jumped = [g for g in fr.groups if 2 in g.ranks and g.next_seq and g.next_seq > 1 << 40]
    assert jumped and all(g.verdict and f"#{g.next_seq}" in g.verdict for g in jumped)
