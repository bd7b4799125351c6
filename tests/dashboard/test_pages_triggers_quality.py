"""The Quality and Triggers pages over real stored history.

ClickHouse writes the history (bench/history.py): evaluation results in
which one task type's pass rate halves against the baseline day, and two error-rate spikes
that the real trigger engine turns into episodes, one resolved and one still active. The
expected numbers are read back from the tables with SQL of the test's own. The pages'
fetch and render run on the real store first (no browser); one browser test then opens
/triggers?id=… as an alert links to it, and /quality.
"""

from __future__ import annotations

import importlib
import json
import shutil
from datetime import datetime, timezone
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from bench.history import HOUR, Traffic, insert
from servelens.analytics.query import iso
from servelens.analytics.triggers import engine
from servelens.dashboard import data
from servelens.dashboard.app import create_app
from servelens.dashboard.components import pct
from tests.dashboard.conftest import PRICING, component_texts
from tests.dashboard.test_browser import CHROMEDRIVER, CHROMIUM, _text, browser  # noqa: F401 - the fixture
from tests.dashboard.test_pages import _finish, _open, _plots, _row, _wait

pytestmark = pytest.mark.integration

SPIKE = Traffic(per_hour=300, error_share=0.3)


@pytest.fixture
def settings(make_settings):
    # A one-day baseline: history of two days is enough for both the report and the detector.
    return make_settings(pricing=PRICING, triggers={"baseline": "1d"})


def _insert_evaluations(store: Any, hour: datetime) -> None:
    """rag-api's results: summarize passes 90 % in the baseline day and 40 % in the last one;
    qa passes 90 % in both. Baseline [hour-46h, hour-26h), window [hour-22h, hour-2h)."""
    for seed, (task, now_rate) in enumerate((("summarize", 0.4), ("qa", 0.9))):
        traffic = Traffic(service="rag-api", per_hour=20, task_type=task)
        insert(store, hour - 46 * HOUR, hour - 26 * HOUR, traffic, seed=100 + seed, pass_rate=0.9)
        insert(store, hour - 22 * HOUR, hour - 2 * HOUR, traffic, seed=110 + seed, pass_rate=now_rate)


def _insert_spikes(store: Any, hour: datetime) -> None:
    """chat-api spikes in [hour-3h, hour-2h) only; embed-api from hour-4h on. chat-api's
    quiet hours hold the 282 attempts error_rate_spike pools for, so each window is judged
    alone and the spike clears with its window."""
    start = hour - 28 * HOUR
    insert(store, start, hour - 3 * HOUR, Traffic(per_hour=300), seed=1)
    insert(store, hour - 3 * HOUR, hour - 2 * HOUR, SPIKE, seed=2)
    insert(store, hour - 2 * HOUR, hour, Traffic(per_hour=300), seed=3)
    insert(store, start, hour - 4 * HOUR, Traffic(service="embed-api", per_hour=100), seed=4)
    insert(store, hour - 4 * HOUR, hour, Traffic(service="embed-api", per_hour=300, error_share=0.3), seed=5)


@pytest.fixture
def pages(settings) -> tuple[Any, Any]:
    """The quality and triggers page modules: Dash Pages imports them for an app, not before."""
    create_app(settings, None)
    return importlib.import_module("servelens.dashboard.pages.quality"), importlib.import_module("servelens.dashboard.pages.triggers")


@pytest.fixture
def history(store, settings) -> dict[str, Any]:
    """The stored history and the episodes the engine made of it, by service."""
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    _insert_evaluations(store, hour)
    _insert_spikes(store, hour)
    for ends in (4, 3, 2, 1, 0):  # chat-api: quiet, spike, then two clear windows resolve it
        engine.evaluate(store, settings, hour - ends * HOUR, kinds=["error_rate_spike"])
    episodes = {t["subject"]["service"]: t for t in engine.list_triggers(store, hour - 2 * 24 * HOUR, hour)}
    assert sorted(episodes) == ["chat-api", "embed-api"]
    return {"hour": hour, "episodes": episodes}


def _pass_rates(store: Any, since: datetime, until: datetime) -> dict[str, tuple[int, float]]:
    """task type -> (evaluations, pass rate) over [since, until), joined here by (trace, span)."""
    result = store.client().query(
        "SELECT r.TaskType, count(), avg(e.Passed) FROM evaluations AS e "
        "INNER JOIN llm_requests AS r ON e.TraceId = r.TraceId AND e.SpanId = r.SpanId "
        "WHERE e.Timestamp >= {since:DateTime64(9, 'UTC')} AND e.Timestamp < {until:DateTime64(9, 'UTC')} "
        "GROUP BY r.TaskType", parameters={"since": since, "until": until})
    return {task: (n, rate) for task, n, rate in result.result_rows}


