"""Stragglers as sets, against the truth of synthesised jobs; and saying "cannot tell".

diag.advise.simulate holds chosen ranks back at the start of chosen steps (`rank_delay`, a
sequence for ranks taking turns) and diag.advise.synth writes the job as Kineto traces, so who
is late, and by how much, is known. The analyser must name exactly that set, the "Where the
time goes" table must price the others' wait, and the straggler rule must fire: a report that
leads with waiting for ranks never ends in "nothing worth changing".

Hand-worked wait: a late rank holds its group's first collective of the step back by DELAY;
after it the group runs in step. So a rank outside the late set waits DELAY per step, once, in
every analysed step (the analysis drops the last step: STEPS - 1 are analysed).
"""
import gzip
import json
import os

import pytest
from click.testing import CliRunner

from diag.advise import Config, Links, Workload, simulate
from diag.advise.recommend import advise
from diag.advise.synth import write_job
from diag.analysis import diagnose
from diag.advise.recommend import with_advice
from diag.analysis.results import FindingKind, StragglerBasis, StragglerKind
from diag.analysis.stragglers import smallest_set
from diag.cli import main
from diag.report.fmt import op_rows
from diag.report.html import render_html
from diag.report.markdown import render_markdown
from diag.trace import load_job

MS = 1e-3
DELAY = 0.4 * MS               # 20x the 20 us under which a wait is noise (stragglers.MIN_DELAY_NS)
WAIT_TOL = 1e-8                # trace times are whole ns: a few ns off per analysed step
W = Workload(num_layers=4, fwd_s_per_layer=1 * MS, tp_bytes_per_layer=4e6, grad_bytes=4e8)
NOTHING = "nothing worth changing"


def run(tmp_path, config, links, steps, delay, hosts=None, header_hosts=None):
    """Simulate, write and analyse a job; hosts {rank: name} renames each rank's file as Kineto
    names it on that host (`<host>_<pid>.<ns>.pt.trace.json`); header_hosts {rank: name} writes it
    in the trace's header instead (`host_name`, as Kineto does since 2024), the file names kept."""
    write_job(simulate(W, config, links, steps=steps, rank_delay=delay), str(tmp_path), config, W)
    for rank, host in (hosts or {}).items():
        os.rename(tmp_path / f"rank-{rank}.pt.trace.json.gz",
                  tmp_path / f"{host}_{4000 + rank}.1698955063520869240.pt.trace.json.gz")
    for rank, host in (header_hosts or {}).items():
        path = tmp_path / f"rank-{rank}.pt.trace.json.gz"
        with gzip.open(path, "rt") as f:
            trace = json.load(f)
        trace["host_name"] = host
        with gzip.open(path, "wt") as f:
            json.dump(trace, f)
    return with_advice(diagnose(load_job(str(tmp_path))))


def collective_straggler(d):
    found = [s for s in d.comm.stragglers if s.basis == StragglerBasis.COLLECTIVES]
    assert len(found) == 1, d.comm.stragglers
    return found[0]


def wait_finding(d, ranks):
    found = [f for f in d.findings if f.kind == FindingKind.STRAGGLER]
    assert [f.ranks for f in found] == [ranks]
    return found[0]


