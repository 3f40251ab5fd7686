"""The Streamlit dashboard page by page (Streamlit's AppTest), and its guard around the root.

Each page runs on a copy of the sample runs; what it shows must be the Diagnosis's own
numbers. Paths given through ?run=, the picker, symlinks and uploads must never reach a
file outside the root.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys

import pytest
from click.testing import CliRunner
from streamlit.proto.Common_pb2 import FileURLs
from streamlit.runtime.uploaded_file_manager import UploadedFile, UploadedFileRec
from dashapp import app, metrics
from test_straggler_sets import turns_job

from diag.analysis import diagnose
from diag.advise.recommend import with_advice
from diag.analysis.collect import summarize_file
from diag.cli import main
from diag.commands.dashboard import resolve_root, streamlit_argv
from diag.trace import load_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLES = os.path.join(ROOT, "sample_traces")
sys.path.insert(0, os.path.join(ROOT, "dashboards"))
from diag_runs import clean_name, list_runs, safe_path, save_uploads  # noqa: E402
from ui import md  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """runs/{tp2_pp2_dp2,pp2_m2}, a folder outside the root with a trace, and symlinks to it."""
    base = tmp_path_factory.mktemp("dash")
    r = base / "runs"
    for name in ("tp2_pp2_dp2", "pp2_m2"):
        shutil.copytree(os.path.join(SAMPLES, name), r / name)
    outside = base / "secret"
    shutil.copytree(os.path.join(SAMPLES, "pp2_m2"), outside)
    (r / "link_out").symlink_to(outside, target_is_directory=True)
    (r / "mixed").mkdir()
    shutil.copy(r / "pp2_m2" / "rank-0.pt.trace.json.gz", r / "mixed" / "rank-0.pt.trace.json.gz")
    (r / "mixed" / "rank-1.pt.trace.json.gz").symlink_to(outside / "rank-1.pt.trace.json.gz")
    # a trace inside whose summary (which the analysis would read instead) links outside
    summarize_file(str(outside / "rank-0.pt.trace.json.gz"))
    (r / "sum_out").mkdir()
    shutil.copy(outside / "rank-0.pt.trace.json.gz", r / "sum_out" / "rank-0.pt.trace.json.gz")
    (r / "sum_out" / "rank-0.pt.trace.json.gz.diagsum").symlink_to(outside / "rank-0.pt.trace.json.gz.diagsum")
    # one trace alone, whose diag_run.json and summary beside it link outside (issue #20, class 4)
    (r / "single").mkdir()
    shutil.copy(outside / "rank-0.pt.trace.json.gz", r / "single" / "rank-0.pt.trace.json.gz")
    (outside / "diag_run.json").write_text('{"secret": "outside the root"}')
    (r / "single" / "diag_run.json").symlink_to(outside / "diag_run.json")
    (r / "single_sum").mkdir()
    shutil.copy(outside / "rank-0.pt.trace.json.gz", r / "single_sum" / "rank-0.pt.trace.json.gz")
    (r / "single_sum" / "rank-0.pt.trace.json.gz.diagsum").symlink_to(outside / "rank-0.pt.trace.json.gz.diagsum")
    return r


@pytest.fixture(scope="module")
def diagnosis(root):
    return with_advice(diagnose(load_job(str(root / "tp2_pp2_dp2"))))


def test_overview_shows_the_diagnosis_numbers(root, monkeypatch, diagnosis):
    at = app(root, monkeypatch)
    t = diagnosis.throughput
    assert metrics(at) == {"Step time": f"{t.step_time_s * 1e3:,.1f} ms",
                           "Tokens/s per GPU": f"{t.tokens_per_s_per_gpu:,.0f}", "MFU": "unknown", "Ranks": "8 of 8"}
    assert at.title[0].value == "Overview" and not at.error
    rows = at.dataframe[1].value                   # the per-rank table
    assert list(rows["rank"]) == [str(r.rank) for r in diagnosis.ranks]
    assert list(rows["step ms"]) == [f"{r.step_time_s * 1e3:,.1f}" for r in diagnosis.ranks]


def test_communication_page(root, monkeypatch, diagnosis):
    at = app(root, monkeypatch, "communication")
    assert at.title[0].value == "Communication" and not at.error
    axes = at.dataframe[0].value
    assert list(axes["axis"]) == [a.axis for a in diagnosis.comm.axes]
    ops = at.dataframe[1].value
    assert list(ops["calls"]) == [str(o.calls) for o in diagnosis.comm.ops]
    assert len(at.get("plotly_chart")) == 2


def test_pipeline_page(root, monkeypatch, diagnosis):
    at = app(root, monkeypatch, "pipeline")
    p = diagnosis.pipeline
    assert metrics(at) == {"Ideal bubble": f"{100 * p.ideal_fraction:.1f}%",
                           **{f"Stage {s.stage} bubble": f"{100 * s.bubble_fraction:.1f}%" for s in p.stages}}
    assert len(at.get("plotly_chart")) == 1 and not at.error


def test_ranks_page(root, monkeypatch, diagnosis):
    at = app(root, monkeypatch, "ranks")
    assert len(at.get("plotly_chart")) == 2 and not at.error
    warned = [w.value for w in at.warning]
    assert len(warned) == len(diagnosis.comm.stragglers)
    assert all(md(f"{s.who} ") in w for s, w in zip(diagnosis.comm.stragglers, warned))


def test_ranks_page_names_a_set_of_stragglers(tmp_path, monkeypatch):
    """Ranks 3 and 6 of a synthesised TP=8 job take turns being late (test_straggler_sets)."""
    d, _ = turns_job(tmp_path / "turns")
    at = app(tmp_path, monkeypatch, "ranks", run="turns")
    assert [w.value for w in at.warning] == ["Straggler: " + md(f"{d.comm.stragglers[0].who} {d.comm.stragglers[0].reason}: "
                                                                f"{d.comm.stragglers[0].evidence}")]
    assert d.comm.stragglers[0].who == "ranks 3 and 6" and not at.success


def test_ranks_page_says_when_it_cannot_tell(tmp_path, monkeypatch):
    """Rank 0 of a 2-rank job alone: nothing can be matched, so no "No straggler" either."""
    shutil.copytree(os.path.join(ROOT, "tests", "data", "a100_rank0_of_2_nccl_args"), tmp_path / "one_of_two")
    at = app(tmp_path, monkeypatch, "ranks", run="one_of_two")
    assert [i.value for i in at.info] == [f"Stragglers: cannot tell ({md('no collective could be matched across ranks')}).",
                                          md("wait unknown (blank cells): no collective could be matched across ranks; "
                                             "the traces of every rank of the group would make it known")]
    assert not at.warning and not at.success


def test_recommendations_and_what_if(root, monkeypatch, diagnosis):
    from diag.advise.calibrate import calibrate

    at = app(root, monkeypatch, "recommendations")
    recs = diagnosis.recommendations
    assert [h.value for h in at.subheader] == [f"{i}. {md(r.title)}" for i, r in enumerate(recs, 1)]
    m = metrics(at)
    cal = calibrate(diagnosis)
    assert m["Measured step"] == f"{cal.measured_step_s * 1e3:,.1f} ms"
    assert m["Predicted step"] == f"{cal.predict(cal.config) * 1e3:,.1f} ms"
    # DP doubled keeps the global batch by default, as the recommendations do: half the micro-batches
    c = cal.config
    at.number_input(key="wi_dp").set_value(2 * c.dp).run()
    kept = cal.predict(dataclasses.replace(c, dp=2 * c.dp, num_micro_batches=c.num_micro_batches // 2))
    assert metrics(at)["Predicted step"] == f"{kept * 1e3:,.1f} ms"
    assert metrics(at)["micro-batches"] == str(c.num_micro_batches // 2)
    at.number_input(key="wi_dp").set_value(c.dp).run()
    at.checkbox(key="wi_keep").uncheck().run()
    at.number_input(key="wi_m").set_value(4).run()
    expected = cal.predict(dataclasses.replace(c, num_micro_batches=4))
    assert metrics(at)["Predicted step"] == f"{expected * 1e3:,.1f} ms"
    at.number_input(key="wi_pp").set_value(3).run()     # 4 layers do not split over 3 stages
    assert "cannot run this layout" in at.error[0].value


def test_compare_two_runs(root, monkeypatch, diagnosis):
    at = app(root, monkeypatch, "compare")
    assert "Pick a second run" in at.info[0].value
    at.selectbox(key="compare_pick").set_value("pp2_m2").run()
    other = with_advice(diagnose(load_job(str(root / "pp2_m2"))))
    assert metrics(at) == {"A: " + md("tp2_pp2_dp2"): f"{diagnosis.throughput.step_time_s * 1e3:,.1f} ms",
                           "B: " + md("pp2_m2"): f"{other.throughput.step_time_s * 1e3:,.1f} ms"}
    assert at.query_params["compare"] == "pp2_m2" and len(at.get("plotly_chart")) == 3
    # the same signed comparison as `diag compare`, a warning for the world sizes (8 vs 2), one y scale
    from diag.advise.compare import compare
    from diag.report.advice import comparison_rows
    table = at.dataframe[0].value
    assert [list(r) for r in table.itertuples(index=False)] == comparison_rows(compare(diagnosis, other))
    assert [w.value for w in at.warning] == [md("world sizes differ (8 vs 2): compare tokens/s/GPU, not step time")]
    ranges = [json.loads(c.proto.spec)["layout"]["yaxis"]["range"] for c in at.get("plotly_chart")[1:]]
    from diag.analysis.results import steps_in_window
    tallest = max(1e3 * max(r.breakdown.span_s for r in x.ranks) / steps_in_window(x.ranks) for x in (diagnosis, other))
    assert ranges[0] == ranges[1] and tallest <= ranges[0][1] <= 1.06 * tallest


@pytest.mark.parametrize("name", ["../", "../secret", "/etc", "tp2_pp2_dp2/../../secret", "link_out",
                                  "link_out/rank-0.pt.trace.json.gz", "mixed", "sum_out", "/etc/passwd",
                                  "single/rank-0.pt.trace.json.gz", "single_sum/rank-0.pt.trace.json.gz"])
def test_query_param_outside_root_is_refused(root, monkeypatch, name):
    at = app(root, monkeypatch, run=name)
    assert at.error and at.error[0].value.startswith("Refused:")
    assert not at.metric                            # nothing of the other folder is shown


def test_picker_lists_only_runs_inside_root(root):
    assert list_runs(root) == ["pp2_m2", "tp2_pp2_dp2"]         # not link_out, mixed, sum_out
    assert safe_path(root, "tp2_pp2_dp2/rank-0.pt.trace.json.gz") is not None
    assert safe_path(root, "mixed") is None and safe_path(root, "link_out") is None
    assert safe_path(root, "sum_out") is None
    # a single trace is refused when a file its analysis reads beside it links outside
    assert safe_path(root, "single/rank-0.pt.trace.json.gz") is None
    assert safe_path(root, "single_sum/rank-0.pt.trace.json.gz") is None
    assert safe_path(root, "pp2_m2/rank-0.pt.trace.json.gz") is not None


def _upload(name: str, data: bytes) -> UploadedFile:
    return UploadedFile(UploadedFileRec(file_id=name, name=name, type="application/json", data=data), FileURLs())


def test_uploads_keep_bare_names_and_are_capped(tmp_path):
    data = (SAMPLES + "/pp2_m2/rank-0.pt.trace.json.gz")
    blob = open(data, "rb").read()
    dest = tmp_path / "up"
    dest.mkdir()
    folder, problems = save_uploads([_upload("../../evil.json.gz", blob), _upload("notes.txt", b"x"),
                                     _upload("..\\..\\win.json", b"{}")], max_mb=1, dest=dest)
    assert folder == dest and sorted(os.listdir(dest)) == ["evil.json.gz", "win.json"]
    assert not (tmp_path / "evil.json.gz").exists() and len(problems) == 1 and "notes.txt" in problems[0]
    assert clean_name("../.hidden.json") is None and clean_name("diag_run.json") == "diag_run.json"
    big = _upload("big.json", b"0" * (1024 * 1024 + 1))
    assert save_uploads([big], max_mb=1, dest=dest) == (None, ["upload of 1.0 MB refused: the limit is 1 MB"])


def test_dashboard_command_refuses_a_path_outside_root(root):
    r, run = resolve_root(str(root / "tp2_pp2_dp2"), None)
    assert (r, run) == (root.resolve(), "tp2_pp2_dp2")
    result = CliRunner().invoke(main, ["dashboard", str(root.parent / "secret"), "--root", str(root)])
    assert result.exit_code == 2 and "outside the root" in result.output
    argv = streamlit_argv(8600, "127.0.0.1", 7)
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.maxUploadSize") + 1] == "7"
    assert argv[argv.index("--browser.gatherUsageStats") + 1] == "false"


def test_sidebar_sets_layout_and_shape_as_the_cli_flags_do(root, monkeypatch, tmp_path):
    """--global-batch-size and --seq-length set in the sidebar give the tokens/s the CLI gives
    with the same flags; --tp on the old DLRM trace names its axis as `diag analyze --tp 4` does;
    a --config outside the root is refused."""
    import json as _json

    at = app(root, monkeypatch)
    at.number_input(key="in_global_batch_size").set_value(32).run()
    at.number_input(key="in_seq_length").set_value(64).run()
    cli = CliRunner().invoke(main, ["analyze", str(root / "tp2_pp2_dp2"), "--format", "json",
                                    "--global-batch-size", "32", "--seq-length", "64"])
    want = _json.loads(cli.output)["throughput"]["tokens_per_s_per_gpu"]
    assert metrics(at)["Tokens/s per GPU"] == f"{want:,.0f}" != metrics(app(root, monkeypatch))["Tokens/s per GPU"]
    at.text_input(key="in_config").input(str(root.parent / "secret" / "diag_run.json")).run()
    assert any("refused: not a file under" in e.value for e in at.sidebar.error)

    shutil.copytree(os.path.join(ROOT, "tests", "data", "dlrm_4_ranks_alltoall"), tmp_path / "dlrm")
    at = app(tmp_path, monkeypatch, run="dlrm")
    at.number_input(key="in_tp").set_value(4).run()
    cli = CliRunner().invoke(main, ["analyze", str(tmp_path / "dlrm"), "--format", "json", "--tp", "4"])
    layout = _json.loads(cli.output)["layout"]
    assert layout and md(f"Layout: {layout}") in at.caption[0].value


def test_an_empty_chart_says_why(tmp_path, monkeypatch):
    """The old DLRM trace records no message sizes: the busbw chart is empty and says so, with the
    analysis's own note (what would make it known)."""
    shutil.copytree(os.path.join(ROOT, "tests", "data", "dlrm_4_ranks_alltoall"), tmp_path / "dlrm")
    d = diagnose(load_job(str(tmp_path / "dlrm")))
    note = next(n for n in d.comm.notes if n.startswith("busbw unknown"))
    at = app(tmp_path, monkeypatch, "communication", run="dlrm")
    assert [i.value for i in at.info] == [md(f"no bus bandwidth to draw: {note}")]
    assert "record_shapes=True" in note


