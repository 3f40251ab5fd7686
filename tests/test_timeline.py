"""`diag analyze --timeline OUT.json`: the job on one Perfetto timeline, checked against the inputs.

Every check is worked out here from the raw input traces or the written file, not taken from
diag: events per rank counted in the input, flows paired by reading the file back, clock offsets
checked by shifting a rank's clock by a known amount, ends of matched collectives compared after
the shift, the finding marks set against the slow rank the workload was told to make, and HTA
(an independent reader) loading the file.
"""
import gzip
import json
import os
import re
import shutil
import statistics
from collections import Counter, defaultdict

import pytest
from click.testing import CliRunner

from conftest import DATA, ROOT
from diag.cli import main

SAMPLES = os.path.join(ROOT, "sample_traces")
JOBS = [os.path.join(SAMPLES, "tp2_pp2_dp2"), os.path.join(DATA, "dlrm_2_ranks_alltoall"),
        os.path.join(DATA, "dlrm_4_ranks_alltoall"), os.path.join(DATA, "sampled_2_of_128_ranks")]
PHASES = set("XBEbenistfCMPONDTSFRcp") | {"I"}
FLOW_CAT = "diag.collective"
# Output ts are float us; traces stamped in epoch us (~1.7e15) keep 0.25 us in a float64, and the
# offsets are whole ns: two rounding steps of at most 0.25 us each, then 1 us of margin.
TS_TOL_US = 1.5
COMM_NAME = re.compile(r"gloo|nccl|c10d|wait|send|recv|all_?reduce|broadcast|gather|scatter|all_?to_?all", re.I)


def timeline(path, out, *flags):
    r = CliRunner().invoke(main, ["analyze", str(path), "--timeline", str(out), *map(str, flags)],
                           catch_exceptions=False)
    return r


def written(path, tmp_path, *flags) -> dict:
    os.makedirs(tmp_path, exist_ok=True)
    out = tmp_path / "timeline.json"
    r = timeline(path, out, *flags)
    assert r.exit_code == 0, r.output
    with open(out) as f:
        return json.load(f)


def raw(path: str) -> dict:
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rt") as f:
        return json.load(f)


def input_of(job: str, doc: dict, rank: int) -> dict:
    return raw(os.path.join(job, doc["diag"]["ranks"][str(rank)]["file"]))


def ranks_of(doc: dict) -> list[int]:
    return sorted(int(r) for r in doc["diag"]["ranks"])


def slices(doc: dict) -> dict:
    """(pid, tid, ts) -> the X events starting there."""
    out = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            out[(e["pid"], e["tid"], e["ts"])].append(e)
    return out


def flows(doc: dict) -> dict:
    got = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("cat") == FLOW_CAT:
            got[e["id"]].append(e)
    return got


@pytest.mark.parametrize("job", JOBS, ids=os.path.basename)
def test_every_event_well_formed_and_every_input_event_written(job, tmp_path):
    doc = written(job, tmp_path)
    for e in doc["traceEvents"]:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and not isinstance(e["pid"], bool), e
        if e["ph"] != "M" or "tid" in e:
            assert isinstance(e.get("tid"), int), e
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)), e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    per_rank = Counter(e["pid"] for e in doc["traceEvents"] if e["ph"] != "M" and e.get("cat") != FLOW_CAT)
    for r in ranks_of(doc):
        src = input_of(job, doc, r)["traceEvents"]
        assert per_rank[r] == sum(1 for e in src if e.get("ph") != "M"), r
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    for r in ranks_of(doc):
        assert names[r] == f"rank {r}" or names[r].startswith(f"rank {r} ("), names[r]


def test_process_named_with_layout_coordinates(tmp_path):
    doc = written(os.path.join(SAMPLES, "tp2_pp2_dp2"), tmp_path)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    # layout pp2 x dp2 x tp2, tp innermost: rank 5 = pp 1, dp 0, tp 1 (worked by hand)
    assert names[5] == "rank 5 (pp1 dp0 tp1)" and names[2] == "rank 2 (pp0 dp1 tp0)"
    assert "diag findings" in names.values()
    threads = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] != "M"}
    assert used <= threads, "every track has a name"
    src = input_of(os.path.join(SAMPLES, "tp2_pp2_dp2"), doc, 5)["traceEvents"]
    assert len({(e["pid"], e["tid"]) for e in src if e.get("ph") != "M"}) == len({t for p, t in used if p == 5})


