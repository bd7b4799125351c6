"""Access control in a real headless Chromium: signing in through the form, a tenant viewer's
dashboard (their navigation, their tenant locked in the filter, no page showing another
tenant's names), and signing out."""

from __future__ import annotations

import time
from typing import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from servelens.core.auth.credentials import Credentials
from servelens.dashboard.app import create_app
from servelens.dashboard.server import DashboardServer
from tests.dashboard.test_access import BETA_MARKERS, PASSWORD, PRICING, _send
from tests.dashboard.test_browser import browser, pytestmark  # noqa: F401 - the fixture and the marks

SETTLE_S = 30


@pytest.fixture
def settings(make_settings):
    return make_settings(pricing=PRICING)


@pytest.fixture
def server(settings, store) -> Iterator[str]:
    credentials = Credentials(store, settings)
    credentials.add_user("ops", PASSWORD, "admin")
    credentials.add_user("alpha-viewer", PASSWORD, "tenant", ("tenant-alpha",))
    srv = DashboardServer(create_app(settings, store, credentials=credentials), "127.0.0.1", 0)
    srv.start()
    yield f"http://127.0.0.1:{srv.port}"
    srv.shutdown()


def _sign_in(driver, server: str, name: str, next_path: str = "/") -> None:
    driver.get(f"{server}{next_path}")
    WebDriverWait(driver, SETTLE_S).until(lambda d: "/signin" in d.current_url)
    driver.find_element(By.ID, "name").send_keys(name)
    driver.find_element(By.ID, "password").send_keys(PASSWORD)
    driver.find_element(By.ID, "sign-in").click()
    WebDriverWait(driver, SETTLE_S).until(lambda d: d.find_elements(By.CLASS_NAME, "brand"))


def _settled(driver, prefix: str) -> None:
    """Until the page's refresh has answered: its 'updated' line or its alert has text."""
    def done(d) -> bool:
        updated = d.find_elements(By.ID, f"{prefix}-updated")
        alerts = d.find_elements(By.ID, f"{prefix}-alert")
        return any(e.text.strip() for e in (*updated, *alerts))
    WebDriverWait(driver, SETTLE_S).until(done)
    time.sleep(1.0)  # the page's other parts (charts, tables) answer beside it


def test_a_tenant_viewer_sees_their_tenant_only_and_signs_out(browser, server, otlp_http):  # noqa: F811
    _send(otlp_http, "tenant-alpha", 5, 300)
    _send(otlp_http, "tenant-beta", 7, 700)
    _sign_in(browser, server, "alpha-viewer", "/cost")
    assert browser.current_url.endswith("/cost")

    nav = {e.text for e in browser.find_elements(By.CLASS_NAME, "nav-link")}
    assert {"Overview", "Cost", "Latency & stages", "Traces"} <= nav
    assert not nav & {"GPUs", "Plan", "Admin", "Ingest", "SLOs"}, nav
    assert "alpha-viewer" in browser.find_element(By.CLASS_NAME, "who").text

    pages = {"/": "overview", "/cost": "cost", "/latency": "lat", "/workload": "wl", "/reliability": "rel",
             "/quality": "qual", "/triggers": "trg", "/traces": "trc"}
    for path, prefix in pages.items():
        browser.get(f"{server}{path}")
        _settled(browser, prefix)
        source = browser.page_source
        for marker in BETA_MARKERS:
            assert marker not in source, (path, marker)
    browser.get(f"{server}/cost")
    _settled(browser, "cost")
    WebDriverWait(browser, SETTLE_S).until(lambda d: "tenant-alpha" in d.find_element(By.ID, "filter-tenant").text)

    # a fleet page typed in by hand says it is not theirs, and shows nothing of it
    browser.get(f"{server}/gpus")
    _settled(browser, "gpus")
    assert "not open to tenant viewers" in browser.find_element(By.ID, "gpus-alert").text

    browser.find_element(By.ID, "sign-out").click()
    WebDriverWait(browser, SETTLE_S).until(lambda d: "/signin" in d.current_url)
    browser.get(f"{server}/cost")
    WebDriverWait(browser, SETTLE_S).until(lambda d: "/signin" in d.current_url)


def test_an_admin_sees_every_page_and_the_audit_log(browser, server):  # noqa: F811
    _sign_in(browser, server, "ops", "/admin")
    nav = {e.text for e in browser.find_elements(By.CLASS_NAME, "nav-link")}
    assert {"GPUs", "Plan", "Admin"} <= nav
    _settled(browser, "adm")
    WebDriverWait(browser, SETTLE_S).until(lambda d: "sign_in" in d.find_element(By.ID, "adm-audit").text)
    assert "alpha-viewer" in browser.find_element(By.ID, "adm-users").text
