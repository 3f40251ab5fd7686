"""Point-to-point entries matched between peers (#21): a pipeline hang is a send with no matching
recv. Hand-made NCCL dumps as PyTorch writes them (profiling name `nccl:send 0->1` in group
ranks, is_p2p, p2p_seq_id): 2 ranks, a pipeline group [0, 1]; rank 0 sends 12 activations of
2 MiB to rank 1, which posts only 11 recvs."""
import json

from diag.analysis.flightrec import flight_record
from diag.report.frfmt import fr_lines

T0 = 1_790_000_000_000_000_000
MIB = 1 << 20
GROUPS = {"0": ("default_pg", [0, 1]), "1": ("mesh_pp", [0, 1])}


def _e(pg, k, rank, op, p2p_seq=0, seq=0, state="completed", nelems=MIB):
    p2p = " " in op
    return {"record_id": k, "pg_id": int(pg), "process_group": [pg, GROUPS[pg][0]], "collective_seq_id": seq,
            "p2p_seq_id": p2p_seq, "op_id": k, "profiling_name": op, "time_created_ns": T0 + k * 10_000_000 + rank,
            "input_sizes": [[nelems]], "input_dtypes": ["BFloat16"], "output_sizes": [[nelems]],
            "output_dtypes": ["BFloat16"], "state": state, "time_discovered_started_ns": T0 + k * 10_000_000 + 5,
            "time_discovered_completed_ns": T0 + k * 10_000_000 + 900 if state == "completed" else 0,
            "duration_ms": 0.5 if state == "completed" else None, "retired": state == "completed",
            "timeout_ms": 600000, "is_p2p": p2p, "frames": []}


def _write(folder, then_all_reduce: bool):
    """Rank 0: sends #1..#12, the last never completed. Rank 1: recvs #1..#11; then (optionally) the
    world's all-reduce #1, which rank 0, stuck in its send, never enters."""
    folder.mkdir()
    ents = {0: [], 1: []}
    for i in range(1, 13):
        last = i == 12
        ents[0].append(_e("1", 2 * i, 0, "nccl:send 0->1", p2p_seq=i, state="started" if last else "completed"))
        if not last:
            ents[1].append(_e("1", 2 * i + 1, 1, "nccl:recv 1<-0", p2p_seq=i))
    if then_all_reduce:
        ents[1].append(_e("0", 30, 1, "nccl:all_reduce", seq=1, state="started", nelems=4))
    for r, es in ents.items():
        raw = {"version": "2.10", "pg_config": {g: {"name": g, "desc": d, "ranks": str(m)} for g, (d, m) in GROUPS.items()},
               "pg_status": {}, "entries": es,       # the trainer's dump on a failure (a timeout raised)
               "diag_dump": {"reason": "failure", "time_ns": T0 + 60_000_000_000}}
        (folder / f"rank_{r}.json").write_text(json.dumps(raw))
    return folder


def test_a_send_with_no_matching_recv_names_the_rank_that_never_posted_it(tmp_path):
    fr, problems = flight_record(str(_write(tmp_path / "comm_traces", False)))
    assert not problems and fr.cause == [1]
    (x,) = fr.p2p
    assert (x.src, x.dst, x.posted, x.absent, x.op, x.seq, x.bytes, x.matched) == (0, 1, 0, 1, "send", 12, 2 * MIB, 11)
    assert x.verdict.startswith("pp group [0, 1]: rank 1 never entered the recv matching rank 0's send #12 (2 MiB; "
                                "11 earlier transfers rank 0 -> rank 1 matched); rank 0 waits in it since ")
    lines = fr_lines(fr)
    assert any(line.startswith("hang: the others wait for rank 1, which waits in no collective") for line in lines), lines
    assert any(line.startswith("hang: pp group [0, 1]: rank 1 never entered the recv matching rank 0's send #12")
               for line in lines), lines
    assert not any("not matched" in n for n in fr.notes)


def test_a_peer_stuck_elsewhere_is_named_as_waiting_there(tmp_path):
    """Rank 1 waits in the world's all-reduce #1 which rank 0, stuck in its send, never entered: a
    cycle, nobody waits in nothing, and each line says where the other side waits."""
    fr, _ = flight_record(str(_write(tmp_path / "comm_traces", True)))
    (x,) = fr.p2p
    assert x.blocked and x.verdict.endswith("; rank 1 itself waits in world group [0, 1] all_reduce #1")
    (g,) = [g for g in fr.groups if g.axis == "world"]
    assert g.missing == [0] and g.verdict.endswith("; rank 0 itself waits in its send #12 (rank 0 to rank 1)")
    assert fr.cause == []


