"""Who evaluates triggers: the analytics runner, and a dashboard on its own, on the real store.

A `servelens dashboard` without an analytics process evaluates the triggers itself; beside
a live `servelens analytics` it stands by; two runners racing on one store announce each
episode transition once. The detector is a stand-in that fires in chosen windows (what it
finds is not under test here); leases, episodes, heartbeats and reports are the real ones.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from servelens.analytics import leases, scheduler
from servelens.analytics.leases import aligned
from servelens.analytics.scheduler import Scheduler
from servelens.analytics.triggers import engine
from servelens.analytics.triggers.base import Finding
from servelens.app.runtime import scheduler_role

HOUR = timedelta(hours=1)
# Window ends (hours) in the past, so every tick below is at a fixed, injected time.
H0 = aligned(datetime.now(timezone.utc), HOUR) - 12 * HOUR
FIRING = {H0 + HOUR, H0 + 2 * HOUR}  # the windows ending here fire; resolve_after 2 clears it by H0 + 4h


class Recording:
    """The dispatcher's surface the scheduler uses, recorded."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.restored: list[list[str]] = []
        self.retained: list[set[str]] = []

    def publish(self, trigger: dict[str, Any], transition: str) -> None:
        self.sent.append((transition, trigger["id"]))

    def restore(self, active: list[dict[str, Any]]) -> None:
        self.restored.append([t["id"] for t in active])

    def retain(self, ids: set[str]) -> None:
        self.retained.append(set(ids))


@pytest.fixture
def firing_detector(monkeypatch):
    def detect(store: Any, settings: Any, at: Any) -> list[Finding]:
        return [Finding("error_rate_spike", {"service": "chat-api"}, at.until in FIRING, "critical", "errors")]

    monkeypatch.setattr(engine, "DETECTORS", {"error_rate_spike": detect})
    # One cheap report stands for the jobs (their scheduling is what is exercised).
    monkeypatch.setattr(scheduler.reports, "REPORTS", {"workload": scheduler.reports.REPORTS["workload"]})


def tick_at(until: datetime) -> datetime:
    """A tick time at which the window ending at `until` is due (past its settle time)."""
    return until + timedelta(minutes=5)


def test_the_roles_by_command_and_config(make_settings) -> None:
    assert scheduler_role("up", make_settings()) == "runner"
    assert scheduler_role("analytics", make_settings()) == "runner"
    assert scheduler_role("collector", make_settings()) is None
    assert scheduler_role("dashboard", make_settings()) == "standby"
    assert scheduler_role("dashboard", make_settings(dashboard={"evaluate_triggers": "on"})) == "runner"
    assert scheduler_role("dashboard", make_settings(dashboard={"evaluate_triggers": "off"})) is None


def test_a_dashboard_alone_evaluates_the_triggers(store, make_settings, firing_detector) -> None:
    settings = make_settings(triggers={"catch_up": 1})
    alerts = Recording()
    dashboard = Scheduler(store, settings, alerts, standby=True)
    for hour in range(1, 5):
        dashboard.tick(tick_at(H0 + hour * HOUR))
    assert dashboard.running
    episodes = engine.list_triggers(store, H0 - HOUR, H0 + 6 * HOUR)
    assert [(t["kind"], t["state"]) for t in episodes] == [("error_rate_spike", "resolved")]
    assert alerts.sent == [("firing", episodes[0]["id"]), ("resolved", episodes[0]["id"])]
    assert alerts.restored == [[]]  # taking over: the open episodes (none yet) re-posted
    assert alerts.retained[-1] == set()  # resolved: nothing left to keep alive
    assert dashboard.last["jobs"]["workload"]["rows"] == 0  # the report jobs ran too


def test_a_dashboard_stands_by_while_an_analytics_runner_lives_and_takes_over_after(
        store, make_settings, firing_detector) -> None:
    settings = make_settings(triggers={"catch_up": 1})
    analytics_alerts, dashboard_alerts = Recording(), Recording()
    analytics = Scheduler(store, settings, analytics_alerts)
    dashboard = Scheduler(store, settings, dashboard_alerts, standby=True)

    for hour in (1, 2):  # both tick; the runner's heartbeat keeps the dashboard idle
        now = tick_at(H0 + hour * HOUR)
        analytics.tick(now)
        dashboard.tick(now + timedelta(seconds=1))
    assert not dashboard.running and dashboard_alerts.sent == [] and dashboard.last is None
    [episode] = engine.list_triggers(store, H0 - HOUR, H0 + 6 * HOUR, "active")
    assert analytics_alerts.sent == [("firing", episode["id"])]
    assert dashboard_alerts.retained == [set(), set()]  # keeps nothing alive while standing by

    # The runner stops: once its heartbeat is stale the dashboard evaluates the next windows,
    # first re-posting the open episode (Alertmanager), and resolves it, once.
    for hour in (3, 4):
        dashboard.tick(tick_at(H0 + hour * HOUR))
    assert dashboard.running
    assert dashboard_alerts.restored == [[episode["id"]]]
    assert dashboard_alerts.sent == [("resolved", episode["id"])]
    assert analytics_alerts.sent == [("firing", episode["id"])]
    [resolved] = engine.list_triggers(store, H0 - HOUR, H0 + 6 * HOUR)
    assert resolved["id"] == episode["id"] and resolved["state"] == "resolved"

    # The runner comes back: the dashboard stands by again at its next tick.
    analytics.tick(tick_at(H0 + 5 * HOUR))
    dashboard.tick(tick_at(H0 + 5 * HOUR) + timedelta(seconds=1))
    assert not dashboard.running