def _errors(store: Any, service: str, since: datetime, until: datetime) -> tuple[int, int]:
    return store.client().query(
        "SELECT countIf(IsError), count() FROM llm_requests WHERE ServiceName = {service:String} "
        "AND Timestamp >= {since:DateTime64(9, 'UTC')} AND Timestamp < {until:DateTime64(9, 'UTC')}",
        parameters={"service": service, "since": since, "until": until}).first_row


texts = component_texts  # every string in a rendered component tree, depth first


# --- fetch and render, no browser -------------------------------------------------------------

def test_quality_puts_the_regressed_slice_first_with_its_numbers(pages, store, settings, history):
    quality, _ = pages
    hour = history["hour"]
    window = _pass_rates(store, hour - 22 * HOUR, hour - 2 * HOUR)
    baseline = _pass_rates(store, hour - 46 * HOUR, hour - 26 * HOUR)
    source = data.DataSource(settings, store)

    by, top = quality.fetch(source, data.Filters(), None, None)
    rows = top.rows
    assert by == "task_type" and [quality.slice_label(r) for r in rows] == ["summarize", "qa"]
    summarize, qa = rows
    assert summarize["regressed"] is True and qa["regressed"] is False
    assert summarize["evaluations"] == window["summarize"][0] == 400
    assert summarize["pass_rate"] == pytest.approx(window["summarize"][1])
    assert summarize["baseline_pass_rate"] == pytest.approx(baseline["summarize"][1])
    assert summarize["delta"] == pytest.approx(window["summarize"][1] - baseline["summarize"][1])

    note, total, table, chart, updated = quality.render((by, top), data.Filters())
    assert texts(note) == [("Pass rate regressed against the baseline: summarize "
                            f"({pct(baseline['summarize'][1])} → {pct(window['summarize'][1])})")]
    assert total == "800 evaluations in 2 slices, 1 regressed"
    first_row, second_row = (list(row.values()) for row in table.children[0].data)  # the top-N DataTable
    assert first_row[0] == "summarize" and first_row[-1] == "regressed" and pct(window["summarize"][1]) in first_row
    assert "regressed" not in second_row
    window_bars, regressed_bars, baseline_bars = chart.figure.data
    assert [bar.name for bar in chart.figure.data] == ["last 24 h", "regressed", "baseline"]
    assert list(window_bars.y) == ["summarize", "qa"]
    assert list(regressed_bars.x) == [summarize["pass_rate"], None]  # red: summarize only
    assert list(window_bars.x) == [None, qa["pass_rate"]]
    assert list(baseline_bars.x) == [summarize["baseline_pass_rate"], qa["baseline_pass_rate"]]
    assert "by task type" in updated

    # Another service's results are not this one's: the empty state says how to send some.
    _, none = quality.fetch(source, data.Filters(service="chat-api"), "task_type", None)
    assert none.rows == []
    shown = quality.render(("task_type", none), data.Filters(service="chat-api"))
    assert quality.regressed_note(none.rows) is None and shown[1] == ""
    assert "gen_ai.evaluation.result" in texts(shown[2])[0] and "/api/v1/evaluations" in texts(shown[3])[0]


