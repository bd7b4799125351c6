"""The hardened dashboard in a real headless Chromium, against the real store and the real
server on 127.0.0.1: the Overview with thousands of groups (top N and the "other" row),
every page under the Content-Security-Policy with a clean console, refreshes paused in a
hidden window, and span attribute values drawn as text in a Plotly chart."""

from __future__ import annotations

import shutil
import threading
import time
from typing import Iterator

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from bench.dashboard_cardinality import IDLE_JS, OVERVIEW_DRAWN_JS, generate
from servelens.dashboard import components
from servelens.dashboard.app import create_app
from servelens.dashboard.server import DashboardServer
from tests.dashboard.test_browser import CHROMEDRIVER, CHROMIUM, _text, browser  # noqa: F401 - the fixture
from tests.dashboard.test_hardening import ESCAPED, HOSTILE_NAME

pytestmark = [
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                       reason="needs Debian's chromium and chromium-driver"),
]

GROUPS, REQUESTS = 5000, 10_000
SCREENSHOT = "/tmp/servelens_overview_top_n.png"
PAGES = ("/", "/latency", "/cost", "/gpus", "/quality", "/workload", "/reliability", "/triggers", "/traces")


def _wait(driver, until, timeout: float = 30) -> None:
    WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]).until(until)


def _cells(driver, container: str) -> list[list[str]]:
    """The text of each data row's cells in the table under `container`, read in one go
    (a refresh may redraw the table between two reads of its elements)."""
    return driver.execute_script("""
        return Array.from(document.querySelectorAll('#' + arguments[0] + ' tr'))
            .map(function (tr) { return Array.from(tr.querySelectorAll('td')).map(function (td) {
                return td.textContent.trim(); }); })
            .filter(function (cells) { return cells.length > 0; });""", container)


def _severe(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


class Counting:
    """The real dashboard, counting the Overview cards' refresh requests it answers."""

    def __init__(self, settings, store) -> None:
        self.app = create_app(settings, store)
        self.refreshes = 0
        self._lock = threading.Lock()

        @self.app.server.before_request
        def count() -> None:
            from flask import request
            if request.path == "/_dash-update-component" and b"overview-cards" in request.get_data():
                with self._lock:
                    self.refreshes += 1

        self.server = DashboardServer(self.app, "127.0.0.1", 0)


@pytest.fixture
def counting(settings, store, monkeypatch) -> Iterator[Counting]:
    monkeypatch.setattr(components, "REFRESH_MS", 400)  # read by every page's layout
    served = Counting(settings, store)
    served.server.start()
    yield served
    served.server.shutdown()


def test_overview_with_thousands_of_groups_shows_the_top_n_and_one_other_row(browser, dashboard, store):
    from servelens.dashboard.pages import overview  # imported by the app (Dash Pages)

    generate(store.client(), REQUESTS, GROUPS)
    browser.get(f"{dashboard.url}/")
    _wait(browser, lambda d: len(_cells(d, "overview-cost")) == overview.TOP_N + 1
          and len(_cells(d, "overview-latency")) == overview.TOP_N + 1 and d.execute_script(OVERVIEW_DRAWN_JS))
    _wait(browser, lambda d: _text(d, "ov-requests") == f"{REQUESTS:,}")

    cost, latency = _cells(browser, "overview-cost"), _cells(browser, "overview-latency")
    assert cost[-1][0] == f"other ({GROUPS - overview.TOP_N:,} more)"
    assert sum(int(row[1].replace(",", "")) for row in cost) == REQUESTS  # the other row holds the rest
    assert latency[-1][0] == f"other ({GROUPS - overview.TOP_N:,} more)" and latency[-1][3] == components.NULL
    assert f"Top {overview.TOP_N} of 5,000 tenants by cost" in _text(browser, "overview-cost")
    assert components.NOT_SUMMABLE in _text(browser, "overview-latency")
    browser.set_window_size(1440, browser.execute_script("return document.documentElement.scrollHeight") + 200)
    browser.save_screenshot(SCREENSHOT)

    # The filter box narrows the groups on the server.
    search = browser.find_element(By.ID, "overview-cost-search")
    search.send_keys("tenant-4999\n")
    _wait(browser, lambda d: [row[0] for row in _cells(d, "overview-cost")] == ["tenant-4999"])
    assert "1 tenants" in _text(browser, "overview-cost")
    assert _severe(browser) == []


def test_every_page_draws_under_the_csp_with_a_clean_console(browser, dashboard, store):
    generate(store.client(), 2000, 500)
    charts = {"/latency": "#lat-ts-p99", "/workload": "#wl-ts-arrivals", "/reliability": "#rel-chart"}  # model-N: unpriced
    for path in PAGES:
        browser.get(f"{dashboard.url}{path}")
        _wait(browser, lambda d: d.execute_script(IDLE_JS))
        if path in charts:  # plotly.js draws under the policy too
            _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"{charts[path]} .js-plotly-plot .main-svg"))
        assert not browser.find_elements(By.CSS_SELECTOR, ".alert"), path
        severe = _severe(browser)
        assert severe == [], (path, severe)  # a CSP violation is logged as SEVERE, source "security"


def test_refreshes_pause_while_the_window_is_hidden(browser, counting):
    browser.get(f"{counting.server.url}/")
    _wait(browser, lambda d: counting.refreshes >= 3)  # ticking every 0.4 s
    browser.minimize_window()  # headless Chromium reports the page hidden, as a background tab
    assert browser.execute_script("return document.visibilityState") == "hidden"
    time.sleep(0.6)  # one tick may have been on its way: let what it started finish
    _wait(browser, lambda d: d.execute_script(IDLE_JS))
    paused = counting.refreshes
    time.sleep(2.5)
    assert counting.refreshes == paused
    browser.maximize_window()
    started = time.monotonic()
    _wait(browser, lambda d: counting.refreshes > paused, timeout=5)
    assert time.monotonic() - started < 1.5  # one tick at once when it shows again
    _wait(browser, lambda d: counting.refreshes > paused + 2, timeout=5)  # and it ticks on


def test_attribute_values_show_as_text_in_charts(browser, dashboard, store):
    literal = HOSTILE_NAME.replace("'", "\\'")
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT now64(9) - toIntervalSecond(60 + number), lower(hex(cityHash64(number, 1))),
               lower(hex(cityHash64(number, 2))), '', 'chat', 'SPAN_KIND_CLIENT', 'chat-api',
               map('gen_ai.operation.name', 'chat',
                   'gen_ai.request.model', if(number % 2 = 0, '{literal}', 'plain-model'),
                   'gen_ai.usage.input_tokens', '100', 'gen_ai.usage.output_tokens', '20'),
               1000000000, 'STATUS_CODE_OK'
        FROM numbers(6)""")  # two models: a legend
    browser.get(f"{dashboard.url}/latency")
    chart = "#lat-ts-p99"  # p99 over time, a line per model: the model's name in the legend
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"{chart} .js-plotly-plot .legendtext"))
    names = [t.get_attribute("textContent") for t in browser.find_elements(By.CSS_SELECTOR, f"{chart} .legendtext")]
    assert HOSTILE_NAME in names  # the characters as typed, not a link and bold text
    assert browser.find_elements(By.CSS_SELECTOR, f"{chart} svg a") == []
    assert not [t for t in browser.find_elements(By.CSS_SELECTOR, f"{chart} svg tspan")
                if "bold" in (t.get_attribute("style") or "") or t.get_attribute("font-weight")]
    assert ESCAPED not in " ".join(names)  # escaped once: no entity left showing
    assert _severe(browser) == []