def test_two_runners_racing_on_one_store_announce_each_transition_once(store, make_settings, firing_detector) -> None:
    # `servelens analytics` and a dashboard with evaluate_triggers: on, ticking together.
    settings = make_settings(triggers={"catch_up": 1})
    recorders = [Recording(), Recording()]
    schedulers = [Scheduler(store, settings, r) for r in recorders]
    for hour in range(1, 5):
        now = tick_at(H0 + hour * HOUR)
        threads = [threading.Thread(target=s.tick, args=(now,)) for s in schedulers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    [episode] = engine.list_triggers(store, H0 - HOUR, H0 + 6 * HOUR)
    sent = sorted(recorders[0].sent + recorders[1].sent)
    assert sent == [("firing", episode["id"]), ("resolved", episode["id"])]
    done = store.client().query("SELECT count(), uniqExact(until) FROM analytics_results "
                                "WHERE report = {job:String}", parameters={"job": engine.JOB}).first_row
    assert done == (4, 4)  # every window evaluated by exactly one of them


@pytest.mark.integration
def test_servelens_dashboard_alone_evaluates_the_triggers(tmp_path) -> None:
    """The real command: `servelens dashboard` with no analytics process evaluates the due
    trigger window (and runs the report jobs) on analytics.interval, as a standby that
    found no runner alive; then the store shows its evaluation."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVELENS_")}
    env.update({"PYTHONPATH": str(root / "src"), "SERVELENS_ANALYTICS__INTERVAL": "1s"})
    data = tmp_path / "data"
    log = tmp_path / "dashboard.log"
    took_over = "this dashboard runs the reports and triggers"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "servelens", "dashboard", "--ui-port", "0", "--data-dir", str(data)],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
        try:
            # The tick that takes over runs the jobs and the triggers, then says so.
            deadline = time.monotonic() + 120
            while "analytics run until" not in log.read_text() and proc.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    text = log.read_text()
    assert took_over in text and "analytics run failed" not in text, text
    # chDB opens one data directory per process, and this one has the tests' own open.
    probe = (
        "import json, sys; from servelens.core.store import Store; from servelens.core.config import StoreConfig; "
        "s = Store(sys.argv[1], StoreConfig().database); c = s.client(); "
        "print(json.dumps([dict(c.query('SELECT report, count() FROM analytics_results GROUP BY report').result_rows), "
        f"c.command(\"SELECT count() FROM analytics_leases WHERE report = '{leases.HEARTBEAT}'\")]))")
    out = subprocess.run([sys.executable, "-c", probe, f"chdb://{data}"], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    reports, heartbeats = json.loads(out.strip().splitlines()[-1])
    assert reports.get(engine.JOB, 0) >= 1 and reports.get("workload", 0) >= 1, reports
    assert heartbeats == 0  # a standby never claims to be the runner


def test_a_stopping_scheduler_finishes_the_window_in_progress_and_starts_no_other(store, make_settings,
                                                                                   monkeypatch) -> None:
    """The process closes the store once the scheduler's shutdown returns (closing the embedded
    engine under a query crashed `up` on SIGINT): shutdown returns only after the window being
    evaluated ends, and no report or window starts once it is asked to stop."""
    settings = make_settings()
    in_window, release, evaluated = threading.Event(), threading.Event(), []

    def slow(store: Any, settings: Any, at: Any) -> list[Finding]:
        evaluated.append(at.until)
        in_window.set()
        release.wait(30)  # a window that takes a while, as on a loaded machine
        return []

    monkeypatch.setattr(engine, "DETECTORS", {"error_rate_spike": slow})
    monkeypatch.setattr(scheduler.reports, "REPORTS", {"workload": scheduler.reports.REPORTS["workload"]})
    monkeypatch.setattr(engine, "first_data", lambda _store: H0 - 6 * HOUR)  # several windows are due
    sched = Scheduler(store, settings)
    sched.start()
    assert in_window.wait(60), "the first due window started"
    stopping = threading.Thread(target=sched.shutdown, args=(0.2,))
    stopping.start()
    stopping.join(1.0)
    assert stopping.is_alive(), "shutdown waits for the window in progress"
    release.set()
    stopping.join(30)
    assert not stopping.is_alive() and not sched._thread.is_alive()
    assert len(evaluated) == 1, "no window started after the stop"

    stop = threading.Event()
    stop.set()
    assert scheduler.run_all(store, settings, stop=stop)["jobs"] == {}
    assert engine.catch_up(store, settings, stop=stop)["windows"] == []