@pytest.mark.parametrize("job", JOBS[:3], ids=os.path.basename)
def test_flows_pair_one_collective_across_ranks(job, tmp_path):
    doc = written(job, tmp_path)
    at = slices(doc)
    got = flows(doc)
    assert got, "matched collectives are linked"
    assert all(v["collectives_not_found"] == 0 for v in doc["diag"]["ranks"].values())
    for fid, evs in got.items():
        assert sorted(e["ph"] for e in evs) == ["f", "s"], evs
        s, f = sorted(evs, key=lambda e: e["ph"], reverse=True)
        assert s["pid"] != f["pid"] and f["bp"] == "e"
        a, b = at[(s["pid"], s["tid"], s["ts"])], at[(f["pid"], f["tid"], f["ts"])]
        assert a and b, (s, f)
        na, nb = a[0]["name"], b[0]["name"]
        assert na == nb or {"send" in na, "recv" in nb} == {True} or {"recv" in na, "send" in nb} == {True}, (na, nb)
        # the flow starts at the member that arrived last: its instance is the shortest of the two
        assert a[0]["dur"] <= b[0]["dur"] + 1e-3, (a[0], b[0])


def _matches(doc: dict) -> list[dict]:
    """Each matched collective read back from the file: a flow star from its last arriver; rank -> end."""
    at = slices(doc)
    by_source = defaultdict(dict)
    for evs in flows(doc).values():
        s, f = sorted(evs, key=lambda e: e["ph"], reverse=True)
        a, b = at[(s["pid"], s["tid"], s["ts"])][0], at[(f["pid"], f["tid"], f["ts"])][0]
        key = (s["pid"], s["tid"], s["ts"])
        by_source[key][s["pid"]] = a["ts"] + a["dur"]
        by_source[key][f["pid"]] = b["ts"] + b["dur"]
    return list(by_source.values())


@pytest.mark.parametrize("job", JOBS[:3], ids=os.path.basename)
def test_ends_of_matched_collectives_line_up(job, tmp_path):
    """Each rank was set against one other (via) at the median of their ends' difference over the
    collectives they met in: read back from the file (matches rebuilt from the flows), that median
    is zero, to the rounding of the file's float timestamps. (How far single instances stray from
    it is the job's own noise: `spread_ns`, a few us on the NCCL jobs, up to a ms on gloo under load.)"""
    doc = written(job, tmp_path)
    clock = doc["diag"]["clock"]
    assert clock["aligned"]
    matches = _matches(doc)
    for sh in clock["shifts"]:
        r, via = sh["rank"], sh["via"]
        if r == via:
            continue
        diffs = [m[r] - m[via] for m in matches if r in m and via in m]
        assert len(diffs) == sh["instances"], (r, via)
        assert abs(statistics.median(diffs)) <= TS_TOL_US, (r, via, diffs)


def _shifted_copy(src: str, dst, rank_file: str, shift_us: float) -> None:
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if name != rank_file:
            shutil.copy(os.path.join(src, name), dst / name)
    doc = raw(os.path.join(src, rank_file))
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += shift_us
    with open(dst / rank_file, "w") as f:
        json.dump(doc, f)


def test_a_host_clock_set_off_is_set_back(tmp_path):
    """Rank 1's host clock 2.5 s ahead: its offset moves by exactly -2.5 s and the timeline is the same."""
    job = os.path.join(DATA, "dlrm_2_ranks_alltoall")
    base = written(job, tmp_path / "a")
    off = 2_500_000.0
    _shifted_copy(job, tmp_path / "shifted", base["diag"]["ranks"]["1"]["file"], off)
    moved = written(tmp_path / "shifted", tmp_path / "b")
    o0, o1 = base["diag"]["clock"]["offsets_ns"], moved["diag"]["clock"]["offsets_ns"]
    assert o1["0"] == o0["0"] == 0
    assert abs((o1["1"] - o0["1"]) + off * 1e3) <= 1e3, (o0, o1)
    ts0 = [e["ts"] for e in base["traceEvents"] if e["pid"] == 1 and e["ph"] == "X"]
    ts1 = [e["ts"] for e in moved["traceEvents"] if e["pid"] == 1 and e["ph"] == "X"]
    assert len(ts0) == len(ts1) and max(abs(a - b) for a, b in zip(ts0, ts1)) <= TS_TOL_US


def test_nothing_matched_keeps_raw_clocks_and_says_so(tmp_path):
    job = os.path.join(DATA, "sampled_2_of_128_ranks")
    out = tmp_path / "t.json"
    r = timeline(job, out)
    assert r.exit_code == 0, r.output
    assert "clocks not aligned" in r.output
    doc = json.load(open(out))
    assert doc["diag"]["clock"]["aligned"] is False and set(doc["diag"]["clock"]["offsets_ns"].values()) == {0}
    src = [e["ts"] for e in input_of(job, doc, 1)["traceEvents"] if e.get("ph") == "X"]
    got = [e["ts"] for e in doc["traceEvents"] if e["pid"] == 1 and e["ph"] == "X"]
    assert got == src


