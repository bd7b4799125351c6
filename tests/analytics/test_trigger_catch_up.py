"""Trigger windows evaluated on demand, after a gap, and replayed (issue: evaluation on demand).

A history back-filled into the store (nothing evaluated yet) is evaluated by `POST
/api/v1/analytics/run`, its alert delivered once through the real dispatcher to a webhook on
127.0.0.1; the windows that closed while no runner was up are evaluated when the scheduler
starts, not one interval later; `triggers replay` evaluates history into a result set of its
own, leaving the live episodes and sinks alone. Real embedded ClickHouse, real detectors.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from bench.history import HOUR, Traffic, insert
from servelens.analytics.alerts.dispatcher import Dispatcher
from servelens.analytics.leases import aligned
from servelens.analytics.scheduler import Scheduler
from servelens.analytics.triggers import engine, replay
from servelens.app import cli
from servelens.dashboard.app import create_app
from tests.analytics.test_triggers import Recorder, webhook  # noqa: F401 - the webhook fixture

pytestmark = pytest.mark.integration

SETTLE = timedelta(minutes=2)  # triggers.settle's default: a window counts as closed this long after its end
NOW = aligned(datetime.now(timezone.utc) - SETTLE, HOUR)  # the latest closed window's end
ONSET = NOW - 3 * HOUR  # errors jump from 0.5 % to 30 % here, and last until NOW


@pytest.fixture(autouse=True)
def _clock() -> None:
    """Read the latest closed window when each test starts: a suite runs for half an hour, and
    a clock read at import would be an hour stale in some of its tests."""
    global NOW, ONSET
    NOW = aligned(datetime.now(timezone.utc) - SETTLE, HOUR)
    ONSET = NOW - 3 * HOUR


def _history(store) -> None:
    insert(store, NOW - timedelta(days=3), ONSET, Traffic(per_hour=300))
    insert(store, ONSET, NOW, Traffic(per_hour=300, error_share=0.3), seed=1)


def _spikes(triggers: list[dict]) -> list[dict]:
    return [t for t in triggers if t["kind"] == "error_rate_spike"]


def test_analytics_run_evaluates_a_back_filled_history_and_alerts_once(store, make_settings, webhook) -> None:
    url, received = webhook
    settings = make_settings(triggers={"baseline": "2d", "catch_up": 4},
                             alerts={"sinks": [{"type": "webhook", "url": url}]})
    _history(store)
    assert engine.last_evaluated(store) is None  # nothing evaluated: a back-fill
    dispatcher = Dispatcher(settings)
    dispatcher.start()
    try:
        client = create_app(settings, store,
                            evaluate_triggers=lambda: engine.catch_up(store, settings, dispatcher)).server.test_client()
        first = client.post("/api/v1/analytics/run").get_json()
        # catch_up bounds it: the latest 4 closed windows, oldest first, the onset among them.
        assert first["jobs"]["triggers"]["windows"] == 4
        assert engine.last_evaluated(store) == NOW
        opened = [t for t in _spikes(first["jobs"]["triggers"]["changes"]) if t["state"] == "active"]
        assert [t["started_at"] for t in opened][:1] == [ONSET.isoformat().replace("+00:00", "Z")]
        again = client.post("/api/v1/analytics/run").get_json()
        assert again["jobs"]["triggers"]["windows"] == 0 and again["jobs"]["triggers"]["rows"] == 0
        deadline = time.monotonic() + 10
        while not _spikes(received) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a duplicate would arrive by now
    finally:
        dispatcher.shutdown(5)
    assert [(m["transition"], m["subject"]) for m in _spikes(received)] == [("firing", {"service": "chat-api"})]
    assert len({m["id"] for m in received}) == len(received)  # every episode announced once


def test_analytics_run_without_a_trigger_role_says_so(store, make_settings) -> None:
    client = create_app(make_settings(), store).server.test_client()
    body = client.post("/api/v1/analytics/run").get_json()
    assert body["jobs"]["triggers"]["rows"] == 0 and "evaluate_triggers" in body["jobs"]["triggers"]["skipped"]
    assert engine.last_evaluated(store) is None


def test_the_scheduler_evaluates_windows_closed_while_it_was_down_at_start(store, make_settings) -> None:
    settings = make_settings(triggers={"baseline": "2d"}, analytics={"interval": "1h"})
    _history(store)
    before = NOW - 6 * HOUR
    engine.evaluate(store, settings, before, kinds=["error_rate_spike"])  # the last window before the outage
    recorder = Recorder()
    scheduler = Scheduler(store, settings, recorder)
    scheduler.start()  # its interval is an hour: only a tick at start can evaluate the gap
    try:
        deadline = time.monotonic() + 120
        while (engine.last_evaluated(store) or before) < NOW and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        scheduler.shutdown(60)
    # An hour may close while the suite runs: the scheduler then evaluates that window too.
    latest = engine.last_evaluated(store)
    assert latest is not None and latest >= NOW
    evaluated = store.client().query(
        "SELECT count() FROM analytics_results WHERE report = 'triggers' AND until > {b:DateTime64(3)}",
        parameters={"b": before}).first_row[0]
    assert evaluated == (latest - before) // HOUR  # each window of the gap, once
    fired = [t for transition, t in recorder.sent if transition == "firing" and t["kind"] == "error_rate_spike"]
    assert [t["started_at"] for t in fired] == [ONSET.isoformat().replace("+00:00", "Z")]


def test_replay_evaluates_history_apart_from_the_live_episodes(store, make_settings, tmp_path, capsys) -> None:
    settings = make_settings(triggers={"baseline": "2d"})
    _history(store)
    seen: list[datetime] = []
    found = replay.replay(store, settings, NOW - 8 * HOUR, NOW, ["error_rate_spike"],
                          progress=lambda end, _n: seen.append(end))
    assert found["windows"] == 8 and seen == [NOW - 7 * HOUR + i * HOUR for i in range(8)]
    [spike] = _spikes(found["triggers"])
    assert spike["started_at"] == ONSET.isoformat().replace("+00:00", "Z")
    assert spike["state"] == "active" and spike["firing_windows"] == 3 and spike["subject"] == {"service": "chat-api"}
    # Nothing live was touched: no episode, no evaluated window, so the live engine starts afresh.
    assert store.client().query("SELECT count() FROM trigger_episodes").first_row[0] == 0
    assert engine.last_evaluated(store) is None
    stored = replay.load(store, found["replay"])
    assert stored["triggers"] == found["triggers"] and stored["windows"] == 8
    assert replay.load(store, "nope") is None

    # The command line: the same store through a config file, the replay listed and shown.
    config = tmp_path / "servelens.yaml"
    config.write_text(yaml.safe_dump({"store": {"clickhouse_url": settings.store_url,
                                                "database": settings.store.database}}))
    assert cli.main(["triggers", "replays", "--config", str(config), "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["replays"]
    assert [(r["replay"], r["episodes"], r["windows"]) for r in listed] == [(found["replay"], 1, 8)]
    assert cli.main(["triggers", "replays", found["replay"], "--config", str(config)]) == 0
    assert "error_rate_spike" in capsys.readouterr().out
    assert cli.main(["triggers", "replay", "--since", "2020-01-01T00:00:00Z", "--until", "2020-01-01T00:30:00Z",
                     "--config", str(config)]) == 2  # no whole window in it: a clear error
    assert "no whole, closed trigger window" in capsys.readouterr().err


def test_due_windows_start_at_the_history_when_nothing_was_evaluated(make_settings) -> None:
    s = make_settings()  # window 1h, settle 2m, catch_up 24
    now = datetime(2026, 3, 2, 10, 5, tzinfo=timezone.utc)
    assert engine.due_windows(s, now, None, now - 3 * HOUR) == [
        datetime(2026, 3, 2, h, tzinfo=timezone.utc) for h in (8, 9, 10)]
    assert len(engine.due_windows(s, now, None, now - timedelta(days=30))) == 24  # bounded by catch_up
    assert engine.due_windows(s, now, None, now) == [datetime(2026, 3, 2, 10, tzinfo=timezone.utc)]
