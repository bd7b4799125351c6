"""Charts over time in a real headless Chromium: every page draws its series, their
numbers are the store's, and dragging across a chart sets the global range."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.support.ui import WebDriverWait

from tests.dashboard.conftest import make_traffic, send
from tests.dashboard.test_browser import browser  # noqa: F401 - the fixture
from tests.dashboard.test_browser import pytestmark  # noqa: F401 - browser + integration marks

TRAFFIC = make_traffic(40, seed=11, ago=(120, 5 * 3600))

# page path -> {panel id: the trace names its chart must draw}
PAGES = {
    "/": {"overview-ts-requests": {"requests"}, "overview-ts-rates": {"errors", "retries"},
          "overview-ts-latency": {"TTFT p50", "TTFT p99", "latency p50", "latency p95", "latency p99"},
          "overview-ts-cost": {"spend"}},
    "/latency": {"lat-ts-drift": {"p50", "p95", "p99"}},
    "/cost": {"cost-ts-per-request": {"per request"}},
    "/workload": {"wl-ts-tokens": {"input", "output"}},
    "/reliability": {"rel-ts-rates": {"errors", "retries", "fallbacks"}},
}

# The traces of the Plotly graph inside a panel, once drawn: [{name, x, y}], else null.
# No callback queued or running: the page is drawn and nothing will replace its graphs.
IDLE_JS = """
const s = window.store && window.store.getState();
if (!s || !s.callbacks) { return false; }
return ['requested', 'prioritized', 'blocked', 'executing', 'watched', 'executed', 'stored']
    .every(q => s.callbacks[q].length === 0);