def _marks(doc: dict, track_prefix: str) -> list[tuple[str, dict]]:
    fpid = next(e["pid"] for e in doc["traceEvents"] if e["ph"] == "M" and e["args"].get("name") == "diag findings")
    tracks = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
              if e["ph"] == "M" and e["pid"] == fpid and e["name"] == "thread_name"}
    return [(tracks[e["tid"]], e) for e in doc["traceEvents"]
            if e["pid"] == fpid and e["ph"] == "X" and tracks[e["tid"]].startswith(track_prefix)]


def _late_set(job) -> list[int]:
    """The straggler set the Diagnosis names from collectives (`diag analyze --format json`)."""
    report = CliRunner().invoke(main, ["analyze", str(job), "--format", "json"], catch_exceptions=False)
    late = [s for s in json.loads(report.output)["comm"]["stragglers"] if s["basis"] == "collectives"]
    assert late, "the Diagnosis names a straggler"
    return late[0]["ranks"]


def _straggler_marks_on_its_collectives(doc: dict, ranks: list[int]) -> None:
    """Each straggler mark sits on a member's track, over one of that member's own slices (its
    late collective: same start and length on the shared axis)."""
    marks = _marks(doc, "straggler")
    assert marks and {t for t, _ in marks} <= {f"straggler: rank {r}" for r in ranks}
    for track, m in marks:
        rank = int(track.rsplit(" ", 1)[1])
        assert m["args"]["rank"] == rank
        same = [e for e in doc["traceEvents"] if e["pid"] == rank and e["ph"] == "X"
                and abs(e["ts"] - m["ts"]) <= TS_TOL_US and abs(e["dur"] - m["dur"]) <= TS_TOL_US]
        assert same, m


def test_straggler_marked_on_its_late_collectives(tmp_path):
    job = os.path.join(DATA, "dlrm_4_ranks_alltoall")
    late = _late_set(job)
    assert late == [2]         # the trace's story (README): everybody waits for rank 2
    _straggler_marks_on_its_collectives(written(job, tmp_path), late)


@pytest.mark.slow
def test_slow_rank_of_a_real_job_is_marked(native3d_run, tmp_path):
    """The torchtitan-style gloo job with rank 5 made slow (tests/test_native_job.py's run). On a
    loaded machine another rank may take turns with it; the marks follow the set the Diagnosis names."""
    job = native3d_run("1f1b", "--slow-rank", "5", "--slow-ms", "1000")   # the same run as test_native_job
    late = _late_set(job)
    assert 5 in late, late
    doc = written(job, tmp_path)
    _straggler_marks_on_its_collectives(doc, late)
    assert any(t == "straggler: rank 5" for t, _ in _marks(doc, "straggler"))
    assert doc["diag"]["clock"]["aligned"] and flows(doc)


def test_worst_bubble_marked_on_the_stage_the_diagnosis_names(tmp_path):
    job = os.path.join(SAMPLES, "tp2_pp2_dp2")
    d = json.loads(CliRunner().invoke(main, ["analyze", job, "--format", "json"]).output)
    worst = max(d["pipeline"]["stages"], key=lambda s: s["bubble_s"])
    doc = written(job, tmp_path)
    marks = _marks(doc, "worst pipeline bubble")
    assert marks
    track = marks[0][0]
    assert track.startswith(f"worst pipeline bubble: stage {worst['stage']} (rank ")
    rank = int(track.rsplit("rank ", 1)[1].rstrip(")"))
    assert rank in worst["ranks"]
    step = max((e for _, e in marks), key=lambda e: e["dur"])
    for _, m in marks:        # the waits lie inside the step
        assert step["ts"] - TS_TOL_US <= m["ts"] and m["ts"] + m["dur"] <= step["ts"] + step["dur"] + TS_TOL_US
    host = [e for e in doc["traceEvents"] if e["pid"] == rank and e["ph"] == "X" and e["name"].startswith("ProfilerStep")]
    assert any(abs(e["ts"] - step["ts"]) <= TS_TOL_US for e in host), "the step marked is one of the rank's steps"


