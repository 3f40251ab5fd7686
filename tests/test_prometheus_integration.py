"""End to end: a real Prometheus scrapes a real trainer run; every Grafana panel query and every
recording and alert rule expression is run through Prometheus's HTTP API and must return data
(NVML-only panels must be valid and empty on this CPU run), with values checked against the
trainer's steps.jsonl and against each other. The rule files are checked with promtool, the
alerts unit-tested with `promtool test rules`, and the exposition linted with promtool.
"""

from __future__ import annotations

import json
import math
import re
import socket
import statistics
import subprocess
import sys
import time

import pytest
import yaml

from instrumented_trainer.telemetry.prometheus import DEVICE_METRICS, NVML_ONLY
from promserver import (PROM_DIR, ROOT, finish, free_ports, get, iters_lasting, prometheus_server,
                        query, start_trainer)

pytestmark = pytest.mark.slow
JOB, PEAK_TFLOPS = "itest", 0.05
MIN_ITERS, RUN_S = 400, 40.0   # the run must outlast the rules' first evaluations on any machine
DASHBOARD = ROOT / "dashboards" / "grafana" / "diag.json"
NAME = re.compile(r"\b([a-z_]+:[a-z0-9_:]+|diag_[a-z0-9_]+)\b")
# Flight Recorder sequence numbers: this run is pipeline-only on gloo, whose Flight Recorder records
# no send/recv, so they are valid and empty here; tests/test_prometheus_hang.py has them with data.
FR_SEQ = {"diag_collective_last_enqueued_seq", "diag_collective_last_completed_seq",
          "job_pg_rank:diag_collective_seq_behind", "job_pg_rank:diag_collective_last_enqueued_seq:changes5m"}


