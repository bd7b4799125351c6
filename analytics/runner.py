"""Run the report jobs over stored data, on a schedule or on demand.

Scheduled runs compute each report for the window ending at the last `analytics.interval`
boundary (the default 24 h window), so every process pointed at one store computes the
same windows; a lease (analytics_leases) lets exactly one of them compute each window,
and results replace, never double (analytics_results is keyed by report and window).
On-demand runs (`POST /api/v1/analytics/run`, `servelens analytics --once`) compute the
window ending now.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from analytics import memo, reports
from analytics.query import DEFAULT_WINDOW, ReportQuery, iso
from servelens.config import Settings

log = logging.getLogger(__name__)

LEASE_SECONDS = 600  # a claim without a result after this long is presumed dead


def runner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def aligned(now: datetime, interval: timedelta) -> datetime:
    step = max(1, int(interval.total_seconds()))
    return datetime.fromtimestamp(int(now.timestamp()) // step * step, tz=timezone.utc)


class Leases:
    def __init__(self, store: Any, owner: str) -> None:
        self._store = store
        self.owner = owner

    def acquire(self, report: str, until: datetime, now: datetime) -> bool:
        client = self._store.client()
        params = {"report": report, "until": until}
        latest = client.query(
            "SELECT attempt, acquired_at FROM analytics_leases WHERE report = {report:String} "
            "AND until = {until:DateTime64(3)} ORDER BY attempt DESC LIMIT 1", parameters=params).first_row
        if latest is not None:
            done = client.query(
                "SELECT count() FROM analytics_results WHERE report = {report:String} "
                "AND until = {until:DateTime64(3)}", parameters=params).first_row[0]
            acquired_at = latest[1].replace(tzinfo=timezone.utc)
            if done or (now - acquired_at).total_seconds() < LEASE_SECONDS:
                return False
        attempt = 0 if latest is None else latest[0] + 1
        client.insert("analytics_leases", [[report, until, attempt, self.owner, now]],
                      column_names=["report", "until", "attempt", "owner", "acquired_at"],
                      settings={"insert_deduplication_token": f"lease:{report}:{until.isoformat()}:{attempt}"})
        winner = client.query(
            "SELECT owner FROM analytics_leases WHERE report = {report:String} AND until = {until:DateTime64(3)} "
            "AND attempt = {attempt:UInt32} LIMIT 1", parameters={**params, "attempt": attempt}).first_row
        return winner is not None and winner[0] == self.owner


def run_all(store: Any, settings: Settings, now: datetime | None = None, scheduled: bool = False,
            owner: str | None = None) -> dict[str, Any]:
    """{"jobs": {name: {"rows": n, "seconds": s}}} as SPEC 5's analytics/run returns it.

    Scheduled runs skip the reports another runner holds the window of ("skipped": true).
    """
    now = now or datetime.now(timezone.utc)
    owner = owner or runner_id()
    until = aligned(now, settings.analytics.interval) if scheduled else now
    leases = Leases(store, owner)
    jobs: dict[str, Any] = {}
    # The jobs share one window: what several of them need (GPU frames, stage quantiles)
    # is computed once (analytics.memo) and dropped when the run ends.
    with memo.run():
        for name, (_job, default_by) in reports.REPORTS.items():
            if scheduled and not leases.acquire(name, until, now):
                jobs[name] = {"rows": 0, "seconds": 0.0, "skipped": True}
                continue
            started = time.perf_counter()
            q = ReportQuery(until - DEFAULT_WINDOW, until, default_by)
            frame = reports.compute(name, store, settings, q)
            store.client().insert(
                "analytics_results",
                [[name, q.since, q.until, datetime.now(timezone.utc), owner, json.dumps(reports.to_records(frame))]],
                column_names=["report", "since", "until", "computed_at", "owner", "rows"])
            jobs[name] = {"rows": frame.height, "seconds": round(time.perf_counter() - started, 4)}
    return {"jobs": jobs, "until": iso(until)}


class Scheduler:
    """Every `analytics.interval`: the report jobs for the latest aligned window, then the
    trigger windows that have closed (their episodes publish to the alert dispatcher)."""

    def __init__(self, store: Any, settings: Settings, dispatcher: Any = None) -> None:
        self._store = store
        self._settings = settings
        self._dispatcher = dispatcher
        self._owner = runner_id()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="analytics", daemon=True)
        self.last: dict[str, Any] | None = None

    def start(self) -> None:
        self._thread.start()

    def tick(self) -> None:
        from analytics.triggers.engine import evaluate_due  # triggers build on the reports

        self.last = run_all(self._store, self._settings, scheduled=True, owner=self._owner)
        evaluate_due(self._store, self._settings, self._dispatcher, owner=self._owner)

    def _loop(self) -> None:
        interval = self._settings.analytics.interval.total_seconds()
        while not self._stop.wait(interval):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a failed run must not stop the schedule
                log.exception("analytics run failed")

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
