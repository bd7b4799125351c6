"""The page the browser is on comes in the first layout (dashboard/first_page.py): no routing
round trip before a page's refreshes, routing as before on navigation, and the page the
browser shows when the Referer names another."""

from __future__ import annotations

import json
import shutil
import threading
from typing import Any, Iterator

import pytest
from selenium.webdriver.common.by import By

from servelens.dashboard import first_page
from servelens.dashboard.app import create_app
from servelens.dashboard.server import DashboardServer
from tests.dashboard.conftest import make_traffic, send
from tests.dashboard.test_browser import CHROMEDRIVER, CHROMIUM, browser  # noqa: F401 - the fixture
from tests.dashboard.test_pages import _wait


def _find(node: Any, element_id: str) -> dict[str, Any] | None:
    """The component with id `element_id` in a layout's JSON."""
    if isinstance(node, dict):
        if node.get("props", {}).get("id") == element_id:
            return node
        children = node.get("props", {}).get("children")
        return _find(children, element_id) if children is not None else None
    if isinstance(node, list):
        for child in node:
            found = _find(child, element_id)
            if found is not None:
                return found
    return None


def _layout(client: Any, referrer: str | None) -> dict[str, Any]:
    headers = {"Referer": referrer} if referrer else {}
    response = client.get("/_dash-layout", headers=headers)
    assert response.status_code == 200
    return response.get_json()


def test_the_layout_request_carries_the_page_its_referer_names(settings, store):
    client = create_app(settings, store).server.test_client()
    client.get("/")  # Dash Pages sets its routing up at the first request

    layout = _layout(client, "http://localhost/cost")
    assert _find(layout, "cost-refresh") is not None  # the Cost page's own interval
    location = _find(layout, first_page.LOCATION)["props"]
    assert (location["pathname"], location["search"]) == ("/cost", "")
    assert _find(layout, first_page.STORE)["props"]["data"] == {"title": "Cost · servelens"}
    assert _find(layout, first_page.SHOWN_ID)["props"]["data"] == "/cost"

    # a query string reaches the page's layout as Dash Pages passes it
    layout = _layout(client, "http://localhost/traces?service=chat-api&status=error")
    assert _find(layout, first_page.LOCATION)["props"]["search"] == "?service=chat-api&status=error"
    assert _find(layout, first_page.SHOWN_ID)["props"]["data"] == "/traces?service=chat-api&status=error"

    # nothing to go by: Dash's empty container, routed in the browser as before
    for referrer in (None, "http://elsewhere.example/cost", "http://localhost/no-such-page", "not a url"):
        layout = _layout(client, referrer)
        assert not _find(layout, first_page.CONTENT)["props"].get("children"), referrer
        assert _find(layout, first_page.SHOWN_ID)["props"]["data"] is None
        assert "pathname" not in _find(layout, first_page.LOCATION)["props"]


@pytest.fixture
def served(settings, store) -> Iterator[tuple[DashboardServer, list[str]]]:
    """The dashboard, and the outputs of every callback request it answered, in order."""
    app = create_app(settings, store)
    outputs: list[str] = []
    lock = threading.Lock()

    @app.server.before_request
    def note() -> None:
        import flask

        if flask.request.path == "/_dash-update-component":
            with lock:
                outputs.append(json.loads(flask.request.get_data())["output"])

    server = DashboardServer(app, "127.0.0.1", 0)
    server.start()
    yield server, outputs
    server.shutdown()


def in_browser(test: Any) -> Any:
    for mark in (pytest.mark.browser, pytest.mark.integration,
                 pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                                    reason="needs Debian's chromium and chromium-driver")):
        test = mark(test)
    return test


def _routed(outputs: list[str]) -> int:
    return sum(first_page.CONTENT in output for output in outputs)


def _cost_drawn(driver: Any) -> bool:
    return bool(driver.find_elements(By.CSS_SELECTOR, "#cost-table table"))


@in_browser
def test_a_page_loads_without_routing_and_navigation_still_routes(browser, served, otlp_http):
    server, outputs = served
    send(otlp_http, make_traffic(10, seed=5, ago=(60, 3600)))
    browser.get(f"{server.url}/cost")
    _wait(browser, _cost_drawn)
    assert _routed(outputs) == 0, outputs
    assert browser.title == "Cost · servelens"

    browser.find_element(By.CSS_SELECTOR, "a.nav-link[href='/latency']").click()
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#lat-table table"))
    assert _routed(outputs) == 1
    assert not browser.find_elements(By.ID, "cost-table")


@in_browser
def test_a_referer_naming_another_page_still_shows_the_page_the_browser_is_on(browser, served, otlp_http):
    server, outputs = served
    send(otlp_http, make_traffic(10, seed=6, ago=(60, 3600)))
    # every request of this load claims to come from the Latency page
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Referer": f"{server.url}/latency"}})
    browser.get(f"{server.url}/cost")
    _wait(browser, _cost_drawn)
    assert _routed(outputs) == 1  # the check routed to the page the browser shows
    assert not browser.find_elements(By.ID, "lat-table")
    assert browser.current_url == f"{server.url}/cost"