def _rules(kind: str) -> list[dict]:
    doc = yaml.safe_load((PROM_DIR / "rules" / f"diag-{kind}.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _panel_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def _fill(expr: str) -> str:
    return (expr.replace("$job", JOB).replace("$node", ".*")
            .replace("$__rate_interval", "1m"))


def _value(result: list[dict], **labels) -> float:
    rows = [r for r in result if all(r["metric"].get(k) == v for k, v in labels.items())]
    assert len(rows) == 1, (labels, result)
    return float(rows[0]["value"][1])


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """Runs the whole scenario once; yields what the tests check."""
    tmp = tmp_path_factory.mktemp("prom")
    iters = iters_lasting(RUN_S, tmp / "calibrate", MIN_ITERS)
    base = free_ports(2)
    with prometheus_server(tmp, [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]) as url:
        proc = start_trainer(tmp / JOB, base, iters, "--peak-tflops", str(PEAK_TFLOPS))
        try:
            at, exposition = _wait_for_rules(url, proc, base)
        finally:
            code, out, err = finish(proc)
        assert code == 0, err[-3000:]
        yield {"url": url, "at": at, "exposition": exposition, "out": tmp / JOB, "iters": iters,
               "steps": [json.loads(x) for x in (tmp / JOB / "steps.jsonl").read_text().split()]}


def _wait_for_rules(url, proc, base, limit_s: float = 120.0) -> tuple[float, str]:
    """Until every recording rule has data (or the trainer ended / the deadline passed)."""
    names = [r["record"] for r in _rules("recording") if r["record"] not in FR_SEQ]
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and proc.poll() is None:
        steps = query(url, f'min(diag_steps_total{{job="{JOB}"}})')
        if steps and float(steps[0]["value"][1]) >= 60 and all(query(url, n) for n in names):
            time.sleep(3.0)  # a few more scrapes and evaluations: `at` is after every first one
            exposition = get(f"http://127.0.0.1:{base + 1}/metrics").decode()
            return time.time() - 0.5, exposition
        time.sleep(1.0)
    missing = [n for n in names if not query(url, n)]
    pytest.fail(f"recording rules without data (trainer exit {proc.poll()}): {missing}")


def test_every_panel_query_returns_data(live):
    for title, expr in _panel_queries():
        result = query(live["url"], _fill(expr), live["at"])
        if set(NAME.findall(expr)) <= set(NVML_ONLY):
            assert result == [], f"{title}: NVML-only metric has data on a CPU run"
        elif set(NAME.findall(expr)) <= FR_SEQ:
            assert result == [], f"{title}: gloo recorded a send/recv?"
        else:
            assert result, f"panel {title!r}: no data for {expr}"


def test_dashboard_variables_resolve(live):
    body = json.loads(get(f"{live['url']}/api/v1/label/job/values?match[]=diag_train_iters"))
    assert body["data"] == [JOB]
    nodes = json.loads(get(f"{live['url']}/api/v1/label/node/values?"
                           f"match[]=diag_train_iters{{job=%22{JOB}%22}}"))
    assert nodes["data"] == [socket.gethostname()]


def test_every_rule_expression_returns_data(live):
    for rule in _rules("recording"):
        assert bool(query(live["url"], rule["expr"], live["at"])) != (rule["record"] in FR_SEQ), rule["record"]
    recorded = {r["record"] for r in _rules("recording")}
    for rule in _rules("alerts"):
        query(live["url"], rule["expr"], live["at"])  # valid: status success
        inputs = [n for n in NAME.findall(rule["expr"]) if ":" in n]
        assert inputs and set(inputs) <= recorded, rule["alert"]
        for name in set(inputs) - FR_SEQ:  # what the alert compares has data; promtool tests the firing
            assert query(live["url"], name, live["at"]), (rule["alert"], name)


def test_queries_use_only_exported_and_recorded_names(live):
    exported = set(re.findall(r"^(diag_[a-z0-9_]+)", live["exposition"], re.M))
    device = {name for _, name, _, _ in DEVICE_METRICS}  # NVML or psutil: one set is absent
    known = exported | {r["record"] for r in _rules("recording")} | device | FR_SEQ
    used = {n for _, e in _panel_queries() for n in NAME.findall(e)}
    used |= {n for k in ("recording", "alerts") for r in _rules(k) for n in NAME.findall(r["expr"])}
    assert used - known == set()


def test_values_agree_with_steps_jsonl(live):
    url, at, steps = live["url"], live["at"], live["steps"]
    done = query(url, f'diag_steps_total{{job="{JOB}",rank="1"}}', at)
    tps = query(url, f'diag_tokens_per_second{{job="{JOB}",rank="1"}}', at)
    step = int(float(done[0]["value"][1])) - 1  # the same scrape: one sample of each
    assert float(tps[0]["value"][1]) == pytest.approx(steps[step]["tokens_per_second"], rel=1e-12)
    mean = query(url, 'job_rank:diag_step_seconds:rate1m{rank="1"}', at)
    seconds = [s["step_seconds"] for s in steps]
    assert min(seconds) <= _value(mean) <= max(seconds)
    # A 1m rate of a series younger than a minute is extrapolated over the whole window, so it
    # reads low early on: only the upper bound holds at any age.
    rate = _value(query(url, "job:diag_tokens_per_second:rate1m", at))
    assert 0 < rate <= 1.1 * max(s["tokens_per_second"] for s in steps)
    tokens = query(url, "diag_tokens_total - 8 * 32 * diag_steps_total", at)
    assert [float(r["value"][1]) for r in tokens] == [0.0, 0.0]  # both ranks count the job's


def test_rule_values_are_consistent(live):
    url, at = live["url"], live["at"]
    assert _value(query(url, "job:diag_pipeline_bubble_ideal_ratio", at)) == 0.2  # p=2, m=4
    for r in query(url, "job_rank:diag_straggler_ratio:rate1m", at):  # one rank per stage
        assert float(r["value"][1]) == pytest.approx(1.0)
    done = min(float(r["value"][1]) for r in query(url, "diag_steps_total", at))
    # The rule was evaluated <= 1 s before `at`, on a sample scraped <= 1 s before that: it may
    # lag by the steps of ~2 s (3 s allowed), however many that is on this machine.
    seen = live["iters"] - _value(query(url, "job:diag_steps_remaining", at))
    step_s = statistics.median(s["step_seconds"] for s in live["steps"])
    assert seen.is_integer() and done - max(60, math.ceil(3.0 / step_s)) <= seen <= done, (seen, done, step_s)
    assert 0 <= _value(query(url, "job:diag_last_step_age_seconds", at)) < 10
    axes = query(url, "job_axis:diag_collective_exposed_ratio:rate1m", at)
    assert [r["metric"]["axis"] for r in axes] == ["pp"]
    assert 0 < float(axes[0]["value"][1]) < 1
    per_call = query(url, 'diag_collective_bytes_total / diag_collective_calls_total', at)
    assert {float(r["value"][1]) for r in per_call} == {2 * 32 * 64 * 4}  # micro x seq x h x fp32
    bus = query(url, "diag_collective_bus_bytes_total - diag_collective_bytes_total", at)
    assert {float(r["value"][1]) for r in bus} == {0.0}  # send/recv: nccl-tests factor 1


def test_mfu_follows_from_step_time(live):
    url, at = live["url"], live["at"]
    flops = (6 * (4 * (4 * 64 * 64 + 2 * 64 * 256) + 128 * 64) + 12 * 4 * 64 * 32) * 8 * 32
    for rank in ("0", "1"):
        mfu = _value(query(url, f'diag_mfu_ratio{{rank="{rank}"}}', at))
        step = _value(query(url, f'diag_step_seconds{{rank="{rank}"}}', at))
        assert mfu == pytest.approx(flops / (step * 2 * PEAK_TFLOPS * 1e12), rel=1e-9)


def test_exposition_passes_promtool_lint(live):
    lint = subprocess.run(["promtool", "check", "metrics"], input=live["exposition"],
                          capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_rule_files_pass_promtool():
    files = sorted(str(p) for p in (PROM_DIR / "rules").glob("*.yml"))
    check = subprocess.run(["promtool", "check", "rules", *files], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 17 rules found" in check.stdout and "SUCCESS: 4 rules found" in check.stdout
    unit = subprocess.run(["promtool", "test", "rules", "tests/diag-alerts.test.yml"],
                          cwd=PROM_DIR, capture_output=True, text=True, timeout=60)
    assert unit.returncode == 0, unit.stdout + unit.stderr
    config = subprocess.run(["promtool", "check", "config", "--syntax-only", "prometheus.yml"],
                            cwd=PROM_DIR, capture_output=True, text=True, timeout=60)
    assert config.returncode == 0, config.stdout + config.stderr


def _targets(*args: str, env: dict | None = None, stdin: str = "") -> list[dict]:
    run = subprocess.run([sys.executable, str(PROM_DIR / "targets.py"), *args], input=stdin,
                         capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", **(env or {})})
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout) if run.stdout else []


def test_targets_for_slurm_and_kubernetes_hosts(tmp_path):
    slurm = _targets("slurm", "--port", "9700", env={
        "SLURM_JOB_NODELIST": "gpu[08-09,11]", "SLURM_NTASKS_PER_NODE": "2(x3)",
        "SLURM_JOB_ID": "42"})
    assert slurm == [{"targets": ["gpu08:9700", "gpu08:9701", "gpu09:9700", "gpu09:9701",
                                  "gpu11:9700", "gpu11:9701"],
                      "labels": {"slurm_job_id": "42"}}]
    pods = _targets("hosts", "-", "--ranks-per-node", "1", "--port", "9800",
                    stdin="10.0.0.5\n10.0.0.6\n")
    assert pods[0]["targets"] == ["10.0.0.5:9800", "10.0.0.6:9800"]
    out = tmp_path / "job.json"
    assert _targets("hosts", "n1", "--ranks-per-node", "8", "-o", str(out)) == []
    assert len(json.loads(out.read_text())[0]["targets"]) == 8
