"""The SLOs page over real stored history: its table equals a hand count of the rows, its
chart draws each SLO's error budget remaining, and without SLOs it explains `slos:`.
fetch and render run on the real store first; then the page in a real headless Chromium."""

from __future__ import annotations

import importlib
import shutil
from datetime import datetime, timezone
from typing import Any

import pytest

from bench.history import HOUR, Traffic, insert
from servelens.dashboard import data
from servelens.dashboard.app import create_app
from servelens.dashboard.components import integer, pct
from tests.dashboard.conftest import PRICING
from tests.dashboard.test_browser import CHROMEDRIVER, CHROMIUM, _text, browser  # noqa: F401 - the fixture
from tests.dashboard.test_pages import _finish, _open, _plots, _row, _wait
from tests.dashboard.test_pages_triggers_quality import texts

pytestmark = pytest.mark.integration

SLOS = [{"name": "chat-availability", "service": "chat-api", "objective": 0.99, "period": "7d"},
        {"name": "chat-latency", "service": "chat-api", "objective": 0.9, "latency_under": "1s", "period": "7d"}]


@pytest.fixture
def settings(make_settings):
    return make_settings(pricing=PRICING, slos=SLOS)


@pytest.fixture
def page(settings) -> Any:
    create_app(settings, None)  # Dash Pages imports the page for an app, not before
    return importlib.import_module("servelens.dashboard.pages.slos")


@pytest.fixture
def history(store) -> datetime:
    """Two days of chat-api (2 % errors, ~19 % over 1 s) and an unrelated service, up to now."""
    now = datetime.now(timezone.utc)
    insert(store, now - 48 * HOUR, now, Traffic(per_hour=40, error_share=0.02))
    insert(store, now - 48 * HOUR, now, Traffic(service="other", per_hour=20, error_share=0.5), seed=1)
    return now


def _hand(store: Any, latency_under: float | None = None) -> tuple[int, int]:
    """(requests, bad) of chat-api over the last 7 days, counted here."""
    slow = " OR LatencySeconds > {lat:Float64}" if latency_under else ""
    return store.client().query(
        f"SELECT count(), countIf(IsError{slow}) FROM llm_requests WHERE ServiceName = 'chat-api' "
        "AND Timestamp >= now64(9) - INTERVAL 7 DAY", parameters={"lat": latency_under or 0.0}).first_row


def test_table_and_chart_are_the_hand_counted_slos(page, store, settings, history):
    source = data.DataSource(settings, store)
    rows, doc = page.fetch(source, data.Filters())
    by_name = {r["name"]: r for r in rows}
    for name, latency in (("chat-availability", None), ("chat-latency", 1.0)):
        n, bad = _hand(store, latency)
        r = by_name[name]
        assert (r["total"], r["bad"]) == (n, bad) and n > 1500
        assert r["error_budget_remaining"] == pytest.approx(1 - bad / ((1 - r["objective"]) * n))

    table, chart, updated = page.render((rows, doc), data.Filters())
    shown = [texts(tr) for tr in table.children[1].children]
    assert [row[0] for row in shown] == ["chat-availability", "chat-latency"]
    n, bad = _hand(store, 1.0)
    assert shown[1][2] == "90 % under 1,000 ms" and shown[1][4:6] == [integer(n), integer(bad)]
    assert shown[1][7] == pct(1 - bad / (0.1 * n))
    # the name links to the requests that spent the budget: the slow ones of a latency SLO
    link = table.children[1].children[1].children[0].children
    assert "service=chat-api" in link.href and "min_latency_ms=1000" in link.href
    lines = chart.figure["data"]
    assert [line["name"] for line in lines] == ["chat-availability", "chat-latency"]
    assert lines[0]["y"][-1] == pytest.approx(100 * by_name["chat-availability"]["error_budget_remaining"], rel=0.05)
    link = lines[0]["meta"]  # a click adds its bucket's since/until (test_timecharts clicks one)
    assert link["href"].startswith("/traces?") and "error=true" in link["href"] and link["step_s"] == 300
    assert "5m buckets" in updated and "24 h" in updated  # 288 points over the 24 h

    # A service filter leaves out SLOs of other services; the chart then has nothing to draw.
    _, none = page.fetch(source, data.Filters(service="other"))
    table, chart, _ = page.render(([], none), data.Filters(service="other"))
    assert texts(table) == ["No SLO applies to the selected service or deployment."]
    assert texts(chart) == [page.NO_REQUESTS]


def test_without_slos_the_page_explains_the_config(page, store, make_settings):
    source = data.DataSource(make_settings(), store)
    assert page.fetch(source, data.Filters()) is None
    table, chart, _ = page.render(None, data.Filters())
    assert table.id == "slo-empty" and "slos:" in texts(table)[0] and "objective: 0.999" in texts(table)[1]
    assert texts(chart) == ["Configure an SLO to chart its error budget."]


@pytest.mark.browser
@pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                    reason="needs Debian's chromium and chromium-driver")
def test_slos_page_in_the_browser(browser, dashboard, store, history, tmp_path):
    n, bad = _hand(store)
    attainment = f"{(n - bad) / n * 100:.2f} %"
    _open(browser, f"{dashboard.url}/slos", lambda d: attainment in _row(d, "slo-table", "chat-availability"))
    assert integer(n) in _row(browser, "slo-table", "chat-availability")
    assert "SLOs" in [a.text for a in browser.find_elements("css selector", ".nav-link")]
    _wait(browser, _plots("#slo-chart"))
    assert "Last 24 h" in _text(browser, "slo-updated")
    _finish(browser, "slos", tmp_path)
