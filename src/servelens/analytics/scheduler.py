"""Run the report jobs over stored data, on a schedule or on demand.

Scheduled runs compute each report for the window ending at the last `analytics.interval`
boundary (the default 24 h window), so every process pointed at one store computes the
same windows; a lease (analytics_leases) lets exactly one of them compute each window,
and results replace, never double (analytics_results is keyed by report and window).
On-demand runs (`POST /api/v1/analytics/run`, `servelens analytics --once`) compute the
window ending now.

A dashboard process without an analytics role (`servelens dashboard`) runs a standby
scheduler (dashboard.evaluate_triggers: auto): every runner that is not on standby writes a
heartbeat row into analytics_leases each tick, and the standby does nothing while another
runner's heartbeat is fresh, so the alerts keep coming from the analytics process (its
sinks, its keepalives) and the dashboard takes over only when none is alive. The per-window
leases stay what makes two runners safe: whoever runs, each window is evaluated, and each
episode transition announced, once.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any

from servelens.analytics import memo, quality_hours, rollup_tiers, span_hours
from servelens.analytics.leases import Leases, aligned, heartbeat, runner_alive, runner_id
from servelens.analytics.query import DEFAULT_WINDOW, ReportQuery, iso
from servelens.analytics.reports import registry as reports
from servelens.analytics.triggers.engine import active_triggers, catch_up
from servelens.core import priority
from servelens.core.config import Settings
from servelens.core.store import StoreLike

log = logging.getLogger(__name__)


def run_all(store: StoreLike, settings: Settings, now: datetime | None = None, scheduled: bool = False,
            owner: str | None = None, stop: threading.Event | None = None) -> dict[str, Any]:
    """{"jobs": {name: {"rows": n, "seconds": s}}} as SPEC 5's analytics/run returns it
    ("stage_hours", "stage_slots", "span_keys_hours", "quality_hours": the settled hours
    stored for the stage, ingest and quality readers, analytics.span_hours and
    analytics.quality_hours; "rollup_tiers": the settled six hours of the rollups' coarser
    tiers, analytics.rollup_tiers).

    Scheduled runs skip the reports another runner holds the window of ("skipped": true).
    Once `stop` is set no further report starts (the process is stopping).
    """
    now = now or datetime.now(timezone.utc)
    owner = owner or runner_id()
    until = aligned(now, settings.analytics.interval) if scheduled else now
    leases = Leases(store, owner)
    jobs: dict[str, Any] = {}
    # The settled hours first: the reports below read them.
    fills = [*((job.name, functools.partial(span_hours.fill, job=job)) for job in span_hours.JOBS),
             (quality_hours.JOB, quality_hours.fill), (rollup_tiers.JOB, rollup_tiers.fill)]
    for job, fill in fills:
        if stop is not None and stop.is_set():
            break
        try:
            jobs[job] = _fill_settled(fill, store, settings, now, owner, stop)
        except Exception:  # noqa: BLE001 - the reports read raw rows where no hour is stored
            log.exception("storing the settled hours of %s failed", job)
    # The jobs share one window: what several of them need (GPU frames, stage quantiles)
    # is computed once (analytics.memo) and dropped when the run ends.
    with memo.run():
        for name, (_job, default_by) in reports.REPORTS.items():
            if stop is not None and stop.is_set():
                break
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


# A back-filled month, or a long outage, leaves hundreds of settled hours to store, and
# until they are stored the long windows read raw rows (seconds a page at a month of a busy
# fleet). Each fill call takes a bounded number of hours; a run calls again while hours
# were due and this share of analytics.interval is not spent, so a month is stored within
# a few runs, not one call (48 hours) per interval.
CATCH_UP_SHARE = 0.5


def _fill_settled(fill: Any, store: StoreLike, settings: Settings, now: datetime, owner: str,
                  stop: threading.Event | None) -> dict[str, Any]:
    budget = settings.analytics.interval.total_seconds() * CATCH_UP_SHARE
    hours, seconds = 0, 0.0
    while stop is None or not stop.is_set():
        filled = fill(store, settings, now, owner=owner, stop=stop)
        hours, seconds = hours + filled["hours"], seconds + filled["seconds"]
        if not filled["hours"] or seconds >= budget:
            break
    return {"rows": hours, "seconds": round(seconds, 4)}


class Scheduler:
    """At start and every `analytics.interval`: the report jobs for the latest aligned
    window, then the trigger windows that have closed (their episodes publish to the alert
    dispatcher).

    `standby`: the dashboard's scheduler, which runs only while no other runner is alive.
    """

    def __init__(self, store: StoreLike, settings: Settings, dispatcher: Any = None, standby: bool = False) -> None:
        self._store = store
        self._settings = settings
        self._dispatcher = dispatcher
        self._owner = runner_id()
        self._standby = standby
        self._running = not standby  # whether the last tick ran (a standby starts idle)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="analytics", daemon=True)
        self.last: dict[str, Any] | None = None

    @property
    def running(self) -> bool:
        """Whether the last tick ran the jobs (False: a standby that found a runner alive)."""
        return self._running

    def start(self) -> None:
        if not self._standby:  # seen by a standby at once, not one interval later
            heartbeat(self._store, self._owner, datetime.now(timezone.utc))
        self._thread.start()

    def tick(self, now: datetime | None = None) -> None:
        now = now or datetime.now(timezone.utc)
        if self._standby:
            if runner_alive(self._store, self._settings, now, self._owner):
                if self._running:
                    log.info("an analytics runner is alive: this dashboard stops evaluating triggers")
                    self._running = False
                if self._dispatcher is not None:
                    self._dispatcher.retain(set())  # the runner keeps the open episodes alive
                return
            if not self._running:
                log.info("no analytics runner is alive: this dashboard runs the reports and triggers")
                self._running = True
                if self._dispatcher is not None:
                    # Alertmanager expires what is not re-posted: the open episodes go out again.
                    self._dispatcher.restore(active_triggers(self._store))
        else:
            heartbeat(self._store, self._owner, now)
        started = time.perf_counter()
        self.last = run_all(self._store, self._settings, now=now, scheduled=True, owner=self._owner, stop=self._stop)
        windows = catch_up(self._store, self._settings, self._dispatcher, owner=self._owner, now=now,
                           stop=self._stop)["windows"]
        reports_run = sum(1 for job in self.last["jobs"].values() if not job.get("skipped"))
        log.info("analytics run until %s: %d jobs, %d trigger windows evaluated, in %.1f s",
                 self.last["until"], reports_run, len(windows), time.perf_counter() - started)
        if self._dispatcher is not None and not self._stop.is_set():
            self._dispatcher.retain({t["id"] for t in active_triggers(self._store)})

    def _loop(self) -> None:
        priority.lower_this_thread()  # a scheduled report can wait; a receiver or a page should not
        # The first tick runs at start: windows that closed while no runner was up (an
        # outage, a back-filled history) are evaluated now, not one interval later.
        interval = self._settings.analytics.interval.total_seconds()
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a failed run must not stop the schedule
                log.exception("analytics run failed")
            if self._stop.wait(interval):
                break

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop after the report or trigger window in progress. The store is closed after
        this returns, so it waits for that one to end (a query cannot be interrupted, and
        closing the embedded engine under it crashes the process): `timeout`, then as long
        again with a warning."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the analytics run is still in a report or trigger window; waiting for it to end")
            self._thread.join(max(timeout, 60.0))
