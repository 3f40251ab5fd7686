"""One run, four renderings, the same figures (issue #17, "numbers that agree").

The sample TP2 x PP2 x DP2 run is rendered as text, JSON, HTML and in the dashboard
(Streamlit's AppTest). The figures a user sees in more than one place (step time, each
rank's step and exposed communication per step, each row of "where the time goes", each
stage's bubble) are parsed out of every rendering and compared with the Diagnosis JSON,
formatted the way each view says it formats them. The communication rows of "where the time
goes" must add up to the ranks' mean exposed communication, as their legend says.
"""
from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from click.testing import CliRunner
from dashapp import app

from diag.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "sample_traces", "tp2_pp2_dp2")


def _analyze(fmt: str) -> str:
    result = CliRunner().invoke(main, ["analyze", SAMPLE, "--format", fmt], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def truth() -> dict:
    """The figures from the Diagnosis JSON, worked into the units the views show."""
    d = json.loads(_analyze("json"))
    ranks = {r["rank"]: r for r in d["ranks"]}
    return {"step_ms": d["throughput"]["step_time_s"] * 1e3,
            "rank_step_ms": {k: r["step_time_s"] * 1e3 for k, r in ranks.items()},
            "rank_exposed_ms": {k: r["overlap"]["exposed_per_step_s"] * 1e3 for k, r in ranks.items()},
            "findings_ms": {f["what"]: f["seconds_per_step"] * 1e3 for f in d["findings"]},
            "comm_findings_ms": sum(f["seconds_per_step"] * 1e3 for f in d["findings"] if f["kind"] == "comm"),
            "bubble_pct": {s["stage"]: 100 * s["bubble_fraction"] for s in d["pipeline"]["stages"]}}


def _num(s: str) -> float:
    return float(s.replace(",", "").replace(" ms", "").replace("%", ""))


def _close(shown: dict, true: dict, digits: int) -> None:
    assert shown.keys() == true.keys()
    for k, v in shown.items():
        assert abs(v - true[k]) <= 0.51 * 10 ** -digits, (k, v, true[k])


def test_the_rows_add_up(truth):
    mean_exposed = sum(truth["rank_exposed_ms"].values()) / len(truth["rank_exposed_ms"])
    assert truth["comm_findings_ms"] == pytest.approx(mean_exposed, rel=1e-9)


def test_text_report(truth):
    out = _analyze("text")
    assert f"step {truth['step_ms']:,.1f} ms" in out
    findings = {m[0].strip(): _num(m[1]) for m in re.findall(r"^ ((?:exposed|host|GPU|waiting|memory)[^\n]*?)\s+"
                                                            r"([\d,]+\.\d\d)\s+[\d.]+ $", out, re.M)}
    _close(findings, truth["findings_ms"], 2)
    rows = re.findall(r"^ (\d+)\s+([\d,.]+)\s+[\d,.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+([\d,.]+) $", out, re.M)
    _close({int(r): _num(s) for r, s, _ in rows}, truth["rank_step_ms"], 1)
    _close({int(r): _num(x) for r, _, x in rows}, truth["rank_exposed_ms"], 2)
    stages = re.findall(r"^ (\d)\s+\d-\d\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+[\d.]+ $", out, re.M)
    _close({int(s): _num(b) for s, b in stages}, truth["bubble_pct"], 1)


def _html_rows(page: str) -> list[list[str]]:
    return [re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr>(.*?)</tr>", page)]


def test_html_report(truth):
    page = _analyze("html")
    assert f"step {truth['step_ms']:,.1f} ms" in page
    rows = _html_rows(page)
    # the findings table's rows (3 cells): a recommendation's evidence table (4) may name the same loss
    _close({r[0]: _num(r[1]) for r in rows if len(r) == 3 and r[0] in truth["findings_ms"]}, truth["findings_ms"], 2)
    ranks = [r for r in rows if len(r) == 9 and r[0].isdigit()]
    _close({int(r[0]): _num(r[1]) for r in ranks}, truth["rank_step_ms"], 1)
    _close({int(r[0]): _num(r[8]) for r in ranks}, truth["rank_exposed_ms"], 2)
    stages = [r for r in rows if len(r) == 6 and r[0].isdigit()]
    _close({int(r[0]): _num(r[3]) for r in stages}, truth["bubble_pct"], 1)
    heat = _heatmap(page, "Collective time, exposed communication")
    _close(dict(enumerate(heat)), dict(enumerate(truth["rank_exposed_ms"][k] for k in sorted(truth["rank_exposed_ms"]))), 6)


def _heatmap(page: str, title: str) -> list[float]:
    """The 'exposed ms/step' column of the wait heatmap whose layout title starts with `title`."""
    decode = json.JSONDecoder().raw_decode
    for m in re.finditer(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*", page):
        data, end = decode(page, m.end())
        layout, _ = decode(page, re.compile(r",\s*").match(page, end).end())
        if layout["title"]["text"].startswith(title):
            col = data[0]["x"].index("exposed ms/step")
            return [row[col] for row in data[0]["z"]]
    raise AssertionError(f"no chart titled {title!r}")


@pytest.fixture(scope="module")
def dash(tmp_path_factory):
    root = tmp_path_factory.mktemp("agree")
    shutil.copytree(SAMPLE, root / "tp2_pp2_dp2")
    return root


def test_dashboard(truth, dash, monkeypatch):
    at = app(dash, monkeypatch)
    assert {m.label: m.value for m in at.metric}["Step time"] == f"{truth['step_ms']:,.1f} ms"
    findings, ranks = at.dataframe[0].value, at.dataframe[1].value
    _close({w: _num(v) for w, v in zip(findings["where the time goes"], findings["ms/step"])}, truth["findings_ms"], 2)
    _close({int(r): _num(v) for r, v in zip(ranks["rank"], ranks["step ms"])}, truth["rank_step_ms"], 1)
    _close({int(r): _num(v) for r, v in zip(ranks["rank"], ranks["exp ms"])}, truth["rank_exposed_ms"], 2)
    at = app(dash, monkeypatch, "ranks")
    spec = json.loads(at.get("plotly_chart")[1].proto.spec)["data"][0]
    col = spec["x"].index("exposed ms/step")
    _close(dict(enumerate(row[col] for row in spec["z"])),
           dict(enumerate(truth["rank_exposed_ms"][k] for k in sorted(truth["rank_exposed_ms"]))), 6)
    at = app(dash, monkeypatch, "pipeline")
    _close({int(m.label.split()[1]): _num(m.value) for m in at.metric if m.label.startswith("Stage ")},
           truth["bubble_pct"], 1)
