"""Run every report job over stored data: on demand (POST /api/v1/analytics/run) or on a
schedule (`servelens analytics`, and inside `servelens up`).

Each run computes each report for the default window (the last 24 h, each default
grouping) and replaces that report's rows in `analytics_results`, so re-running a window
replaces rather than doubles.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any

from analytics import reports
from analytics.query import ReportQuery, iso
from servelens.config import Settings

log = logging.getLogger(__name__)

_RESULTS_DDL = """
CREATE TABLE IF NOT EXISTS analytics_results (
    report LowCardinality(String),
    computed_at DateTime64(3),
    since DateTime64(3),
    until DateTime64(3),
    rows String
) ENGINE = ReplacingMergeTree(computed_at) ORDER BY report
"""


def run_all(store: Any, settings: Settings, now: datetime | None = None) -> dict[str, Any]:
    """{"jobs": {name: {"rows": n, "seconds": s}}} as SPEC 5's analytics/run returns it."""
    now = now or datetime.now(timezone.utc)
    client = store.client()
    client.command(_RESULTS_DDL)
    jobs: dict[str, Any] = {}
    for name in reports.REPORTS:
        started = time.perf_counter()
        q = ReportQuery.from_params({}, default_by=reports.REPORTS[name][1], now=now)
        frame = reports.compute(name, store, settings, q)
        client.insert("analytics_results",
                      [[name, now, q.since, q.until, json.dumps(reports.to_records(frame))]],
                      column_names=["report", "computed_at", "since", "until", "rows"])
        jobs[name] = {"rows": frame.height, "seconds": round(time.perf_counter() - started, 4)}
    return {"jobs": jobs, "computed_at": iso(now)}


class Scheduler:
    """Runs run_all every `analytics.interval` on a daemon thread until shutdown()."""

    def __init__(self, store: Any, settings: Settings) -> None:
        self._store = store
        self._settings = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="analytics", daemon=True)
        self.last: dict[str, Any] | None = None

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        interval = self._settings.analytics.interval.total_seconds()
        while not self._stop.wait(interval):
            try:
                self.last = run_all(self._store, self._settings)
            except Exception:  # noqa: BLE001 - a failed run must not stop the schedule
                log.exception("analytics run failed")

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