def test_an_upper_bound_says_so(tmp_path, monkeypatch):
    """DLRM's straggler recommendation removes the others' whole wait: its card says "Upper bound"."""
    shutil.copytree(os.path.join(ROOT, "tests", "data", "dlrm_4_ranks_alltoall"), tmp_path / "dlrm")
    at = app(tmp_path, monkeypatch, "recommendations", run="dlrm")
    from diag.runinputs import open_run
    r = next(x for x in open_run(str(tmp_path / "dlrm")).recommendations if x.rule == "straggler")
    assert r.upper_bound and metrics(at)["Upper bound step"] == f"{r.step_s_after * 1e3:,.1f} ms"
    assert "Predicted step" not in metrics(at)


def test_pipeline_gantt_shows_any_rank_of_a_stage(root, monkeypatch, diagnosis):
    """Stage 1's selector offers ranks 4-7; picking rank 6 draws rank 6's step, the row the
    analysis makes from rank 6's own trace (analysis.gantt.rank_step)."""
    from diag.analysis.diagnose import job_layout, summaries_of
    from diag.analysis.gantt import rank_step

    at = app(root, monkeypatch, "pipeline")
    box = at.selectbox(key="gantt_stage_1")
    assert box.options == ["4", "5", "6", "7"] and box.value == 4
    box.set_value(6).run()
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    rows = {y.split("<br>")[0] for t in spec["data"] if t["type"] == "bar" for y in t["y"]}
    assert rows == {"stage 0 (rank 0)", "stage 1 (rank 6)"}
    job = load_job(str(root / "tp2_pp2_dp2"))
    want = rank_step(next(r for r in job.ranks if r.rank == 6), step=diagnosis.gantt.rows[0].step,
                     grid=job_layout(job, summaries_of(job)), min_idle_fraction=0.002)
    send = next(t for t in spec["data"] if t["name"] == "send/recv")
    drawn = sum(x for x, y in zip(send["x"], send["y"]) if y.startswith("stage 1"))
    assert abs(drawn - 1e3 * want.total("send/recv")) < 1e-6


