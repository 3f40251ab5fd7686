"""Headless Chromium and a live dashboard server for the browser tests.

Chromium runs with the flags that keep it off the network (no background fetches, no
component updates) and a fresh profile; the dashboard is started through the real
`diag dashboard` command on a free port and always killed afterwards. Screenshots go to
test-artifacts/ at the repository root.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.path.join(ROOT, "test-artifacts")
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1400,1600")


@contextlib.contextmanager
def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in CHROME_FLAGS:
        opts.add_argument(f)
    with tempfile.TemporaryDirectory(prefix="diag-chromium-") as profile:
        opts.add_argument(f"--user-data-dir={profile}")
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
        driver.set_page_load_timeout(30)
        try:
            yield driver
        finally:
            driver.quit()


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer in {timeout_s} s")


@contextlib.contextmanager
def dashboard_server(path: str, port: int, log_path: str, *extra: str, env: Optional[dict] = None):
    """`diag dashboard PATH --port PORT` in its own process group (environment `env` added), killed on exit."""
    cmd = [sys.executable, "-m", "diag.cli", "dashboard", path, "--port", str(port), *extra]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            wait_http(f"http://127.0.0.1:{port}/_stcore/health", 90, proc)
            yield f"http://127.0.0.1:{port}"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
