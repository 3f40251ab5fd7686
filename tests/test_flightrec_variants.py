"""Flight Recorder dumps as other writers and versions leave them (#21): NCCL's pickles with tuples
and states, untimed entries, old-style pg_config, send/recv, coalesced collectives, empty buffers,
a rank's dump missing or empty, groups with no axis known, and a buffer of thousands of entries.

Dumps are written here field by field as PyTorch 2.x writes them (torch/csrc/distributed/c10d/
FlightRecorder*.cpp: `version`, `pg_config` {name: {name, desc, ranks: "[0, 1]"}}, `pg_status`,
`entries`), one variation at a time on a job whose truth is known: 4 ranks, dp [0, 2] [1, 3] ×
tp [0, 1] [2, 3], 1 MiB bf16 all-reduces, rank 3 never entering its DP all-reduce #6.
"""
import json
import pickle
import time

import pytest

from diag.analysis.flightrec import analyse_dumps, flight_record
from diag.report.frfmt import fr_lines
from diag.trace.flightrec import FRDump, FREntry, read_dump
from diag.trace.kinds import Coll

T0 = 1_790_000_000_000_000_000
GROUPS = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("mesh_tp", [0, 1]), "2": ("mesh_tp", [2, 3]),
          "3": ("mesh_dp", [0, 2]), "4": ("mesh_dp", [1, 3])}
MIB = 1 << 20