def test_a_dangling_link_beside_a_run_is_no_traceback(tmp_path, monkeypatch):
    """diag_run.json (or a summary) as a link to nothing inside the root: the run is analysed as
    without it, as `diag analyze` does (found: the app's cache key stat'ed it and raised)."""
    from collections import OrderedDict

    from diag_runs import load_run

    root = tmp_path / "root"
    shutil.copytree(os.path.join(SAMPLES, "pp2_m2"), root / "run")
    os.remove(root / "run" / "diag_run.json")
    os.symlink("gone.json", root / "run" / "diag_run.json")
    os.symlink("gone.diagsum", root / "run" / "rank-0.pt.trace.json.gz.diagsum")
    path = safe_path(root, "run")
    assert path is not None
    run = load_run(path, "run", OrderedDict())
    assert len(run.diagnosis.ranks) == 2
    at = app(root, monkeypatch, run="run")
    assert not at.exception and not at.error and at.metric


def test_the_sidebar_picker_shows_and_changes_the_run(root, monkeypatch):
    """The picker is one widget per run, made with that run's index (ui.sidebar_run): it shows the
    run the page shows, and picking another opens that one, on this page and the next."""
    at = app(root, monkeypatch)
    (picker,) = [s for s in at.sidebar.selectbox if s.label == "Run"]
    assert picker.value == "tp2_pp2_dp2" and "pp2_m2" in picker.options
    picker.set_value("pp2_m2").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.query_params["run"] in ("pp2_m2", ["pp2_m2"])
    assert any(c.value == "Open: " + md("pp2_m2") for c in at.sidebar.caption)
    at.switch_page("views/communication.py").run()
    (picker,) = [s for s in at.sidebar.selectbox if s.label == "Run"]
    assert picker.value == "pp2_m2" and any(c.value == "Open: " + md("pp2_m2") for c in at.sidebar.caption)
