"""Running the dashboard under Streamlit's AppTest, one page of one run, for the tests."""
from __future__ import annotations

import os

from streamlit.testing.v1 import AppTest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = os.path.join(ROOT, "dashboards", "app.py")


def app(root, monkeypatch, page=None, run="tp2_pp2_dp2", **query) -> AppTest:
    """The app on `root` showing `run` (then `page` of views/), with no exception raised."""
    monkeypatch.setenv("DIAG_DASHBOARD_ROOT", str(root))
    monkeypatch.setenv("DIAG_DASHBOARD_RUN", run)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(query)
    at.run()
    if page:
        at.switch_page(f"views/{page}.py")
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at) -> dict:
    return {m.label: m.value for m in at.metric}