def test_a_recv_with_no_matching_send_names_the_sender(tmp_path):
    """The other way round: rank 1 posted recv #12, rank 0 sent only 11 and waits in nothing."""
    folder = _write(tmp_path / "comm_traces", False)
    r0, r1 = (json.loads((folder / f"rank_{r}.json").read_text()) for r in (0, 1))
    r0["entries"], r1["entries"] = r0["entries"][:11], r1["entries"] + [
        _e("1", 40, 1, "nccl:recv 1<-0", p2p_seq=12, state="started")]
    for r, raw in ((0, r0), (1, r1)):
        (folder / f"rank_{r}.json").write_text(json.dumps(raw))
    fr, _ = flight_record(str(folder))
    (x,) = fr.p2p
    assert (x.posted, x.absent, x.op, x.seq) == (1, 0, "recv", 12) and fr.cause == [0]
    assert x.verdict.startswith("pp group [0, 1]: rank 0 never entered the send matching rank 1's recv #12 (2 MiB; "
                                "11 earlier transfers rank 0 -> rank 1 matched); rank 1 waits in it since ")


def test_a_batch_of_sends_and_recvs_is_matched_op_by_op(tmp_path):
    """batch_isend_irecv (Megatron's pipeline exchange): a send and a recv sharing one p2p_seq_id and
    a closing `nccl:coalesced`, on each side. Rank 1's last batch holds only its send: its recv from
    rank 0 of that batch is never posted, and rank 0's send waits."""
    folder = tmp_path / "comm_traces"
    folder.mkdir()
    ents = {0: [], 1: []}
    k = 0
    for i in range(1, 4):
        for r in (0, 1):
            peer = 1 - r
            ops = [f"nccl:send {r}->{peer}", f"nccl:recv {r}<-{peer}"]
            if i == 3 and r == 1:
                ops = ops[:1]
            last = i == 3
            for op in ops + ["nccl:coalesced"]:
                k += 1
                ents[r].append(_e("1", k, r, op, p2p_seq=i, state="started" if last else "completed"))
                ents[r][-1]["is_p2p"] = True
    for r, es in ents.items():
        raw = {"version": "2.10", "pg_config": {g: {"name": g, "desc": d, "ranks": str(m)} for g, (d, m) in GROUPS.items()},
               "pg_status": {}, "entries": es}
        (folder / f"rank_{r}.json").write_text(json.dumps(raw))
    fr, _ = flight_record(str(folder))
    (x,) = fr.p2p
    assert (x.src, x.dst, x.posted, x.absent, x.op, x.seq, x.matched) == (0, 1, 0, 1, "send", 3, 2)
    assert not any("not matched" in n for n in fr.notes), fr.notes


def test_nccl_batch_closers_recorded_as_collectives_stay_with_their_batch():
    """The H200 sample's dumps (sample_traces/h200_tp2_pp2_dp2; torch 2.11, NCCL 2.28): each batch
    of the pipeline's sends and recvs is closed by a `nccl:coalesced` entry that is *not* marked
    p2p and has collective_seq_id 0; the parts stay `scheduled`, only the closer completes. Matched
    as collectives, the closers made a 'pp:coalesced' row of every batch paired by that 0. Truth
    from the raw dumps: every pp closer completed, so every part did."""
    import os
    from conftest import ROOT
    from diag.trace.flightrec import read_dump

    folder = os.path.join(ROOT, "sample_traces", "h200_tp2_pp2_dp2", "flightrec")
    raw = json.load(open(os.path.join(folder, "rank-0.json")))["entries"]
    closers = [e for e in raw if e["profiling_name"] == "nccl:coalesced" and e["process_group"][1] == "mesh_pp"]
    assert closers and not any(e["is_p2p"] for e in closers)       # the case under test
    assert all(e["state"] == "completed" for e in closers)
    assert any(e["is_p2p"] and e["state"] == "scheduled" for e in raw)
    parts = [e for e in read_dump(os.path.join(folder, "rank-0.json")).entries
             if e.p2p and not e.op.endswith("coalesced")]
    assert len(parts) == sum(e["is_p2p"] for e in raw) and all(e.state == "completed" for e in parts)
    fr, problems = flight_record(folder)
    assert not problems and not fr.p2p and not fr.hangs
    assert [t for t in fr.timings if "coalesced" in t.op] == []
    assert {t.axis for t in fr.timings} >= {"tp", "dp"}
