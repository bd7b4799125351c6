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
from servelens.dashboard.components import usd
from servelens.dashboard.server import DashboardServer
from tests.dashboard.test_access import BETA_MARKERS, PASSWORD, PRICING, _send
from tests.dashboard.test_browser import browser, pytestmark  # noqa: F401 - the fixture and the marks
from tests.dashboard.test_pages import GPU_HOST, GPU_RATE, GPU_SAMPLES, GPU_UTILS, send_gpu_samples

SETTLE_S = 30


# One self-hosted deployment both tenants' requests run on (tokens weighted 1 : 3).
SHARED = "shared-gpus"
DEPLOYMENTS = [{"name": SHARED, "gpus": {"hosts": [GPU_HOST]}, "gpu_hourly_usd": GPU_RATE,
                "cost_weights": {"input": 1, "output": 3}}]


@pytest.fixture
def settings(make_settings):
    return make_settings(pricing=PRICING, deployments=DEPLOYMENTS)


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
    assert {"Overview", "Cost", "Latency & stages", "Traces", "GPUs"} <= nav
    assert not nav & {"Plan", "Admin", "Ingest", "SLOs"}, nav
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
    browser.get(f"{server}/plan")
    WebDriverWait(browser, SETTLE_S).until(
        lambda d: "not open to tenant viewers" in d.find_element(By.ID, "plan-alert").text)

    browser.find_element(By.ID, "sign-out").click()
    WebDriverWait(browser, SETTLE_S).until(lambda d: "/signin" in d.current_url)
    browser.get(f"{server}/cost")
    WebDriverWait(browser, SETTLE_S).until(lambda d: "/signin" in d.current_url)


def test_a_tenant_viewer_reads_their_share_of_a_shared_deployments_gpu_cost(browser, server, otlp_http):  # noqa: F811
    """Both tenants' requests run on one deployment: alpha's viewer reads what alpha was
    allocated of its GPU cost (busy, and with the idle time spread), and nothing of the
    fleet's utilization or of beta."""
    send_gpu_samples(otlp_http)
    _send(otlp_http, "tenant-alpha", 4, 300, deployment=SHARED)
    _send(otlp_http, "tenant-beta", 6, 700, deployment=SHARED)
    # _send's request i carries 100 + i input and 10 + i output tokens
    def weighted(n: int) -> float:
        return sum((100 + i) * 1 + (10 + i) * 3 for i in range(n))
    share = weighted(4) / (weighted(4) + weighted(6))
    hours = GPU_SAMPLES * 15 / 3600
    provisioned = len(GPU_UTILS) * hours * GPU_RATE
    busy = sum(hours * GPU_RATE * sum(u) / len(u) / 100 for u in GPU_UTILS.values())

    _sign_in(browser, server, "alpha-viewer", "/gpus")
    WebDriverWait(browser, SETTLE_S).until(lambda d: SHARED in d.find_element(By.ID, "gpus-share").text)
    row = browser.find_element(By.XPATH, f"//*[@id='gpus-share']//tr[td[1][normalize-space()='{SHARED}']]").text
    assert row.split() == [SHARED, "4", f"{sum(100 + i for i in range(4)):,}", f"{sum(10 + i for i in range(4)):,}",
                           usd(busy * share), usd(provisioned * share)], row
    assert usd(busy * share) in browser.find_element(By.ID, "gpus-total").text
    source = browser.page_source
    for hidden in (*BETA_MARKERS, usd(busy), usd(provisioned)):
        assert hidden not in source, hidden
    assert not browser.find_elements(By.ID, "gpus-d0-util-mean") and not browser.find_elements(By.ID, "gpus-d0-idle")
    assert not browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")  # the fleet's charts are not drawn
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_an_admin_sees_every_page_and_the_audit_log(browser, server):  # noqa: F811
    _sign_in(browser, server, "ops", "/admin")
    nav = {e.text for e in browser.find_elements(By.CLASS_NAME, "nav-link")}
    assert {"GPUs", "Plan", "Admin"} <= nav
    _settled(browser, "adm")
    WebDriverWait(browser, SETTLE_S).until(lambda d: "sign_in" in d.find_element(By.ID, "adm-audit").text)
    assert "alpha-viewer" in browser.find_element(By.ID, "adm-users").text