def _entry(pg, seq, rank, k, op="nccl:all_reduce", nelems=MIB // 2, state="completed", **kw):
    e = {"record_id": k, "pg_id": int(pg), "process_group": (pg, GROUPS[pg][0]), "collective_seq_id": seq,
         "p2p_seq_id": 0, "op_id": seq, "profiling_name": op, "time_created_ns": T0 + k * 10_000_000 + rank,
         "input_sizes": [[nelems]], "input_dtypes": ["BFloat16"], "output_sizes": [[nelems]],
         "output_dtypes": ["BFloat16"], "state": state, "time_discovered_started_ns": T0 + k * 10_000_000 + 5,
         "time_discovered_completed_ns": T0 + k * 10_000_000 + 900, "duration_ms": 0.5, "retired": True,
         "timeout_ms": 600000, "is_p2p": False, "frames": [{"name": "all_reduce", "filename": "x.py", "line": 1}]}
    e.update(kw)
    return e


def _job(skip=True):
    """{rank: raw dump}: 8 steps of (tp all-reduce, dp all-reduce); rank 3 stops before DP #6."""
    out = {}
    for r in range(4):
        tp, dp = ("1" if r < 2 else "2"), ("3" if r % 2 == 0 else "4")
        ents, k = [], 0
        for step in range(1, 9):
            if skip and step == 6 and r in (2, 3):
                if r == 2:          # rank 2 waits in TP #6 for rank 3, which waits in nothing
                    ents.append(_entry(tp, step, r, k, state="started", time_discovered_completed_ns=None,
                                       duration_ms=None))
                break
            last = skip and step == 6
            ents.append(_entry(tp, step, r, k))
            k += 1
            ents.append(_entry(dp, step, r, k, state="started" if last else "completed",
                               duration_ms=None if last else 0.5))
            k += 1
            if last:
                break
        out[r] = {"version": "2.10", "comm_lib_version": "2.21.5", "nccl_comm_state": {},
                  "pg_config": {g: {"name": g, "desc": d, "ranks": str(m)} for g, (d, m) in GROUPS.items()
                                if r in m},
                  "pg_status": {}, "entries": ents}
    return out


def _write(folder, raw: dict, fmt="pickle"):
    folder.mkdir(exist_ok=True)
    for r, d in raw.items():
        if fmt == "pickle":            # TORCH_FR_DUMP_TEMP_FILE's <prefix><rank>, as the watchdog writes
            (folder / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(d))
        else:
            (folder / f"rank_{r}.json").write_text(json.dumps(d))
    return folder


def _v(fr, ranks):
    """The verdict of the group with these members (groups of one cause come in no set order)."""
    (g,) = [g for g in fr.groups if g.ranks == ranks]
    return g.verdict


def _verdicts(folder):
    fr, problems = flight_record(str(folder))
    return fr, problems, [g.verdict for g in fr.hangs]


def test_nccl_pickle_hang_names_rank_axis_op_seq_size(tmp_path):
    fr, problems, v = _verdicts(_write(tmp_path / "comm_traces", _job()))
    assert not problems and fr.backend == "nccl" and fr.world_size == 4 and fr.world_known and not fr.undumped
    assert fr.cause == [3]
    assert _v(fr, [1, 3]).startswith("dp group [1, 3]: rank 3 never entered all_reduce #6 (1 MiB); rank 1 waits in it since ")
    assert any(x.startswith("dp group [0, 2]: rank 2 never entered all_reduce #6 (1 MiB); rank 0 waits")
               and x.endswith("rank 2 itself waits in tp group [2, 3] all_reduce #6") for x in v)


def test_json_and_pickle_of_one_job_agree(tmp_path):
    a, _, va = _verdicts(_write(tmp_path / "p", _job()))
    b, _, vb = _verdicts(_write(tmp_path / "j", _job(), "json"))
    assert va == vb and [t.instances for t in a.timings] == [t.instances for t in b.timings]


@pytest.mark.parametrize("how", ["no_duration", "discovered_zero", "discovered_absent", "scheduled_only",
                                 "version_1x", "no_version", "old_pg_config", "ranks_as_list", "no_pg_config"])
def test_field_set_variations_give_the_same_hang(tmp_path, how):
    raw = _job()
    for r, d in raw.items():
        for e in d["entries"]:
            if how == "no_duration":
                e.pop("duration_ms")
            elif how == "discovered_zero":
                e["time_discovered_started_ns"] = e["time_discovered_completed_ns"] = 0
            elif how == "discovered_absent":
                e.pop("time_discovered_started_ns"), e.pop("time_discovered_completed_ns")
            elif how == "scheduled_only":
                e["state"] = "scheduled"
        if how == "version_1x":
            d["version"] = "1.5"
        elif how == "no_version":
            d.pop("version")
        elif how == "old_pg_config":           # a group as its ranks alone
            d["pg_config"] = {g: c["ranks"] and json.loads(c["ranks"]) for g, c in d["pg_config"].items()}
        elif how == "ranks_as_list":
            for c in d["pg_config"].values():
                c["ranks"] = [str(x) for x in json.loads(c["ranks"])]
        elif how == "no_pg_config":
            d.pop("pg_config")
    fr, problems, v = _verdicts(_write(tmp_path / "comm_traces", raw))
    assert not problems and fr.cause == [3]
    assert _v(fr, [1, 3]).startswith("dp group [1, 3]: rank 3 never entered all_reduce #6 (1 MiB); rank 1 waits in it since ")
    dp = next(t for t in fr.timings if (t.axis, t.op) == ("dp", "all_reduce"))
    assert dp.instances == 5 + 5 and dp.median_bytes == MIB
    if how == "no_duration":
        assert dp.transfer_median_s is None and dp.busbw_median_gbps is None and "no durations" in dp.unknown
    elif how in ("old_pg_config", "ranks_as_list"):
        assert fr.world_known and fr.world_size == 4


def test_all_entered_none_completed_is_a_stuck_collective(tmp_path):
    """NCCL: every member of DP [1, 3] entered #6 and it never completed (a network or GPU fault):
    no rank is behind; the collective itself is named, with the members' states."""
    raw = _job(skip=False)
    for r in (1, 3):
        for e in raw[r]["entries"]:
            if e["process_group"][0] == "4" and e["collective_seq_id"] == 8:
                e.update(state="started" if r == 1 else "scheduled", time_discovered_completed_ns=None)
    fr, _, v = _verdicts(_write(tmp_path / "comm_traces", raw))
    (g,) = fr.hangs
    assert g.not_completed == [1, 3] and not g.missing and fr.cause == []
    assert v[0].startswith("dp group [1, 3]: every member entered all_reduce #8 (1 MiB) and it never completed "
                           "(rank 1 started, rank 3 scheduled); inside since ")


def test_gloo_states_are_not_read_as_stuck(tmp_path):
    """gloo writes every entry 'scheduled', done or not: no 'never completed' from that."""
    raw = _job(skip=False)
    for d in raw.values():
        for e in d["entries"]:
            e.update(state="scheduled", profiling_name="gloo:all_reduce", time_discovered_completed_ns=0)
            e.pop("duration_ms")
    fr, _, v = _verdicts(_write(tmp_path / "comm_traces", raw))
    assert v == [] and fr.backend == "gloo"


def test_point_to_point_entries_are_kept_apart(tmp_path):
    """send/recv numbered by p2p_seq_id (collective_seq_id 0, or absent with no is_p2p in older
    dumps): never matched as the group's collectives."""
    raw = _job()
    for r, d in raw.items():
        peer = r ^ 2
        for i in range(3):
            d["entries"].append(_entry("3" if r % 2 == 0 else "4", 0, r, 100 + i, op=f"nccl:send {r}->{peer}",
                                       is_p2p=True, p2p_seq_id=i + 1))
        old = _entry("3" if r % 2 == 0 else "4", 1, r, 200, op=f"nccl:recv {r}<-{peer}")
        old.pop("is_p2p"), old.pop("p2p_seq_id")
        d["entries"].append(old)
    fr, problems, v = _verdicts(_write(tmp_path / "comm_traces", raw))
    assert not problems and _v(fr, [1, 3]).startswith("dp group [1, 3]: rank 3 never entered all_reduce #6 (1 MiB)")
    assert any("point-to-point" in n for n in fr.notes)
    # where the cause went silent: its latest entry, a recv here (never matched, but shown)
    assert fr.cause == [3] and fr.cause_last[0].startswith("point-to-point recv #1 of dp group [1, 3], entered ")
    assert read_dump(str(tmp_path / "comm_traces" / "nccl_trace_rank_0")).entries[-1].p2p


def test_coalesced_collective_is_one_with_its_parts_sizes(tmp_path):
    """A coalesced DP all-reduce #6 (two parts and the closing 'nccl:coalesced', one seq id), which
    rank 3 never entered: one collective of the parts' summed size, as fr_trace counts it."""
    raw = _job()
    for r in (0, 1, 2):
        d = raw[r]
        dp = "3" if r % 2 == 0 else "4"
        d["entries"] = [e for e in d["entries"] if not (e["process_group"][0] == dp and e["collective_seq_id"] == 6)]
        d["entries"] += [_entry(dp, 6, r, 50, nelems=MIB, state="started"),
                         _entry(dp, 6, r, 51, nelems=MIB, state="started"),
                         _entry(dp, 6, r, 52, op="nccl:coalesced", state="started", input_sizes=[], output_sizes=[],
                                input_dtypes=[], output_dtypes=[])]
    fr, _, v = _verdicts(_write(tmp_path / "comm_traces", raw))
    assert _v(fr, [1, 3]).startswith("dp group [1, 3]: rank 3 never entered all_reduce #6 (4 MiB); rank 1 waits")
    e = [x for x in read_dump(str(tmp_path / "comm_traces" / "nccl_trace_rank_1")).entries if x.seq == 6 and x.pg == "4"]
    assert len(e) == 1 and e[0].coll == Coll.ALL_REDUCE and e[0].in_nelems == 2 * MIB and e[0].state == "started"


def test_empty_buffers_say_so(tmp_path):
    raw = {r: {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []} for r in range(2)}
    fr, problems = flight_record(str(_write(tmp_path / "comm_traces", raw)))
    assert not problems and fr.entries == 0 and "the dumps record no collective" in fr.notes
    assert fr.late_unknown and fr_lines(fr)


def test_a_missing_rank_is_said_not_guessed(tmp_path):
    """NCCL (members known): rank 3's dump absent: its groups list it as undumped, no verdict about it."""
    raw = _job()
    del raw[3]
    fr, problems, v = _verdicts(_write(tmp_path / "comm_traces", raw))
    assert not problems and fr.undumped == [3] and fr.world_known
    assert fr.cause == []            # rank 3's state is unknown: not named as the cause
    lines = fr_lines(fr)
    assert "missing dumps: no dump of rank 3 (world size 4): its state is unknown; the groups are judged without it" \
        in lines
    dp13 = next(g for g in fr.groups if g.ranks == [1, 3])
    assert dp13.undumped == [3] and not dp13.missing and dp13.verdict.endswith("no dump of rank 3: its state is unknown")


def test_an_empty_dump_beside_the_others_is_a_problem_and_its_rank_undumped(tmp_path):
    """A rank killed while dumping leaves an empty <prefix><rank>: reported, and its rank said missing;
    gloo (no pg_config) groups named from the dumps say the rank may be a member."""
    raw = _job()
    for d in raw.values():
        d.pop("pg_config")
    folder = _write(tmp_path / "dumps", raw)
    (folder / "nccl_trace_rank_1").write_bytes(b"")
    fr, problems, v = _verdicts(folder)
    assert [(p.file, p.problem.split(":")[0]) for p in problems] == [(str(folder / "nccl_trace_rank_1"), "empty file")]
    assert fr.undumped == [1] and not fr.world_known
    assert any("no dump of rank 1 (world size 4 at least)" in x for x in fr_lines(fr))
    dp13 = next(g for g in fr.groups if g.desc == "mesh_dp" and 3 in g.ranks)
    assert dp13.ranks == [3] or dp13.verdict.endswith("rank 1 has no dump and may be one")


def test_groups_with_no_axis_are_named_by_ranks(tmp_path):
    """Groups made with new_group() and no description ('undefined'): no axis is guessed."""
    raw = _job()
    for d in raw.values():
        d.pop("pg_config")
        for e in d["entries"]:
            e["process_group"] = [e["process_group"][0], "undefined"]
    fr, _, v = _verdicts(_write(tmp_path / "comm_traces", raw))
    assert {g.axis for g in fr.groups} == {"unknown"}
    assert _v(fr, [1, 3]).startswith("group [1, 3] (pg 4, axis unknown): rank 3 never entered all_reduce #6 (1 MiB)")
    assert {t.axis for t in fr.timings} == {"unknown"}


def _big(ranks=8, n=20_000, slow_rank=5):
    """8 ranks × 20k timed entries: dp4 × tp2, rank 5 entering 5 ms late from the middle on."""
    groups = {"1": ("mesh_tp", None), "2": ("mesh_dp", None)}
    dumps = []
    for r in range(ranks):
        tp = [r - r % 2, r - r % 2 + 1]
        dp = [r % 2 + 2 * j for j in range(ranks // 2)]
        d = FRDump(f"rank_{r}", r, "2.10", {f"tp{tp[0]}": ("mesh_tp", tp), f"dp{dp[0]}": ("mesh_dp", dp)})
        for k in range(n):
            name, members = (f"tp{tp[0]}", tp) if k % 2 else (f"dp{dp[0]}", dp)
            late = k > n // 2 and slow_rank in members
            d.entries.append(FREntry(pg=name, desc=groups["1" if k % 2 else "2"][0], seq=k // 2 + 1, p2p=False,
                                     op="nccl:all_reduce", coll=Coll.ALL_REDUCE, in_nelems=MIB, out_nelems=MIB,
                                     dtype_bytes=2, state="completed", created_ns=T0 + k * 10_000_000,
                                     completed_ns=None,
                                     duration_s=(1e-3 + (5e-3 if late and r != slow_rank else 0))))
        dumps.append(d)
    return dumps


def test_thousands_of_entries_per_rank_are_seconds_and_find_the_late_rank():
    dumps = _big()
    t = time.perf_counter()
    fr = analyse_dumps(dumps)
    took = time.perf_counter() - t
    assert took < 15, took                         # ~1.6 s on a shared 2-core machine (5 s before the caches)
    assert [x.rank for x in fr.late] == [5] and fr.late[0].until_ns is None
    mid = T0 + 10_000 * 10_000_000
    assert abs(fr.late[0].since_ns - mid) <= fr.late_window_s * 1e9
    dp = next(t for t in fr.timings if t.axis == "dp")
    assert dp.instances == 2 * 10_000 and dp.transfer_median_s == pytest.approx(1e-3)


def test_buckets_waited_for_together_count_once_in_the_late_rate():
    """DP over 2 ranks, no durations (gloo): in each 100 ms step rank 1 enters four gradient
    buckets' all-reduces at 0, 1, 2 and 3 ms, rank 0 at 80-83 ms. Rank 1 waits 80 ms in each,
    but for 83 ms of the step, not 320: 830 ms per s of run (the sum was 3,200, more than the
    one other rank's whole second)."""
    dumps = []
    for r in (0, 1):
        d = FRDump(f"rank_{r}", r, "2.10", {"dp0": ("mesh_dp", [0, 1])})
        for step in range(40):
            for b in range(4):
                created = T0 + step * 100_000_000 + (80 if r == 0 else 0) * 1_000_000 + b * 1_000_000
                d.entries.append(FREntry(pg="dp0", desc="mesh_dp", seq=4 * step + b + 1, p2p=False,
                                         op="gloo:all_reduce", coll=Coll.ALL_REDUCE, in_nelems=MIB,
                                         out_nelems=MIB, dtype_bytes=4, state="completed", created_ns=created,
                                         completed_ns=None, duration_s=None))
        dumps.append(d)
    fr = analyse_dumps(dumps)
    assert [x.rank for x in fr.late] == [0]
    assert 0.9 * 830 <= fr.late[0].waited_after_ms_per_s <= 1000


def test_torch_typed_lists_in_a_pickle_are_plain_lists_and_torch_is_not_imported(tmp_path):
    """torch's C++ pickler writes a c10::List<int64_t> as GLOBAL torch.jit._pickle build_intlist over
    a list: read as that list by diag's own builder; any other global is still refused."""
    import subprocess
    import sys
    import struct
    raw = _job()[0]
    raw["entries"][0]["input_sizes"] = [[987654321]]
    body = pickle.dumps(raw, protocol=2)
    marker = b"J" + struct.pack("<i", 987654321)                 # BININT
    i = body.index(marker)
    assert body[i - 3:i - 1] == b"]q" and body[i + 5:i + 6] == b"a"   # EMPTY_LIST BINPUT n ... APPEND
    typed = b"ctorch.jit._pickle\nbuild_intlist\n]" + marker + b"a\x85R"  # GLOBAL, the list, TUPLE1, REDUCE
    (tmp_path / "rank_0").write_bytes(body[:i - 3] + typed + body[i + 6:])
    code = ("import sys; from diag.trace.flightrec import read_dump; d = read_dump(sys.argv[1]); "
            "assert d.entries[0].in_nelems == 987654321, d.entries[0]; assert 'torch' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "rank_0")], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
    (tmp_path / "rank_1").write_bytes(body[:i - 3] + typed.replace(b"build_intlist", b"_rebuild_x") + body[i + 6:])
    from diag.trace.errors import TraceError
    with pytest.raises(TraceError, match="torch.jit._pickle._rebuild_x; only plain containers"):
        read_dump(str(tmp_path / "rank_1"))


def test_a_missing_rank_elsewhere_leaves_the_cause_named(tmp_path):
    """Rank 0's dump absent: rank 3 (dumped, waiting in nothing, its peers waiting for it) is still
    the cause; rank 0's own groups say their state is unknown."""
    raw = _job()
    del raw[0]
    fr, problems, v = _verdicts(_write(tmp_path / "comm_traces", raw))
    assert not problems and fr.undumped == [0] and fr.cause == [3]
    assert _v(fr, [1, 3]).startswith("dp group [1, 3]: rank 3 never entered all_reduce #6 (1 MiB); rank 1 waits")
    assert _v(fr, [0, 2]).endswith("no dump of rank 0: its state is unknown")


@pytest.mark.parametrize("change,words", [
    ({"input_sizes": [[MIB]], "output_sizes": [[MIB]]}, "rank 3 entered #8 as all_reduce (2 MiB), rank 1 as all_reduce (1 MiB)"),
    ({"profiling_name": "nccl:all_gather"}, "rank 3 entered #8 as all_gather (1 MiB), rank 1 as all_reduce (1 MiB)"),
])
def test_a_collective_entered_with_other_sizes_or_ops_is_named(tmp_path, change, words):
    """As fr_trace's size / op mismatch: every member of DP [1, 3] entered #8, rank 3 with another
    size or op (and so it never completes)."""
    raw = _job(skip=False)
    for r in (1, 3):
        for e in raw[r]["entries"]:
            if e["process_group"][0] == "4" and e["collective_seq_id"] == 8:
                e.update(state="started", time_discovered_completed_ns=None, **(change if r == 3 else {}))
    fr, _, v = _verdicts(_write(tmp_path / "comm_traces", raw))
    (g,) = fr.hangs
    assert g.mismatch_seq == 8 and v == [f"dp group [1, 3]: collective #8 entered with different ops or sizes: {words}"]


def test_two_dumps_of_a_rank_read_the_latest_with_a_note(tmp_path):
    """On NCCL the trainer's rank-<r>.json and the watchdog's pickle land in one folder: per rank the
    dump with the latest entry is read, the other set aside with a note, not a problem."""
    raw = _job()
    folder = _write(tmp_path / "flightrec", raw, "json")
    early = dict(raw[1], entries=raw[1]["entries"][:4])          # the same rank, dumped earlier
    (folder / "nccl_trace_rank_1").write_bytes(pickle.dumps(early))
    fr, problems, v = _verdicts(tmp_path)
    assert not problems and fr.cause == [3] and fr.ranks == [0, 1, 2, 3]
    assert f"rank 1 has 2 dumps: read {folder / 'rank_1.json'}, the latest; set aside {folder / 'nccl_trace_rank_1'}" \
        in fr.notes
    assert _v(fr, [1, 3]).startswith("dp group [1, 3]: rank 3 never entered all_reduce #6 (1 MiB); rank 1 waits")


def test_the_run_record_gives_the_world_a_gloo_dump_set_cannot(tmp_path):
    """gloo dumps name no members: with the highest rank's dump missing only the trainer's
    diag_run.json (world_size 4) tells that rank 3 is missing."""
    raw = _job()
    del raw[3]
    for d in raw.values():
        d.pop("pg_config")
    _write(tmp_path / "flightrec", raw, "json")
    fr, _ = flight_record(str(tmp_path))
    assert fr.world_size == 3 and not fr.world_known and fr.undumped == []
    (tmp_path / "diag_run.json").write_text(json.dumps({"schema_version": 2, "world_size": 4}))
    for where in (tmp_path, tmp_path / "flightrec"):
        fr, _ = flight_record(str(where))
        assert fr.world_size == 4 and fr.world_known and fr.undumped == [3], where
        assert "missing dumps: no dump of rank 3 (world size 4): its state is unknown; the groups are judged without it" \
            in fr_lines(fr)


def _gloo_tp2_dp2_without(tmp_path, rank: int):
    """gloo dumps (no pg_config) of the 4-rank job, `rank`'s missing, beside the run's diag_run.json
    (tp 2 x dp 2, world 4): flight_record's (record, problems)."""
    raw = _job()
    del raw[rank]
    for d in raw.values():
        d.pop("pg_config")
    (tmp_path / "diag_run.json").write_text(json.dumps({"schema_version": 2, "world_size": 4, "tp": 2, "dp": 2}))
    _write(tmp_path / "flightrec", raw, "json")
    return flight_record(str(tmp_path))


def test_gloo_dumps_without_the_cause_never_blame_its_peer(tmp_path):
    """gloo (no pg_config), rank 3 killed before it dumped: rank 2, stuck in TP with it, is not the
    cause; it may wait there, with rank 3 that left no dump (a member by the run's layout)."""
    # the run's sizes too (a world of 3 from the dumps does not divide by tp 2: no crash)
    fr, problems = _gloo_tp2_dp2_without(tmp_path, 3)
    assert not problems and fr.undumped == [3] and fr.cause == [] and fr.layout.startswith("dp2 × tp2")
    assert ": the others wait for" not in " ".join(fr_lines(fr))
    assert _v(fr, [0, 2]).startswith("dp group [0, 2]: rank 2 never entered all_reduce #6 (1 MiB); rank 0 waits")
    # the layout completes the TP group the gloo dumps name for rank 2 alone: rank 3 is its member
    (tp,) = [g for g in fr.groups if g.axis == "tp" and 2 in g.ranks]
    assert tp.ranks == [2, 3] and tp.undumped == [3]
    assert "rank 2 itself may wait in tp group [2, 3] all_reduce #6, with rank 3 that left no dump" in _v(fr, [0, 2])


def test_groups_with_no_description_are_named_by_the_runs_layout(tmp_path):
    """No description in the dumps, but the run's diag_run.json gives tp 2 × dp 2 (tp fastest): the
    groups are named by that layout, and the report says where it came from."""
    raw = _job()
    for d in raw.values():
        d.pop("pg_config")
        for e in d["entries"]:
            e["process_group"] = [e["process_group"][0], "undefined"]
    _write(tmp_path / "flightrec", raw, "json")
    (tmp_path / "diag_run.json").write_text(json.dumps({"schema_version": 2, "world_size": 4, "tp": 2, "dp": 2}))
    fr, _ = flight_record(str(tmp_path))
    assert fr.layout == "dp2 × tp2, from diag_run.json"
    assert _v(fr, [1, 3]).startswith("dp group [1, 3]: rank 3 never entered all_reduce #6 (1 MiB)")
    assert _v(fr, [2, 3]).startswith("tp group [2, 3]: rank 3 never entered all_reduce #6 (1 MiB)")


def test_html_report_opens_with_the_hang(tmp_path):
    """`diag analyze DUMPS --format html`: the Flight Recorder section first, its lines escaped, the
    timings table after them."""
    from diag.analysis.flightrec import dumps_only
    from diag.report.html import render_html
    folder = _write(tmp_path / "comm_traces", _job())
    fr, problems = flight_record(str(tmp_path))
    page = render_html(dumps_only(str(tmp_path), fr, problems))
    # torch's dumps say neither why nor when: a hang, the wait a lower bound (tests/test_flightrec.py)
    line = "hang: dp group [1, 3]: rank 3 never entered all_reduce #6 (1 MiB); rank 1 waits in it since "
    assert f"<p class='straggler'>{line}" in page and folder.exists()
    assert page.index("<h2 id='flightrec'>") < page.index("<h2 id='overview'>")
    assert "<th>busbw</th>" in page and "<td>dp:all_reduce</td>" in page


def test_a_cause_beside_a_rank_without_a_dump_says_so(tmp_path):
    """gloo, rank 1's dump missing: rank 3 is still the cause TP waits for, and the line says that it
    shares its DP group with rank 1, which left no dump (it may be what holds rank 3)."""
    fr, _ = _gloo_tp2_dp2_without(tmp_path, 1)
    assert fr.cause == [3] and fr.undumped == [1]
    assert fr.cause_last[0].startswith("all_reduce #5 of dp group [1, 3], entered ")
    assert fr.cause_last[0].endswith("; it shares dp group [1, 3] with rank 1, which left no dump")
    assert fr_lines(fr)[3].startswith("hang: no dump reason recorded (torch's watchdog dumps on a timeout")
    assert fr_lines(fr)[4].startswith("hang: the others wait for rank 3, which waits in no collective (latest entry: ")


@pytest.mark.parametrize("cut,problem", [
    (lambda b: b[:len(b) // 2], "pickle refused: pickle data was truncated"),
    (lambda b: pickle.dumps([1, 2], protocol=2), "not a Flight Recorder dump: no 'entries' list at the top"),
    (lambda b: b"\x80\x02cbuiltins\neval\n(X\x07\x00\x00\x00print(1)tR.",
     "pickle refused: it names builtins.eval; only plain containers are accepted"),
])
def test_a_bad_pickle_beside_good_ones_is_one_problem(tmp_path, cut, problem):
    folder = _write(tmp_path / "comm_traces", _job())
    bad = folder / "nccl_trace_rank_2"
    bad.write_bytes(cut(bad.read_bytes()))
    fr, problems = flight_record(str(tmp_path))
    assert [(p.file, p.problem) for p in problems] == [(str(bad), problem)]
    assert fr.ranks == [0, 1, 3] and fr.undumped == [2]


def _undescribed(tmp_path):
    raw = _job()
    for d in raw.values():
        d.pop("pg_config")
        for e in d["entries"]:
            e["process_group"] = [e["process_group"][0], "undefined"]
    return _write(tmp_path / "dumps", raw, "json")


def test_a_foreign_dump_set_is_named_by_the_layout_given_on_the_command_line(tmp_path):
    """No description, no diag_run.json: `--tp 2` (Megatron rank order, tp fastest) names the groups
    tp/dp, through the same layout resolution as the traces', and the report says so."""
    import os
    import subprocess
    import sys

    folder = _undescribed(tmp_path)
    fr, _ = flight_record(str(folder), sizes={"tp": 2})
    assert fr.layout == "dp2 × tp2, from --tp (Megatron rank order)"
    assert _v(fr, [1, 3]).startswith("dp group [1, 3]: rank 3 never entered all_reduce #6 (1 MiB)")
    assert _v(fr, [2, 3]).startswith("tp group [2, 3]: rank 3 never entered all_reduce #6 (1 MiB)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for flags in (["--tp", "2"], ["--config", str(_megatron_args(tmp_path))]):
        out = subprocess.run([sys.executable, "-m", "diag.cli", "analyze", str(folder), *flags], capture_output=True,
                             text=True, cwd=root, env={**os.environ, "PYTHONPATH": root})
        assert "Groups named by: dp2 × tp2, from " in out.stdout, out
        assert "dp group [1, 3]: rank 3 never entered all_reduce #6" in out.stdout, out.stdout
    bare, _ = flight_record(str(folder))           # nothing given: named by ranks, never a guessed axis
    assert _v(bare, [1, 3]).startswith("group [1, 3] (pg 4, axis unknown)")


def _megatron_args(tmp_path):
    p = tmp_path / "args.sh"
    p.write_text("torchrun --nproc-per-node 4 pretrain_gpt.py --tensor-model-parallel-size 2 "
                 "--pipeline-model-parallel-size 1 --num-layers 2 --hidden-size 64 --num-attention-heads 4\n")
    return p


def _taken(raw: dict, why, at_ns, ranks=None) -> dict:
    for r, d in raw.items():
        if ranks is None or r in ranks:
            d["diag_dump"] = {"reason": why, "time_ns": at_ns, "buffer_size": 2000, "buffer_size_from": "default"}
    return raw


CLOCK = time.strftime("%H:%M:%S", time.gmtime((T0 + 2_000_000_000) / 1e9))


def test_dumps_taken_on_request_with_short_waits_are_a_snapshot_not_a_hang(tmp_path):
    """The trainer's SIGUSR1 dumps, 2 s after rank 1 entered DP #6 (timeout 600 s): ranks in flight."""
    fr, _ = flight_record(str(_write(tmp_path / "comm_traces", _taken(_job(), "SIGUSR1", T0 + 2_000_000_000), "json")))
    lines = fr_lines(fr)
    assert fr.verdict_kind == "snapshot" and fr.taken == f"SIGUSR1 at {CLOCK} UTC"
    assert lines[2].startswith(f"snapshot (SIGUSR1 at {CLOCK} UTC): in flight, not a hang yet: ranks mid-collective "
                               "when the dumps were taken; the longest wait 1.9 s, under the process group timeout 600.0 s")
    assert "in flight: dp group [1, 3]: rank 3 never entered all_reduce #6 (1 MiB); rank 1 waits in it since " \
        in " | ".join(lines)
    assert not any(line.startswith("hang") for line in lines), lines


@pytest.mark.parametrize("why,at_s", [("SIGUSR1", 700), ("end", 700), ("failure", 2), ("SIGTERM", 2)])
def test_a_wait_past_the_timeout_or_a_failure_dump_is_still_a_hang(tmp_path, why, at_s):
    fr, _ = flight_record(str(_write(tmp_path / "comm_traces", _taken(_job(), why, T0 + at_s * 1_000_000_000), "json")))
    lines = fr_lines(fr)
    assert fr.verdict_kind == "hang" and lines[2].startswith(f"hang: dumps taken {why} at "), lines
    assert any(line.startswith("hang: dp group [1, 3]: rank 3 never entered all_reduce #6") for line in lines)


def test_foreign_dumps_without_a_timeout_say_the_wait_and_keep_the_hang(tmp_path):
    raw = _job()
    for d in raw.values():
        for e in d["entries"]:
            e.pop("timeout_ms")
    fr, _ = flight_record(str(_write(tmp_path / "comm_traces", raw)))
    lines = fr_lines(fr)
    assert fr.verdict_kind == "hang" and fr.taken is None
    assert lines[2].startswith("hang: no dump reason recorded (torch's watchdog dumps on a timeout; a dump taken on "
                               "request can catch ranks mid-collective); the longest wait at least 0.0 s (to the buffers' last "
                               "entry: no dump time recorded), no timeout recorded"), lines


def test_a_healthy_snapshot_says_when_it_was_taken(tmp_path):
    fr, _ = flight_record(str(_write(tmp_path / "comm_traces", _taken(_job(skip=False), "end", T0 + 2_000_000_000),
                                     "json")))
    assert fr_lines(fr)[2] == ("no hang: in every group, every dumped member entered the same last collective "
                               f"(dumps taken end at {CLOCK} UTC)")


def test_dumps_without_names_take_the_traces_layout(tmp_path):
    """Traces beside the dumps name the groups (their pg_config): the dumps' groups, undescribed, are
    named by that same layout (what open_run hands over), not guessed."""
    from diag.analysis.layoutfind import find_layout

    configs = [[[g, d, m] for g, (d, m) in GROUPS.items() if r in m] for r in range(4)]
    grid = find_layout(configs, 4)
    fr, _ = flight_record(str(_undescribed(tmp_path)), job_grid=grid)
    assert fr.layout == "dp2 × tp2, from process-group names (the traces' layout)"
    assert _v(fr, [1, 3]).startswith("dp group [1, 3]: rank 3 never entered all_reduce #6 (1 MiB)")