def test_exposed_communication_marked_where_it_is_largest(tmp_path):
    job = os.path.join(SAMPLES, "tp2_pp2_dp2")
    d = json.loads(CliRunner().invoke(main, ["analyze", job, "--format", "json"]).output)
    top = max(d["comm"]["ranks"], key=lambda r: r["exposed_s"])
    doc = written(job, tmp_path)
    marks = [e for t, e in _marks(doc, "exposed communication") if t.endswith(f"rank {top['rank']}")]
    assert marks
    # the marks are the union of the rank's exposed stretches; exposed_s sums them per instance
    assert sum(m["dur"] for m in marks) * 1e-6 <= top["exposed_s"] * 1.001 + 1e-6
    # each lies where the rank's own events say it communicates (gloo transfers, c10d ops, waits on them)
    comm = sorted((e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"]
                  if e["pid"] == top["rank"] and e["ph"] == "X" and COMM_NAME.search(e["name"]))
    union = []
    for a, b in comm:
        if union and a <= union[-1][1] + TS_TOL_US:
            union[-1][1] = max(union[-1][1], b)
        else:
            union.append([a, b])
    for m in marks:
        assert any(a - TS_TOL_US <= m["ts"] and m["ts"] + m["dur"] <= b + TS_TOL_US for a, b in union), m


def test_hta_reads_the_timeline(tmp_path):
    pytest.importorskip("hta", reason="HTA is the reference: install the project's `hta` extra (make test does)")
    from hta.trace_analysis import TraceAnalysis

    job = os.path.join(DATA, "dlrm_2_ranks_alltoall")
    doc = written(job, tmp_path / "out")
    folder = tmp_path / "hta"
    folder.mkdir()
    shutil.copy(tmp_path / "out" / "timeline.json", folder / "timeline.json")
    t = TraceAnalysis(trace_dir=str(folder)).t
    df = t.get_trace(t.get_ranks()[0])
    ref = TraceAnalysis(trace_dir=job).t          # HTA on the input traces: what it keeps of each rank
    ranks = ranks_of(doc)
    # HTA keeps a rank's events inside its iterations; on one file of all ranks the iterations
    # are every rank's steps together, so it keeps at least what it keeps of the ranks' own files,
    # and at most the rank's complete events
    assert df["pid"].isin(ranks).sum() >= sum(len(ref.get_trace(r)) for r in ranks)
    for r in ranks:
        assert (df["pid"] == r).sum() <= sum(1 for e in input_of(job, doc, r)["traceEvents"] if e.get("ph") == "X")
    marks = sum(1 for e in doc["traceEvents"] if e.get("cat") == "diag.finding")
    assert (~df["pid"].isin(ranks)).sum() == marks > 0


def test_bad_paths_say_what_is_wrong(tmp_path):
    job = os.path.join(DATA, "dlrm_2_ranks_alltoall")
    for out in (tmp_path / "no" / "such" / "t.json", tmp_path):
        r = timeline(job, out)
        assert r.exit_code == 2 and str(out) in r.output and "cannot write the timeline" in r.output, r.output
    sums = tmp_path / "sums"
    r = CliRunner().invoke(main, ["summarize", job, "--out-dir", str(sums)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    r = timeline(sums, tmp_path / "t.json")
    assert r.exit_code == 2 and "summary" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "t.json").exists()
    inside = tmp_path / "copy"
    shutil.copytree(job, inside)
    victim = inside / sorted(os.listdir(inside))[0]
    before = victim.read_bytes()
    r = timeline(inside, victim)
    assert r.exit_code == 2 and "overwrite" in r.output and victim.read_bytes() == before, r.output


def test_a_corrupt_rank_does_not_stop_the_others(tmp_path):
    job = tmp_path / "job"
    shutil.copytree(os.path.join(DATA, "dlrm_2_ranks_alltoall"), job)
    (job / "host_9.1.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "ts": ')
    doc = written(job, tmp_path / "out")
    assert ranks_of(doc) == [0, 1]
    assert [p["file"] for p in doc["diag"]["problems"]] == [str(job / "host_9.1.pt.trace.json")]


def test_big_traces_copied_chunk_by_chunk_write_the_same(tmp_path, monkeypatch):
    """The copy decodes a few MB of events at a time; with chunks of 64 KiB (about 30 per rank
    here) the file written is the same as from one decode per rank."""
    from diag.trace import schema

    job = os.path.join(DATA, "dlrm_2_ranks_alltoall")
    whole = written(job, tmp_path / "whole")
    monkeypatch.setattr(schema, "CHUNK_BYTES", 64 << 10)
    chunked = written(job, tmp_path / "chunked")
    assert chunked["traceEvents"] == whole["traceEvents"]


def test_gzip_timeline_when_the_name_says_so(tmp_path):
    job = os.path.join(DATA, "dlrm_2_ranks_alltoall")
    plain = written(job, tmp_path / "plain")
    r = timeline(job, tmp_path / "t.json.gz")
    assert r.exit_code == 0, r.output
    assert raw(str(tmp_path / "t.json.gz"))["traceEvents"] == plain["traceEvents"]