def test_triggers_lists_active_first_and_opens_the_linked_episode(pages, store, settings, history):
    _, triggers = pages
    hour, episodes = history["hour"], history["episodes"]
    chat, embed = episodes["chat-api"], episodes["embed-api"]
    assert (chat["state"], chat["started_at"], chat["resolved_at"]) == ("resolved", iso(hour - 3 * HOUR),
                                                                        iso(hour - 2 * HOUR))
    assert (embed["state"], embed["started_at"]) == ("active", iso(hour - 4 * HOUR))
    source = data.DataSource(settings, store)

    # list_triggers puts chat-api first (detected later); the page puts the active one first.
    episode_id, listed, selected, evaluated = triggers.fetch(source, data.Filters(), embed["id"], None)
    assert evaluated == hour  # the history's last window
    assert [t["id"] for t in listed] == [embed["id"], chat["id"]] and episode_id == embed["id"]
    errors, attempts = _errors(store, "embed-api", hour - HOUR, hour)  # the latest window's evidence
    assert (selected["evidence"]["errors"], selected["evidence"]["attempts"]) == (errors, attempts)

    panel, total, listing, _ = triggers.render((episode_id, listed, selected, evaluated), data.Filters())
    table = listing.children[0]
    evidence = json.loads(next(c for c in panel.children if getattr(c, "id", None) == "trg-evidence").children)
    assert evidence == selected["evidence"]
    assert panel.children[0].children == "error_rate_spike · service=embed-api"
    assert total == f"2 episodes, 1 active; trigger windows evaluated up to {hour:%Y-%m-%d %H:%M} UTC"
    assert triggers.totals([], None) == ("No episode in this window; no trigger window evaluated yet (the analytics "
                                         "role evaluates each one as it closes).")
    first, second = (texts(row) for row in table.children[1].children)
    assert first[:4] == ["error_rate_spike", "service=embed-api", "active", embed["severity"]]
    assert first[4] == f"{hour - 4 * HOUR:%Y-%m-%d %H:%M} UTC" and first[6] == "—"
    assert second[2] == "resolved" and second[6] == f"{hour - 2 * HOUR:%Y-%m-%d %H:%M} UTC"
    assert table.children[1].children[0].children[0].children.href == f"/triggers?id={embed['id']}"

    # A service filter leaves the other service's episode out, not the linked one.
    _, listed, selected, _ = triggers.fetch(source, data.Filters(service="chat-api"), embed["id"], None)
    assert [t["id"] for t in listed] == [chat["id"]] and selected["id"] == embed["id"]
    # Outside the window (resolved 2 h ago, the last hour shown) the link still finds it.
    _, listed, selected, _ = triggers.fetch(source, data.Filters(range="1h"), chat["id"], None)
    assert [t["id"] for t in listed] == [embed["id"]] and selected["id"] == chat["id"]
    missing = triggers.render(triggers.fetch(source, data.Filters(), "nope", None), data.Filters())[0]
    assert missing.children == "No trigger episode with id nope."


def test_in_scope_drops_only_subjects_naming_another_value(pages):
    _, triggers = pages
    filters = data.Filters(service="chat-api", deployment="llama-prod")
    assert triggers.in_scope({"service": "chat-api"}, filters)
    assert triggers.in_scope({"deployment": "llama-prod"}, filters)
    assert triggers.in_scope({"task_type": "summarize", "language": "de"}, filters)
    assert not triggers.in_scope({"deployment": "mistral-prod"}, filters)
    assert not triggers.in_scope({"service": "embed-api"}, filters)
    assert triggers.in_scope({"service": "embed-api"}, data.Filters())


# --- in the browser ---------------------------------------------------------------------------

@pytest.mark.browser
@pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                    reason="needs Debian's chromium and chromium-driver")
def test_alert_link_and_quality_page_in_the_browser(browser, dashboard, store, history, tmp_path):
    embed = history["episodes"]["embed-api"]
    hour = history["hour"]
    errors, attempts = _errors(store, "embed-api", hour - HOUR, hour)

    _open(browser, f"{dashboard.url}/triggers?id={embed['id']}", lambda d: embed["id"] in _text(d, "trg-episode"))
    evidence = _text(browser, "trg-evidence")
    assert f'"errors": {errors},' in evidence and f'"attempts": {attempts},' in evidence
    assert "error_rate_spike · service=embed-api" in _text(browser, "trg-episode")
    rows = browser.find_elements(By.CSS_SELECTOR, "#trg-table tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[2].text for r in rows] == ["active", "resolved"]
    assert [a.text for a in browser.find_elements(By.CSS_SELECTOR, ".nav-link")] == [
        "Overview", "Latency & stages", "Cost", "GPUs", "Quality", "Workload", "Reliability", "Triggers",
        "Traces", "SLOs", "Plan", "Ingest", "Admin"]
    _finish(browser, "triggers", tmp_path)

    window = _pass_rates(store, hour - 22 * HOUR, hour - 2 * HOUR)
    _open(browser, f"{dashboard.url}/quality", lambda d: "regressed" in _row(d, "qual-table", "summarize"))
    assert pct(window["summarize"][1]) in _row(browser, "qual-table", "summarize")
    assert "summarize" in _text(browser, "qual-regressed")
    _wait(browser, _plots("#qual-chart"))
    _finish(browser, "quality", tmp_path)
