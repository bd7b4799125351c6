"""Fill rollup_quality_15m (migration 0029): each settled hour's results per slice, once.

The quality readers join every result of their window to its request
(analytics/sources/results.py); at a week or a month of a busy fleet that join is most
of their time. This job joins one hour at a time instead, once the hour has settled: its
results' requests may lie up to an hour after them (clock skew) and their spans arrive
up to the slack after that, plus triggers.settle.

Hours go newest first, back to the first stored result, `limit` per call. Each hour is taken under
a lease (analytics_leases) and recorded in analytics_results once inserted, with the
instant it was read (Filled). Readers read an hour's rows of the Filled recorded last
only, so an hour inserted by a runner that died before recording it is never counted.
A result ingested after its hour was filled sends readers to the raw rows for that hour
(results.late_hours), and the next call takes the hour again. The job's name carries
results.config_id: a change to the keys or the pass rule starts a new run, and the old
rows are not read.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from servelens.analytics.leases import Leases, aligned, runner_id
from servelens.analytics.sources import results
from servelens.analytics.sources.traces import SLACK_NS
from servelens.core.config import Settings
from servelens.core.store import StoreLike

JOB = results.JOB
HOUR = timedelta(hours=1)
LIMIT = 48  # hours per call: a scheduler tick stays short while a month is filled in
BATCH = 24  # hours per join: its request side reads evaluation_delay before the first
# Filled is taken this long before the hour is read: a row stamped IngestedAt before it
# is committed (and visible) by then, whichever clock stamped it (the engine's, or an API
# process's a little off it). A row ingested in between is both stored and counted late:
# its hour is read raw until it is taken again, never wrong.
MARGIN = timedelta(seconds=30)


def settled(settings: Settings, now: datetime) -> datetime:
    """The end of the last hour whose results' requests are all in at `now`."""
    return aligned(now - timedelta(microseconds=(results.SKEW_NS + SLACK_NS) // 1000) - settings.triggers.settle,
                   HOUR)


def _first_hour(store: StoreLike) -> datetime | None:
    row = store.client().query("SELECT toUInt32(toStartOfHour(min(Timestamp))), count() FROM evaluations").first_row
    return datetime.fromtimestamp(int(row[0]), tz=timezone.utc) if row and row[1] else None


def due(store: StoreLike, settings: Settings, now: datetime) -> list[datetime]:
    """Starts of the hours to fill, newest first: every settled hour from the first stored
    result (within the retention) that none has stored. The windows read most (the last
    day, the last week) are stored first, as the span hours are (analytics.span_hours.due)."""
    first = _first_hour(store)
    if first is None:
        return []
    # nothing older than the retention is kept (a result stamped in the distant past would
    # otherwise be a long run of empty hours to walk through)
    first = max(first, aligned(now - timedelta(days=settings.store.retention_days), HOUR))
    end = settled(settings, now)
    stored = results.recorded(store, results.job_name(settings))
    hours = (end - (i + 1) * HOUR for i in range(max(0, int((end - first) / HOUR))))
    return [h for h in hours if int(h.timestamp()) not in stored]


def fill(store: StoreLike, settings: Settings, now: datetime | None = None, *, owner: str | None = None,
         limit: int = LIMIT, stop: threading.Event | None = None, margin: timedelta = MARGIN) -> dict[str, Any]:
    """Store up to `limit` hours: the due ones (up to one another runner holds), then
    stored hours with a result ingested after they were filled, newest first.
    {"hours": n, "refilled": m, "seconds": s}. `margin`: see MARGIN."""
    started = time.perf_counter()
    now = now or datetime.now(timezone.utc)
    leases = Leases(store, owner or runner_id())
    fill_sql = results.fill_sql(settings)
    config = results.config_of(*fill_sql)
    job = results.job_name(settings, config)
    taken = []
    for hour in due(store, settings, now)[:limit]:
        if stop is not None and stop.is_set() or not leases.acquire(job, hour + HOUR, now):
            break
        taken.append(hour)
    # The due hours' rows go in first, recorded only at the end: until then readers take
    # those hours raw. A result in them may be a newer version of one a stored hour
    # counted (its timestamp moved): late_hours, which counts the rows of hours not
    # recorded against every fill, finds that stored hour too, and it is taken again.
    inserted = []
    for run in _runs(sorted(taken)):
        if stop is not None and stop.is_set():
            break
        inserted.append((run, _insert(store, settings, fill_sql, config, run, margin)))
    late: list[datetime] = []
    stored = results.recorded(store, job)
    if stored and len(taken) < limit:
        # No lease: two runners taking an hour again store two versions of it, and readers
        # read the one recorded last, whole.
        found = results.late_hours(store, stored, min(stored) * 10**9, (max(stored) + 3600) * 10**9) & set(stored)
        late = [datetime.fromtimestamp(h, tz=timezone.utc) for h in sorted(found, reverse=True)[:limit - len(taken)]]
    for run in _runs(sorted(late)):
        _record(store, job, run, _insert(store, settings, fill_sql, config, run, margin), leases.owner)
    for run, filled in inserted:
        _record(store, job, run, filled, leases.owner)
    return {"hours": sum(len(r) for r, _ in inserted) + len(late), "refilled": len(late),
            "seconds": round(time.perf_counter() - started, 4)}


def _runs(hours: list[datetime]) -> list[list[datetime]]:
    """Consecutive hours in runs of at most BATCH: one join reads each run's requests."""
    out: list[list[datetime]] = []
    for h in hours:
        if out and h == out[-1][-1] + HOUR and len(out[-1]) < BATCH:
            out[-1].append(h)
        else:
            out.append([h])
    return out


def _insert(store: StoreLike, settings: Settings, fill_sql: tuple[str, dict[str, Any]], config: str,
            hours: list[datetime], margin: timedelta) -> int:
    """Insert the consecutive hours' rows (results.fill_sql) as read now; returns their
    Filled (ns)."""
    sql, params = fill_sql
    client = store.client()
    lo = int(hours[0].timestamp()) * 10**9
    now_ns = int(client.query("SELECT toUnixTimestamp64Nano(now64(9))").first_row[0])
    filled = now_ns - int(margin.total_seconds() * 1e9)
    client.command(
        f"INSERT INTO {results.ROLLUP} (Bucket, Config, Filled, {', '.join(results.COLUMNS.values())}, "
        "Evaluations, Passed, Scored, ScoreSum) "
        f"SELECT toDateTime(bucket), {{config:String}}, fromUnixTimestamp64Nano({{filled:Int64}}), "
        f"* EXCEPT (bucket) FROM ({sql})",
        parameters={**params, "since_ns": lo, "until_ns": lo + len(hours) * results.HOUR_NS,
                    "req_since_ns": results.request_side(settings, lo), "config": config, "filled": filled})
    return filled


def _record(store: StoreLike, job: str, hours: list[datetime], filled: int, owner: str) -> None:
    """Record the hours as stored with `filled`: readers read those rows of them from now."""
    computed = datetime.now(timezone.utc)
    store.client().insert("analytics_results",
                          [[job, h, h + HOUR, computed, owner, json.dumps({"filled_ns": filled})] for h in hours],
                          column_names=["report", "since", "until", "computed_at", "owner", "rows"])
