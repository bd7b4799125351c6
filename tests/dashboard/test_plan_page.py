"""The Plan page over real stored history: its answer is Tier A's on the measured busiest hour
(analytics/plan/capacity.py); in a real headless Chromium, choosing more traffic changes the
replicas the target needs."""

from __future__ import annotations

import importlib
import shutil
import time
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from servelens.analytics.plan import capacity
from servelens.dashboard import data
from servelens.dashboard.app import create_app
from tests.analytics.test_plan_capacity import LLAMA, SINCE, UNTIL, _engine, _history
from tests.dashboard.conftest import table_rows
from tests.dashboard.test_browser import CHROMEDRIVER, CHROMIUM, _text, browser  # noqa: F401 - the fixture
from tests.dashboard.test_pages import _finish, _open, _plots, _row, _wait
from tests.dashboard.test_pages_triggers_quality import texts

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(make_settings):
    return make_settings(deployments=[LLAMA])


@pytest.fixture
def page(settings) -> Any:
    create_app(settings, None)  # Dash Pages imports the page for an app, not before
    return importlib.import_module("servelens.dashboard.pages.plan")


@pytest.fixture
def history(store) -> None:
    _history(store)
    _engine(store, instances=2, running=8)


def test_the_page_shows_tier_a_on_the_measured_hour(page, store, settings, history) -> None:
    source = data.DataSource(settings, store)
    filters = data.Filters(range="custom", since=SINCE.isoformat(), until=UNTIL.isoformat())
    doc = page.fetch(source, filters, "llama-prod", "p99_queue_ms", "50", "1", "1", "1")
    expected = capacity.plan(store, settings, {**filters.params(), "deployment": "llama-prod",
                                               "target": "p99_queue_ms:50"})
    assert doc["replicas_needed"] == expected["replicas_needed"] and doc["at"] == expected["at"]
    answer, listing, _chart, measured, _ = page.render(doc, filters)
    assert f"{doc['replicas_needed']} replicas" in texts(answer)[0]
    rows = table_rows(listing)
    assert [r[0] for r in rows if "now" in r[-1]] == [str(doc["measured"]["replicas"])]
    assert any("Backtest" in t for t in texts(measured))
    # A target no replica count can meet, and a range without traffic, are said plainly.
    bad = page.fetch(source, filters, "llama-prod", "p99_ttft_ms", "abc", "1", "1", "1")
    assert "target" in bad["error"]
    quiet = data.Filters(range="custom", since="2020-01-01T00:00:00Z", until="2020-01-02T00:00:00Z")
    empty_doc = page.fetch(source, quiet, "llama-prod", None, None, "1", "1", "1")
    assert "no requests" in empty_doc["error"]
    # the chart's panel says there is nothing to draw, not left blank as if still loading
    assert texts(page.render(empty_doc, quiet)[2]) == [page.NOTHING_TO_DRAW]


def test_without_deployments_the_page_explains_the_config(page, store, make_settings) -> None:
    source = data.DataSource(make_settings(), store)
    assert page.fetch(source, data.Filters(), None, None, None, None, None, None) is None
    answer, _, chart, *_ = page.render(None, data.Filters())
    assert "deployments:" in texts(answer)[0] and texts(chart) == [page.NOTHING_TO_DRAW]


@pytest.mark.browser
@pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                    reason="needs Debian's chromium and chromium-driver")
def test_more_traffic_changes_the_answers_in_the_browser(browser, dashboard, store, history, tmp_path) -> None:
    _open(browser, f"{dashboard.url}/plan", lambda d: "replicas" in _text(d, "plan-needed"))
    one = _row(browser, "plan-table", "1")  # one replica: its slot use and p99s
    browser.find_element(By.CSS_SELECTOR, "#plan-traffic input[value='3']").click()
    # the new row, not the moment the table is redrawn without one
    seen: dict[str, str] = {}
    _wait(browser, lambda d: seen.update(row=_row(d, "plan-table", "1")) or seen["row"] not in ("", one), timeout=30)
    use = [float(c.split()[0]) for c in (one.split()[1], seen["row"].split()[1])]
    assert use[1] == pytest.approx(3 * use[0], rel=0.01)  # three times the traffic, three times the slot use
    _wait(browser, _plots("#plan-chart"))
    assert "Plan" in [a.text for a in browser.find_elements(By.CSS_SELECTOR, ".nav-link")]
    _finish(browser, "plan", tmp_path)


def test_the_replay_runs_as_a_job_and_shows_its_backtest(page, store, settings, history) -> None:
    source = data.DataSource(settings, store)
    filters = data.Filters(range="custom", since=SINCE.isoformat(), until=UNTIL.isoformat())
    job, shown = page.start_replay(source, filters, "llama-prod", "on")
    assert job is not None and "Replaying" in texts(shown)[0]
    # One replay at a time: a second start while it runs is refused, said on the page.
    second, refused = page.start_replay(source, filters, "llama-prod", "off")
    assert (second is None and "running" in texts(refused)[0]) or source.jobs.get(job).state != "running"
    for _ in range(600):  # bounded: 120 s
        progress, result, stop = page.poll_replay(source, job)
        if stop:
            break
        assert 0 <= float(progress) <= 1
        time.sleep(0.2)
    assert stop and progress == "1", texts(result)
    shown = " ".join(texts(result))
    assert "Backtest:" in shown and "With autoscaling" in shown
    assert page.poll_replay(source, "unknown")[2] is True  # a job the server forgot: polling stops


@pytest.mark.browser
@pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                    reason="needs Debian's chromium and chromium-driver")
def test_the_replay_button_shows_progress_then_the_backtest(browser, dashboard, store, history, tmp_path) -> None:
    _open(browser, f"{dashboard.url}/plan", lambda d: "replicas" in _text(d, "plan-needed"))
    browser.find_element(By.ID, "plan-replay-start").click()
    # The replay runs at background priority (core/priority.py): 7.5 s alone, but with the
    # suite's other worker busy on both cores it once took over 120 s.
    _wait(browser, lambda d: "Backtest:" in _text(d, "plan-replay-verdict"), timeout=300)
    assert browser.find_element(By.ID, "plan-replay-progress").get_attribute("value") == "1"
    _finish(browser, "plan", tmp_path)
