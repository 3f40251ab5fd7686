"""Strings from a trace are data, never markup, in the dashboard and the HTML report (issue #20, class 5).

A real 4-rank DLRM trace (tests/data/dlrm_4_ranks_alltoall) is copied with its device name
replaced by a Markdown image, an HTML image, a script and backticks, each pointing at a local
HTTP server that records every request. The dashboard (the real `diag dashboard`, in headless
Chromium) and the HTML report (opened from a file) must show the string as text: no request
reaches the server, no <img> or <script> of it is created, the page title stays.
"""
from __future__ import annotations

import glob
import http.server
import json
import os
import threading
import time

import pytest
from browser import chromium, dashboard_server
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from diag.analysis import diagnose
from diag.commands.dashboard import free_port
from diag.report.html import render_html
from diag.trace import load_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DLRM = os.path.join(ROOT, "tests", "data", "dlrm_4_ranks_alltoall")


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self):                        # noqa: N802 - http.server's name
        _Recorder.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()

    def log_message(self, *args):           # quiet
        pass


@pytest.fixture()
def trap():
    """A local server recording requests; yields (its base URL, the list of paths requested)."""
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    finally:
        server.shutdown()


def hostile(url: str) -> str:
    return (f"V100 ![md]({url}/markdown.png) <img src=\"{url}/html.png\"> "
            f"<script>document.title='pwned'</script> `tick` :red[red] $x^2$ [link]({url}/link)")


def hostile_run(folder, url: str) -> str:
    """The DLRM traces with every device's name made hostile; returns the name."""
    os.makedirs(folder)
    name = hostile(url)
    for src in glob.glob(os.path.join(DLRM, "*.json")):
        with open(src) as f:
            doc = json.load(f)
        for dev in doc["deviceProperties"]:
            dev["name"] = name
        with open(os.path.join(folder, os.path.basename(src)), "w") as f:
            json.dump(doc, f)
    return name


def _no_markup(driver, url: str, seen: list[str]) -> None:
    time.sleep(2)                            # leave time for any fetch the page would make
    assert seen == []
    assert driver.title != "pwned"
    for tag in ("img", "script", "a"):
        srcs = [e.get_attribute("src") or e.get_attribute("href") or "" for e in driver.find_elements(By.TAG_NAME, tag)]
        assert not [s for s in srcs if url in s], tag
    assert not driver.find_elements(By.CSS_SELECTOR, ".katex")


def test_dashboard_shows_hostile_trace_strings_as_text(tmp_path, trap):
    url, seen = trap
    name = hostile_run(tmp_path / "runs" / "hostile", url)
    with dashboard_server(str(tmp_path / "runs"), free_port(), str(tmp_path / "server.log")) as base, \
            chromium() as driver:
        driver.get(base)
        wait = WebDriverWait(driver, 90, poll_frequency=0.3)
        wait.until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, "h1"), "Overview"))
        wait.until(lambda d: "V100 ![md](" in d.find_element(By.CSS_SELECTOR, '[data-testid="stMain"]').text)
        text = driver.find_element(By.CSS_SELECTOR, '[data-testid="stMain"]').text.replace("\u200b", "")
        assert f"device: {' '.join(name.split())}" in text    # as written (zero-width spaces keep URLs unlinked)
        _no_markup(driver, url, seen)


def test_html_report_shows_hostile_trace_strings_as_text(tmp_path, trap):
    url, seen = trap
    name = hostile_run(tmp_path / "hostile", url)
    page = tmp_path / "report.html"
    page.write_text(render_html(diagnose(load_job(str(tmp_path / "hostile")))), encoding="utf-8")
    with chromium() as driver:
        driver.get(page.as_uri())
        WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg"))
        assert f"device: {name}" in driver.find_element(By.TAG_NAME, "body").text
        _no_markup(driver, url, seen)


def _upload_in_browser(driver, base: str, trace: str) -> None:
    driver.get(base)
    box = WebDriverWait(driver, 90).until(EC.presence_of_element_located(
        (By.CSS_SELECTOR, '[data-testid="stSidebar"] input[type="file"]')))
    box.send_keys(trace)
    WebDriverWait(driver, 90, poll_frequency=0.3).until(
        lambda d: "Showing the uploaded traces" in d.find_element(By.CSS_SELECTOR, '[data-testid="stSidebar"]').text)


def _uploads(tmp: str) -> list[str]:
    return sorted(n for n in os.listdir(tmp) if n.startswith("diag-upload-"))


def _until(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.5)
    return cond()


def test_uploads_are_removed_when_the_session_ends_and_at_server_exit(tmp_path):
    """A real server (its temporary folder under tmp_path) takes an upload from Chromium; the
    folder goes once the browser has gone (the next page run of any session removes the uploads
    of sessions the server no longer has), and an upload still held goes when the server exits."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    trace = os.path.join(ROOT, "sample_traces", "pp2_m2", "rank-0.pt.trace.json.gz")
    runs = tmp_path / "runs"
    runs.mkdir()
    with dashboard_server(str(runs), free_port(), str(tmp_path / "server.log"), env=env) as base:
        with chromium() as driver:
            _upload_in_browser(driver, base, trace)
            first = _uploads(str(tmp))
            assert len(first) == 1 and os.listdir(tmp / first[0]) == ["rank-0.pt.trace.json.gz"]
        time.sleep(2)                                    # the browser is gone, its session with it
        with chromium() as driver:
            _upload_in_browser(driver, base, trace)      # a new session, whose page runs look
            assert _until(lambda: first[0] not in _uploads(str(tmp)), 30), _uploads(str(tmp))
            assert len(_uploads(str(tmp))) == 1          # the new session's upload
        assert _uploads(str(tmp))
    assert _uploads(str(tmp)) == []                      # the server removed it when it exited
