"""`diag export`: a Diagnosis as Prometheus text (values equal the Diagnosis'), written
atomically, linted by promtool, pushed over HTTP, and a clear message without prometheus-client."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from diag.analysis import diagnose
from diag.cli import main
from diag.export.prometheus import to_text
from diag.trace import load_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "sample_traces", "tp2_pp2_dp2")


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture(scope="module")
def diagnosis():
    return diagnose(load_job(RUN))


def test_text_carries_the_diagnosis(diagnosis):
    got = _samples(to_text(diagnosis, "run1"))
    job = (("job", "run1"),)
    assert got[("diag_trace_ranks", job)] == 8
    assert got[("diag_trace_step_seconds", job)] == diagnosis.throughput.step_time_s
    for stage in diagnosis.pipeline.stages:
        key = ("diag_trace_pipeline_bubble_ratio", (("job", "run1"), ("stage", str(stage.stage))))
        assert got[key] == pytest.approx(stage.bubble_fraction)
    for axis in diagnosis.comm.axes:
        key = ("diag_trace_comm_exposed_seconds", (("axis", axis.axis), ("job", "run1")))
        assert got[key] == pytest.approx(axis.exposed_per_step_s)
    r0 = diagnosis.ranks[0]
    key = ("diag_trace_time_ratio", (("job", "run1"), ("kind", "idle"), ("rank", str(r0.rank))))
    assert got[key] == pytest.approx(r0.breakdown.idle_s / r0.breakdown.span_s)
    assert {k[0] for k in got} >= {"diag_trace_collective_busbw_bytes_per_second",
                                   "diag_trace_finding_seconds"}


def test_cli_writes_a_textfile_promtool_accepts(tmp_path):
    path = tmp_path / "diag.prom"
    result = CliRunner().invoke(main, ["export", RUN, "--prometheus", str(path)])
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert 'diag_trace_ranks{job="tp2_pp2_dp2"} 8.0' in text
    assert [p.name for p in tmp_path.iterdir()] == ["diag.prom"]  # no temporary left behind
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


class _Gateway(BaseHTTPRequestHandler):
    """A stand-in for a Pushgateway (none is packaged here): records the request."""

    received: list = []

    def do_PUT(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, body.decode()))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_cli_pushes_to_a_gateway():
    server = HTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    result = CliRunner().invoke(main, ["export", RUN, "--pushgateway", url, "--job", "nightly"])
    thread.join(timeout=30)
    server.server_close()
    assert result.exit_code == 0, result.output
    path, body = _Gateway.received[-1]
    assert path == "/metrics/job/nightly"
    assert 'diag_trace_ranks{job="nightly"} 8.0' in body


def test_unreachable_gateway_and_bad_input_exit_2(tmp_path):
    runner = CliRunner()
    down = runner.invoke(main, ["export", RUN, "--pushgateway", "http://127.0.0.1:9"])
    assert down.exit_code == 2 and "diag: error:" in down.output
    missing = runner.invoke(main, ["export", str(tmp_path / "nope"), "--prometheus", "-"])
    assert missing.exit_code == 2 and "diag: error:" in missing.output
    nothing = runner.invoke(main, ["export", RUN])
    assert nothing.exit_code == 2 and "nothing to do" in nothing.output


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_without_prometheus_client_the_message_says_what_to_install():
    run = _python("import sys; sys.modules['prometheus_client'] = None\n"
                  "from diag.cli import main\n"
                  f"main(['export', {RUN!r}, '--prometheus', '-'])")
    assert run.returncode == 2
    assert "pip install prometheus-client" in run.stderr


def test_export_imports_neither_torch_nor_prometheus_client():
    run = _python("import sys, diag.commands.export, diag.export.prometheus\n"
                  "print('torch' in sys.modules, 'prometheus_client' in sys.modules)")
    assert run.stdout.split() == ["False", "False"], run.stderr
