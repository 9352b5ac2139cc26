"""The console in headless Chromium (selenium): pages render, the charts carry the API's
numbers, a tenant sees only its own rows, the operator pages show reasons and outcomes."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from service_harness.kit import A100, ACME, BLUE, call

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None, reason="chromium and chromium-driver (Debian) are not installed"
)
# The target (2 s on the one-day demo warehouse) is measured on an idle machine (docs/service.md);
# here a page only has to render well inside the suite's shared, loaded cores.
PAGE_SECONDS = 10.0
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--window-size=1200,2400",
)


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _login(browser, base: str, key: str) -> float:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(base + "/console/logout")
    login_page = browser.current_url
    browser.find_element(By.ID, "key").send_keys(key)
    started = time.monotonic()
    browser.find_element(By.ID, "login").click()
    # the click returns before the browser follows the redirect: wait for the page it lands on
    WebDriverWait(browser, 30).until(
        lambda d: d.current_url != login_page and d.execute_script("return document.readyState") == "complete"
    )
    return time.monotonic() - started


def _open(browser, url: str) -> float:
    started = time.monotonic()
    browser.get(url)
    return time.monotonic() - started


def test_tenant_console_charts_and_isolation(served, browser, tmp_path):
    from selenium.webdriver.common.by import By

    server, keys = served
    seconds = _login(browser, server.base, keys["acme"])
    assert browser.current_url.endswith("/console/me")
    assert seconds <= PAGE_SECONDS
    assert _open(browser, server.base + "/console/me") <= PAGE_SECONDS
    assert browser.find_element(By.ID, "who").text == ACME
    # price history: the chart's series are the API's history
    _, history, _ = call(
        server.base, f"/v1/prices/history?pool={A100}&resource_class=guaranteed", keys["acme"]
    )
    line = browser.find_element(By.CSS_SELECTOR, f'#price-history polyline[data-series="{A100}/guaranteed"]')
    assert [v for _, v in json.loads(line.get_attribute("data-points"))] == [
        p["price"] for p in history["points"]
    ]
    # the heat map has a cell per pool and hour of the snapshots
    cells = browser.find_elements(By.CSS_SELECTOR, "#demand-heat rect.cell")
    assert len(cells) == 3 * 4  # three pools, four hours (eight half-hourly snapshots)
    # my costs: each bar segment is the mart's daily component
    _, daily, _ = call(server.base, "/v1/me/costs/daily", keys["acme"])
    segments = browser.find_elements(By.CSS_SELECTOR, "#cost-breakdown rect.segment")
    shown = {
        (s.get_attribute("data-bar"), s.get_attribute("data-component")): float(s.get_attribute("data-value"))
        for s in segments
    }
    for row in daily["rows"]:
        for component in ("base_cost", "time_premium", "drainability_discount"):
            assert shown[(row["day"], component)] == pytest.approx(row[component], rel=1e-5, abs=1e-9)
    drains = browser.find_element(By.ID, "drains").text
    assert f"drain-{ACME}-1" in drains and "failed" in drains
    page = browser.page_source
    assert BLUE not in page and "cobalt-labs" not in page and f"drain-{BLUE}" not in page
    browser.save_screenshot(str(tmp_path / "console-tenant.png"))
    assert (tmp_path / "console-tenant.png").read_bytes()[:4] == b"\x89PNG"
    # the operator pages are not a tenant's
    browser.get(server.base + "/console/operator")
    assert "/console/operator" in browser.current_url and "operator key" in browser.page_source
    assert "Price history per pool" not in browser.page_source


def test_operator_console_reasons_timeline_and_search(served, browser, tmp_path):
    from selenium.webdriver.common.by import By

    server, keys = served
    _login(browser, server.base, keys["operator"])
    assert browser.current_url.endswith("/console/operator")
    assert _open(browser, server.base + "/console/operator") <= PAGE_SECONDS
    tables = browser.find_elements(By.CSS_SELECTOR, "table.reasons")
    assert {t.get_attribute("data-pool") for t in tables} == {A100, "H800@cn-beijing-b", "A10@cn-hangzhou-a"}
    for table in tables:
        assert "backlog shield: raised" in table.text and "promise: drainable band" in table.text
    timeline = browser.find_element(By.ID, "timeline")
    failed = timeline.find_elements(By.CSS_SELECTOR, "td.failed")
    assert [c.text for c in failed] == ["failed"]
    assert "scale_down" in timeline.text
    assert browser.find_elements(By.CSS_SELECTOR, "#utilisation polyline.series")
    browser.save_screenshot(str(tmp_path / "console-operator.png"))
    assert _open(browser, server.base + f"/console/operator/search?tenant={BLUE}") <= PAGE_SECONDS
    assert browser.find_element(By.ID, "count").text == "2 decision(s)"
    browser.get(server.base + "/console/operator/search?node=node-1")
    assert "scale-1" not in browser.page_source or "scale_down" in browser.find_element(By.ID, "results").text
    browser.get(server.base + f"/console/operator/tenants/{BLUE}")
    assert f"drain-{BLUE}-2" in browser.page_source and f"drain-{ACME}" not in browser.page_source