def analyze_text(path) -> str:
    r = CliRunner().invoke(main, ["analyze", str(path)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def assert_every_report_says(d, line: str) -> None:
    """Markdown and HTML carry the same straggler line as the terminal report."""
    assert f"- {line}" in render_markdown(d)
    assert f"<p class='straggler'>{line}" in render_html(d)


def assert_rule_fires(d, who: str, per_step: float):
    """The straggler recommendation names the set, with the others' wait as its evidence."""
    recs = [r for r in d.recommendations if r.rule == "straggler"]
    assert len(recs) == 1
    assert recs[0].title == f"find out why {who} {'is' if who.startswith('rank ') else 'are'} late"
    assert recs[0].evidence[0].metric == f"others' wait for {who}"
    assert recs[0].evidence[0].value == pytest.approx(per_step / MS, abs=WAIT_TOL / MS)


def turns_job(tmp_path):
    """TP=8 (one node's all-reduces): rank 3 late in even steps, rank 6 in odd ones; 9 steps, 8
    analysed, so each is last in 4 and neither in 60% of the waits (the old rule's threshold)."""
    steps = 9
    d = run(tmp_path, Config(tp=8, num_micro_batches=2), Links(tp=200e9), steps,
            {3: [DELAY, 0.0], 6: [0.0, DELAY]})
    return d, steps - 1


def test_two_ranks_taking_turns_are_named_together(tmp_path):
    d, analysed = turns_job(tmp_path)
    s = collective_straggler(d)
    assert (s.ranks, s.kind, s.who) == ([3, 6], StragglerKind.TURNS, "ranks 3 and 6")
    assert "rank 3: 4, rank 6: 4" in s.evidence                # half of the 8 analysed steps each
    f = wait_finding(d, [3, 6])
    assert f.what == "waiting for ranks 3 and 6"
    assert f.seconds_per_step == pytest.approx(DELAY, abs=WAIT_TOL)   # the 6 others wait DELAY a step
    assert_rule_fires(d, "ranks 3 and 6", DELAY)
    out = analyze_text(tmp_path)
    assert "straggler: ranks 3 and 6 take turns arriving last" in " ".join(out.split())
    assert NOTHING not in out.lower()
    assert_every_report_says(d, "straggler: ranks 3 and 6 take turns arriving last at collectives: between them")
    # the others' wait in the rank table, whole window: DELAY in each analysed step
    waits = {r.rank: r.wait_s for r in d.comm.ranks}
    for r in (0, 1, 2, 4, 5, 7):
        assert waits[r] == pytest.approx(analysed * DELAY, abs=analysed * WAIT_TOL)
    for r in (3, 6):                                              # waits for the other, half the steps
        assert waits[r] == pytest.approx(analysed / 2 * DELAY, abs=analysed * WAIT_TOL)


def node_job(tmp_path, hosts=None, header_hosts=None):
    """TP=8 x DP=2: ranks 8-15 (the second TP group, one node's GPUs) late by DELAY every step.
    Within their TP group they are late together (nobody waits); each DP all-reduce pairs rank r
    with r+8, so each of 8-15 is last once a step, in its own group: 1/8 of the waits each."""
    return run(tmp_path, Config(tp=8, dp=2, num_micro_batches=2, bucket_bytes=1e8),
               Links(tp=200e9, dp=50e9), 5, {r: DELAY for r in range(8, 16)}, hosts, header_hosts)


def test_a_slow_node_without_host_names_is_a_contiguous_block(tmp_path):
    d = node_job(tmp_path)
    s = collective_straggler(d)
    assert (s.ranks, s.kind, s.node) == (list(range(8, 16)), StragglerKind.BLOCK, None)
    assert s.who == "ranks 8-15 (one node?)" and "do not say which host" in s.reason
    assert wait_finding(d, s.ranks).seconds_per_step == pytest.approx(DELAY, abs=WAIT_TOL)
    assert_rule_fires(d, s.who, DELAY)
    out = analyze_text(tmp_path)
    assert "straggler: ranks 8-15 (one node?)" in " ".join(out.split()) and NOTHING not in out.lower()


def test_a_slow_node_is_named_by_its_host(tmp_path):
    hosts = {r: "node-a" if r < 8 else "node-b" for r in range(16)}
    d = node_job(tmp_path, hosts)
    s = collective_straggler(d)
    assert (s.ranks, s.kind, s.node) == (list(range(8, 16)), StragglerKind.NODE, "node-b")
    assert s.who == "ranks 8-15 (node node-b)"
    rec = next(r for r in d.recommendations if r.rule == "straggler")
    assert any(c.startswith("node node-b:") for c in rec.checks)


def test_a_slow_node_is_named_by_the_host_in_its_traces_headers(tmp_path):
    """Files named rank-N (torchtitan's, our trainer's): the host comes from each trace's header."""
    d = node_job(tmp_path, header_hosts={r: "node-a" if r < 8 else "node-b" for r in range(16)})
    s = collective_straggler(d)
    assert (s.ranks, s.kind, s.node, s.who) == (list(range(8, 16)), StragglerKind.NODE, "node-b",
                                                "ranks 8-15 (node node-b)")
    assert "hosts from the traces' headers or file names" in s.reason


@pytest.mark.parametrize("host,kind", [("node-a", StragglerKind.TURNS), ("localhost", StragglerKind.BLOCK)])
def test_late_ranks_of_one_named_host_are_no_slow_node(tmp_path, host, kind):
    """Every header names the same host: the late block is not a node (the traces say there is one),
    so no "one node?" guess; `localhost` names no one machine (containers on several may all be
    called so), so the block stays a guess."""
    d = node_job(tmp_path, header_hosts={r: host for r in range(16)})
    s = collective_straggler(d)
    assert (s.ranks, s.kind, s.node) == (list(range(8, 16)), kind, None)
    if kind == StragglerKind.TURNS:
        assert s.who == "ranks 8-15" and s.reason.endswith("(on node-a)")
    else:
        assert s.who == "ranks 8-15 (one node?)"


@pytest.mark.parametrize("tp,dp,late", [(1, 4, 2), (2, 1, 0)])
def test_a_single_late_rank_is_still_one_rank(tmp_path, tp, dp, late):
    """Late by 10 x DELAY: over the rule's 5% of the step (24 ms of compute and more)."""
    d = run(tmp_path, Config(tp=tp, dp=dp, num_micro_batches=2, bucket_bytes=1e8), Links(tp=200e9, dp=50e9),
            5, {late: 10 * DELAY})
    s = collective_straggler(d)
    assert (s.rank, s.ranks, s.kind, s.who) == (late, [late], StragglerKind.RANK, f"rank {late}")
    assert s.reason == "arrives last at collectives"
    assert wait_finding(d, [late]).what == f"waiting for rank {late}"
    assert_rule_fires(d, f"rank {late}", 10 * DELAY)


def test_the_wait_passed_on_to_another_group_is_the_late_ranks(tmp_path):
    """TP=2 x DP=2, rank 1 late by DELAY every step: in TP rank 0 waits for it; in DP rank 3
    waits for it, and rank 2 waits for rank 0, which is late only for having waited for rank 1
    (it passed the delay on). Each of ranks 0, 2 and 3 waits DELAY a step, all of it rank 1's."""
    d = run(tmp_path, Config(tp=2, dp=2, num_micro_batches=2, bucket_bytes=1e8), Links(tp=200e9, dp=50e9),
            5, {1: DELAY})
    s = collective_straggler(d)
    assert s.ranks == [1]
    assert wait_finding(d, [1]).seconds_per_step == pytest.approx(DELAY, abs=WAIT_TOL)
    assert s.others_wait_s == pytest.approx(4 * DELAY, abs=4 * WAIT_TOL)        # 4 analysed steps


def test_a_late_stage_holds_up_the_next_stage_at_its_receives(tmp_path):
    """TP=2 x PP=2, rank 1 (stage 0) late by DELAY every step: its TP peer waits DELAY in TP, and
    stage 1 receives its first micro-batch DELAY late, so every other rank loses DELAY a step.
    Counted: rank 0's TP wait and rank 3's receive from rank 1 (a late rank's own send, up to
    its delay at collectives); rank 2's receive from rank 0 is not (its wait also holds the
    pipeline's fill, so rank 0 is not seen passing a delay on): 2/3 of DELAY, where the TP
    wait alone was 1/3. Never more than the delay: a chained wait counts up to the root's."""
    d = run(tmp_path, Config(tp=2, pp=2, num_micro_batches=2), Links(tp=200e9, pp=50e9), 5, {1: DELAY})
    s = collective_straggler(d)
    assert s.ranks == [1]
    per_step = wait_finding(d, [1]).seconds_per_step
    assert DELAY / 3 + WAIT_TOL < per_step <= DELAY + WAIT_TOL
    assert per_step == pytest.approx(2 / 3 * DELAY, abs=WAIT_TOL)


def test_waiting_for_another_late_rank_is_not_the_stragglers(tmp_path):
    """TP=2 x DP=2: rank 1 late by 10 x DELAY and rank 2 by DELAY, every step. In TP rank 0
    waits 10 DELAY for rank 1 and rank 3 DELAY for rank 2; in DP rank 2 waits 9 DELAY for rank 0
    (passed on from rank 1) and rank 3 9 DELAY for rank 1. The straggler is rank 1, and what the
    others lost waiting for it is (10 + 9 + 9) / 3 DELAY a step: rank 3's DELAY in TP was rank
    2's. (The mean of the others' whole wait, what the report used to show, is 29 / 3.) The
    finding and the straggler line carry the same figure."""
    d = run(tmp_path, Config(tp=2, dp=2, num_micro_batches=2, bucket_bytes=1e8), Links(tp=200e9, dp=50e9),
            5, {1: 10 * DELAY, 2: DELAY})
    s = collective_straggler(d)
    assert s.ranks == [1]
    f = wait_finding(d, [1])
    assert f.seconds_per_step == pytest.approx(28 / 3 * DELAY, abs=WAIT_TOL)
    assert f"the other ranks waited {s.others_wait_s * 1e3:,.2f} ms each for it, " \
           f"{f.seconds_per_step * 1e3:,.2f} ms per step" in s.evidence
    assert_rule_fires(d, "rank 1", 28 / 3 * DELAY)


def test_the_rule_fires_when_waiting_is_the_top_loss_even_under_its_threshold(tmp_path):
    """A wait of 1% of the step is under STRAGGLER_MIN (5%), but when it is the biggest loss the
    report leads with it, so the advice must say who to look at, not "nothing worth changing"."""
    d = run(tmp_path, Config(dp=4, num_micro_batches=2, bucket_bytes=1e8), Links(dp=50e9), 5, {2: DELAY})
    wait = wait_finding(d, [2])
    d.findings = [wait]
    d.throughput.step_time_s = 100 * wait.seconds_per_step
    advice = advise(d)
    assert advice.nothing is None
    assert [r.rule for r in advice.recommendations if r.rule == "straggler"] == ["straggler"]


# --- nothing matched: cannot tell, and the wait is unknown, not 0 -----------------------------
GROUP_ARGS = ("Process Group Name", "Process Group Description", "Process Group Ranks", "Group size")


def old_nccl_trace(path, drop_first_comm: bool) -> None:
    """Rewrite a synthesised trace as an old NCCL trace: no group args on the kernels, no
    pg_config, no diag:comm labels; drop_first_comm removes one collective, so the ranks'
    sequences differ and nothing can be matched by order either."""
    with open(path) as f:
        doc = json.load(f)
    doc["distributedInfo"].pop("pg_config")
    events = [e for e in doc["traceEvents"] if not e["name"].startswith("diag:comm:")]
    comm = [i for i, e in enumerate(events) if e["name"].startswith("ncclDevKernel")]
    if drop_first_comm:
        del events[comm[0]]
    for e in events:
        for k in GROUP_ARGS:
            e["args"].pop(k, None)
    doc["traceEvents"] = events
    with open(path, "w") as f:
        json.dump(doc, f)


def test_nothing_matched_cannot_tell_and_wait_is_unknown(tmp_path):
    c = Config(dp=2, num_micro_batches=2, bucket_bytes=1e8)
    write_job(simulate(W, c, Links(dp=50e9), steps=4, rank_delay={1: DELAY}), str(tmp_path), c, W, gz=False)
    os.remove(tmp_path / "diag_run.json")
    for rank in (0, 1):
        old_nccl_trace(tmp_path / f"rank-{rank}.pt.trace.json", drop_first_comm=rank == 1)
    d = with_advice(diagnose(load_job(str(tmp_path))))
    assert d.comm.stragglers_unknown == "no collective could be matched across ranks"
    assert not [s for s in d.comm.stragglers if s.basis == StragglerBasis.COLLECTIVES]
    assert all(o.wait_s is None for o in d.comm.ops) and all(r.wait_s is None for r in d.comm.ranks)
    assert all(row[5] == "-" for row in op_rows(d))               # the wait column: unknown, not 0.00
    out = analyze_text(tmp_path)
    assert "stragglers: cannot tell (no collective could be matched across ranks)" in out
    assert_every_report_says(d, "stragglers: cannot tell (no collective could be matched across ranks)")


def test_matched_by_order_when_only_the_group_args_are_missing(tmp_path):
    """The same old-format job with every collective present: matched across all ranks by order
    (the inferred group), so rank 1 is named and the group size comes from the match (n = 2)."""
    c = Config(dp=2, num_micro_batches=2, bucket_bytes=1e8)
    write_job(simulate(W, c, Links(dp=50e9), steps=5, rank_delay={1: DELAY}), str(tmp_path), c, W, gz=False)
    os.remove(tmp_path / "diag_run.json")
    for rank in (0, 1):
        old_nccl_trace(tmp_path / f"rank-{rank}.pt.trace.json", drop_first_comm=False)
    d = with_advice(diagnose(load_job(str(tmp_path))))
    assert d.comm.stragglers_unknown is None
    assert collective_straggler(d).ranks == [1]
    assert [o.group_size for o in d.comm.ops] == [2] * len(d.comm.ops)
    assert all(o.busbw_basis == "transfer" for o in d.comm.ops)


# --- the set rule on hand-made tallies (stragglers.smallest_set) ----------------------------
@pytest.mark.parametrize("caused,n_ranks,want", [
    ({2: 8.0}, 4, [2]),                                          # one rank, every wait
    ({2: 6.0, 0: 1.0, 1: 1.0}, 4, [2]),                          # 75% alone: one rank, as before
    ({3: 4.0, 6: 4.0}, 8, [3, 6]),                               # two taking turns
    ({r: 4.0 for r in range(8, 16)} | {0: 0.5}, 16, list(range(8, 16))),   # a node, a little noise
    # the CPU sample tp2_pp2_dp2 (2 cores, 8 processes): the waits spread over six ranks, 30% to 4%
    ({1: 30.4, 4: 24.0, 5: 17.7, 0: 14.0, 2: 10.1, 6: 3.9}, 8, []),
    ({r: 1.0 for r in range(5)}, 8, []),                         # 5 of 8 equal: more than half the ranks
])
def test_smallest_set(caused, n_ranks, want):
    count = {r: 4 for r in caused}                               # MIN_EVENTS (3) met by every rank
    assert smallest_set(count, caused, n_ranks) == want
