"""Store what each settled hour of spans adds up to, once, for readers of long windows.

Two readers aggregate every span or trace of their window, and at a month of a busy fleet
that is millions held at once: the stages report and the overview's binding constraint
(per-stage sketches, rollup_stages_1h, migration 0028; per five minutes for the windows'
edges inside an hour, rollup_stages_5m, migration 0042), and the ingest report's attribute
keys no dialect reads (rollup_span_keys_1h, migration 0031). This job aggregates one hour
at a time instead, after the hour has settled (its traces' spans may arrive up to the
slack after it: SLACK_NS plus triggers.settle), and the readers take the stored hours as
they are, raw rows for the rest of their window.

Hours go newest first (`due`), `limit` per call, each next to those stored, so each job's
stored hours are one unbroken run that `traces.hours_stored` can read from
analytics_results.
Each hour is taken under a lease (analytics_leases) and recorded in analytics_results once
inserted; its insert carries a deduplication token, so an hour inserted by a runner that
died before recording it is not counted twice when it is taken again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from servelens.analytics.leases import Leases, aligned, runner_id
from servelens.analytics.sources import frame, span_keys, stored_run, traces
from servelens.analytics.sources.traces import HOUR_NS, SLACK_NS
from servelens.core.config import Settings
from servelens.core.store import StoreLike

HOUR = timedelta(hours=1)
LIMIT = 48  # hours per call: a scheduler tick stays short while a month is filled in


@dataclass(frozen=True)
class HourJob:
    name: str  # in analytics_results / analytics_leases
    table: str
    columns: tuple[str, ...]  # what `rows` selects, in order; Hour (the hour's start) is added last unless named
    rows: Callable[[], str]  # SQL: one hour's rows, [since_ns, until_ns) with slack_ns around it


STAGES = HourJob(traces.JOB, traces.ROLLUP, ("ServiceName", "Deployment", "Stage", "Traces", "Seconds"),
                 traces.hour_states_sql)
STAGE_SLOTS = HourJob(traces.SLOT_JOB, traces.SLOT_ROLLUP,
                      ("ServiceName", "Deployment", "Stage", "Traces", "Seconds", "Hour"), traces.slot_states_sql)
SPAN_KEYS = HourJob(span_keys.JOB, span_keys.ROLLUP, ("ServiceName", "Key", "Spans", "Example"),
                    span_keys.hour_rows_sql)
JOBS = (STAGES, STAGE_SLOTS, SPAN_KEYS)


def settled(settings: Settings, now: datetime, period: timedelta = HOUR) -> datetime:
    """The end of the last `period` (of the UTC grid) whose traces are complete at `now`."""
    return aligned(now - timedelta(microseconds=SLACK_NS // 1000) - settings.triggers.settle, period)


def _first_period(store: StoreLike, period: timedelta) -> datetime | None:
    row = frame(store, "SELECT toUnixTimestamp64Nano(min(Timestamp)) AS t, count() AS n FROM llm_requests", {})
    if not row.height or not row.item(0, "n"):
        return None
    step = int(period.total_seconds())
    return datetime.fromtimestamp(row.item(0, "t") // (step * 10**9) * step, tz=timezone.utc)


def due(store: StoreLike, settings: Settings, now: datetime, name: str, period: timedelta = HOUR) -> list[datetime]:
    """Starts of the periods (hours) job `name` is to fill, newest first: the settled ones
    after the stored run, in order, then those before it back to the first stored request,
    latest first. The windows read most (the last day, the last week) are stored first,
    and every period stored is next to the run, so the run stays unbroken. Filled oldest
    first, a month of history took several runs to reach last week, read from raw rows
    meanwhile (BENCHMARKS.md, "The settled hours newest first")."""
    first = _first_period(store, period)
    if first is None:
        return []
    end = settled(settings, now, period)
    stored = stored_run(store, name, int(period.total_seconds()) * 10**9)
    bottom, top = ((datetime.fromtimestamp(b / 1e9, tz=timezone.utc) for b in stored) if stored is not None
                   else (end, end))
    after = [top + i * period for i in range(max(0, int((end - top) / period)))]
    before = [bottom - (i + 1) * period for i in range(max(0, int((bottom - first) / period)))]
    return after + before


def store_due(store: StoreLike, settings: Settings, now: datetime, name: str, period: timedelta,
              write: Callable[[datetime], None], owner: str, limit: int, stop: threading.Event | None) -> int:
    """write(start) for up to `limit` of job `name`'s due periods (`due`), each under its
    lease and recorded in analytics_results once written; the periods written. Stops at a
    period another runner holds (the run must stay unbroken)."""
    leases = Leases(store, owner)
    written = 0
    for start in due(store, settings, now, name, period)[:limit]:
        if stop is not None and stop.is_set():
            break
        until = start + period
        if not leases.acquire(name, until, now):
            break
        write(start)
        store.client().insert("analytics_results", [[name, start, until, datetime.now(timezone.utc), owner, "{}"]],
                              column_names=["report", "since", "until", "computed_at", "owner", "rows"])
        written += 1
    return written


def fill(store: StoreLike, settings: Settings, now: datetime | None = None, *, job: HourJob,
         owner: str | None = None, limit: int = LIMIT, stop: threading.Event | None = None) -> dict[str, Any]:
    """Store up to `limit` due hours of `job`. {"hours": n, "seconds": s};
    stops at an hour another runner holds (the run must stay unbroken)."""
    started = time.perf_counter()
    columns, start = ((job.columns, "") if "Hour" in job.columns
                      else ((*job.columns, "Hour"), ", toDateTime(intDiv({since_ns:Int64}, 1000000000))"))

    def write(hour: datetime) -> None:
        lo = int(hour.timestamp()) * 10**9
        store.client().command(
            f"INSERT INTO {job.table} ({', '.join(columns)}) SELECT *{start} FROM ({job.rows()})",
            parameters={"since_ns": lo, "until_ns": lo + HOUR_NS, "slack_ns": SLACK_NS},
            settings={"insert_deduplication_token": f"{job.name}:{hour.isoformat()}", "insert_deduplicate": 1})

    hours = store_due(store, settings, now or datetime.now(timezone.utc), job.name, HOUR, write,
                      owner or runner_id(), limit, stop)
    return {"hours": hours, "seconds": round(time.perf_counter() - started, 4)}