"""
TRACES_JS = """
const gd = document.querySelector('#' + CSS.escape(arguments[0]) + ' .js-plotly-plot');
if (!gd || !gd.data || !gd._fullLayout) { return null; }
return gd.data.map(t => ({name: t.name, x: t.x, y: t.y}));
"""


def _traces(driver, panel_id):
    try:
        return driver.execute_script(TRACES_JS, panel_id)
    except StaleElementReferenceException:
        return None


def test_every_page_charts_its_numbers_over_time(browser, dashboard, otlp_http, store):  # noqa: F811
    send(otlp_http, TRAFFIC)
    total = store.client().command("SELECT count() FROM llm_requests")
    assert total == len(TRAFFIC)
    wait = WebDriverWait(browser, 20, poll_frequency=0.2)
    for path, panels in PAGES.items():
        browser.get(f"{dashboard.url}{path}")
        for panel_id, names in panels.items():
            traces = wait.until(lambda d, p=panel_id: _traces(d, p), message=f"{path} {panel_id}")
            assert {t["name"] for t in traces} == names, (path, panel_id)
            assert all(len(t["x"]) == len(t["y"]) > 0 for t in traces)
    # the requests chart adds up to the stored requests, bucket by bucket
    browser.get(f"{dashboard.url}/")
    (requests,) = wait.until(lambda d: _traces(d, "overview-ts-requests"))
    assert sum(v or 0 for v in requests["y"]) == total
    times = [datetime.fromisoformat(x.replace("Z", "+00:00")) for x in requests["x"]]
    assert times == sorted(times) and times[-1] - times[0] >= timedelta(hours=20)  # the 24 h range


def test_dragging_across_a_chart_sets_the_range_for_every_page(browser, dashboard, otlp_http, store):  # noqa: F811
    send(otlp_http, TRAFFIC)
    wait = WebDriverWait(browser, 20, poll_frequency=0.2)
    browser.get(f"{dashboard.url}/")
    wait.until(lambda d: _traces(d, "overview-ts-requests") and d.execute_script(IDLE_JS))
    until = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    since = until - timedelta(hours=2)
    # what a drag does: Plotly relayouts the x axis to the selection (again, should a
    # refresh have replaced the graph in between)
    drag = ("const gd = document.querySelector('#overview-ts-requests .js-plotly-plot');"
            "Plotly.relayout(gd, {'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1]});")
    typed = f"{since:%Y-%m-%d %H:%M:%S}"
    for _ in range(5):
        browser.execute_script(drag, typed, f"{until:%Y-%m-%d %H:%M:%S}")
        try:
            WebDriverWait(browser, 3, poll_frequency=0.1).until(
                lambda d: d.find_element("id", "filter-from").get_attribute("value") == typed)
            break
        except TimeoutException:
            continue
    header = f"{since:%Y-%m-%d %H:%M} – {until:%Y-%m-%d %H:%M} UTC"
    wait.until(lambda d: header in (d.find_element("id", "overview-updated").text or ""),
               message=f"header never showed {header}")
    want = store.client().query(
        "SELECT count() FROM llm_requests WHERE Timestamp >= {a:DateTime64(9)} AND Timestamp < {b:DateTime64(9)}",
        parameters={"a": since.replace(tzinfo=None), "b": until.replace(tzinfo=None)}).result_rows[0][0]
    wait.until(lambda d: d.find_element("id", "ov-requests").text == str(want), message=f"requests != {want}")
    # the range holds on another page
    browser.find_element("xpath", "//a[text()='Reliability']").click()
    wait.until(lambda d: header in (d.find_element("id", "rel-updated").text or ""))


@pytest.mark.parametrize("path", ["/gpus", "/quality", "/triggers"])
def test_pages_without_their_data_say_so(browser, dashboard, path):  # noqa: F811
    """No GPU samples, evaluations or episodes: a note in place of an empty chart."""
    browser.get(f"{dashboard.url}{path}")
    WebDriverWait(browser, 20, poll_frequency=0.2).until(
        lambda d: any(e.text for e in d.find_elements("css selector", ".panel .empty")))


def test_a_click_on_a_bucket_opens_its_requests(browser, dashboard, otlp_http, store):  # noqa: F811
    send(otlp_http, TRAFFIC)
    wait = WebDriverWait(browser, 20, poll_frequency=0.2)
    browser.get(f"{dashboard.url}/")
    traces = wait.until(lambda d: _traces(d, "overview-ts-requests") and d.execute_script(IDLE_JS)
                        and _traces(d, "overview-ts-requests"))
    ys = traces[0]["y"]
    busiest = max(range(len(ys)), key=lambda i: ys[i] or 0)
    # what Plotly emits for a click on that point
    browser.execute_script(
        "const gd = document.querySelector('#overview-ts-requests .js-plotly-plot');"
        "const i = arguments[0];"
        "const x = gd.data[0].x[i].replace('T', ' ').replace('Z', '');"  # as Plotly writes a date axis' x
        "gd.emit('plotly_click', {points: [{curveNumber: 0, pointNumber: i, pointIndex: i, x: x,"
        " y: gd.data[0].y[i]}]});", busiest)
    wait.until(lambda d: "/traces?" in d.current_url, message="the click did not open the Traces page")
    since = datetime.fromisoformat(traces[0]["x"][busiest].replace("Z", "+00:00"))
    assert "since=" in browser.current_url and "until=" in browser.current_url
    # the bucket's requests are the ones listed (the search's own API, same parameters)
    query = browser.current_url.split("?", 1)[1]
    from tests.dashboard.conftest import http
    status, _, body = http("GET", f"{dashboard.url}/api/v1/traces?{query}&limit=500")
    assert status == 200 and len(body["traces"]) == ys[busiest]
    assert all(since <= datetime.fromisoformat(t["start"].replace("Z", "+00:00")) for t in body["traces"])


def test_the_overview_reuses_the_schedulers_24_hour_binding_constraint(settings, store, otlp_http):
    """The last 24 h, unfiltered, is what the scheduler computes every interval: the
    Overview reads its binding constraint from there while fresh, else computes it."""
    from servelens.analytics import scheduler
    from servelens.dashboard import data
    from servelens.dashboard.app import create_app

    create_app(settings, store)  # registers the pages
    from servelens.dashboard.pages import overview

    send(otlp_http, TRAFFIC)
    source = data.DataSource(settings, store)
    live, as_of = overview.fetch_binding(source, data.Filters())
    assert as_of is None and live == "decode"  # nothing scheduled yet: computed now
    ran = datetime.now(timezone.utc)
    scheduler.run_all(store, settings, scheduled=True)
    stored, as_of = overview.fetch_binding(source, data.Filters())
    assert stored == live and as_of is not None
    assert ran - as_of <= settings.analytics.interval  # the window that closed last when it ran
    # a filtered or other range is computed live
    assert overview.fetch_binding(source, data.Filters(range="6h"))[1] is None
    assert overview.fetch_binding(source, data.Filters(service="chat-api"))[1] is None


def test_a_scheduled_run_over_an_empty_store_is_not_read(settings, store, otlp_http):
    """The first scheduled run after a start can come before any traffic landed: its answer
    saw no request, and the Overview computes the binding constraint instead of showing
    that empty answer for two intervals."""
    from servelens.analytics import scheduler
    from servelens.dashboard import data
    from servelens.dashboard.app import create_app

    create_app(settings, store)
    from servelens.dashboard.pages import overview

    scheduler.run_all(store, settings, scheduled=True)  # nothing stored yet
    send(otlp_http, TRAFFIC)
    found, as_of = overview.fetch_binding(data.DataSource(settings, store), data.Filters())
    assert as_of is None and found == "decode"
