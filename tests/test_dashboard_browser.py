"""The dashboard and the HTML report in a real headless Chromium.

Starts `diag dashboard` on a sample run, clicks through every page of the sidebar, and on
each waits for the page's title and its charts, then checks that Streamlit shows no
exception or error box and that the browser console has no error. Screenshots are saved
to test-artifacts/dashboard/. The HTML report is opened from a file: its plotly charts
must draw with no console error (and no network: the machine has none).
"""
from __future__ import annotations

import os

from browser import ARTIFACTS, ROOT, chromium, console_errors, dashboard_server
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from diag.analysis import diagnose  # noqa: E402
from diag.advise.recommend import with_advice  # noqa: E402
from diag.commands.dashboard import free_port  # noqa: E402
from diag.report.html import render_html  # noqa: E402
from diag.trace import load_job  # noqa: E402

SAMPLE = os.path.join(ROOT, "sample_traces", "tp2_pp2_dp2")
OUT = os.path.join(ARTIFACTS, "dashboard")
# page title -> how many plotly charts it must draw
PAGES = {"Overview": 1, "Communication": 2, "Pipeline": 1, "Ranks": 2, "Recommendations": 0, "Compare": 3}


def _wait_page(driver, title: str, charts: int) -> None:
    wait = WebDriverWait(driver, 60, poll_frequency=0.3)
    wait.until(EC.text_to_be_present_in_element((By.CSS_SELECTOR, "h1"), title))
    if charts:
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg")) >= charts)
    # Streamlit marks a page that is still running; wait until it has finished.
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]'))


def _pick_second_run(driver, name: str) -> None:
    """Open the Compare page's combobox and click the run's option."""
    box = WebDriverWait(driver, 60).until(EC.element_to_be_clickable(
        (By.CSS_SELECTOR, '[data-testid="stMain"] [data-testid="stSelectbox"] input')))
    box.click()
    option = WebDriverWait(driver, 30).until(EC.element_to_be_clickable(
        (By.XPATH, f'//*[@role="option"][normalize-space()="{name}"]')))
    option.click()


def _picker_value(driver) -> str:
    picker = driver.find_element(By.CSS_SELECTOR, '[data-testid="stSidebar"] [data-testid="stSelectbox"]')
    return picker.find_element(By.CSS_SELECTOR, "input").get_attribute("value")


def _problems_on_page(driver) -> list[str]:
    boxes = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"], [data-testid="stAlertContentError"]')
    return [b.text for b in boxes]


def test_every_page_renders_in_chromium(tmp_path):
    os.makedirs(OUT, exist_ok=True)
    port = free_port()
    with dashboard_server(SAMPLE, port, str(tmp_path / "server.log")) as base, chromium() as driver:
        driver.get(base)
        for title, charts in PAGES.items():
            link = WebDriverWait(driver, 60).until(EC.element_to_be_clickable(
                (By.XPATH, f'//a[@data-testid="stSidebarNavLink"][.//p[text()="{title}"]]')))
            link.click()
            if title == "Compare":
                _pick_second_run(driver, "pp2_m2")
            _wait_page(driver, title, charts)
            driver.save_screenshot(os.path.join(OUT, f"{title.lower()}.png"))
            assert _problems_on_page(driver) == [], title
            sidebar = driver.find_element(By.CSS_SELECTOR, '[data-testid="stSidebar"]').text
            assert "Open: tp2_pp2_dp2" in sidebar, (title, sidebar)      # moving between pages keeps the run
            # and the picker shows it (the browser may draw the widget before its value arrives:
            # waited for, up to 30 s, then the value it shows is the failure)
            try:
                WebDriverWait(driver, 30, poll_frequency=0.3).until(lambda d: _picker_value(d) == "tp2_pp2_dp2")
            except TimeoutException:
                raise AssertionError((title, _picker_value(driver))) from None
            assert console_errors(driver) == [], title
            if title == "Overview":
                values = [e.text for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMetricValue"]')]
                assert values[0] == f"{load_step_ms():,.1f} ms"


def load_step_ms() -> float:
    return with_advice(diagnose(load_job(SAMPLE))).throughput.step_time_s * 1e3


def test_html_report_opens_without_console_errors(tmp_path):
    os.makedirs(OUT, exist_ok=True)
    job = load_job(SAMPLE)
    d = with_advice(diagnose(job))
    page = tmp_path / "report.html"
    page.write_text(render_html(d, d.gantt), encoding="utf-8")
    with chromium() as driver:
        driver.get(page.as_uri())
        WebDriverWait(driver, 60).until(
            lambda dr: len(dr.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg")) >= 6)
        driver.save_screenshot(os.path.join(OUT, "html_report.png"))
        assert console_errors(driver) == []
        assert driver.find_element(By.ID, "pipeline").text == "Pipeline"
