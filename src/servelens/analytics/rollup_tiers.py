"""Fill the rollups' coarser tiers (six hours, days) once a period has settled.

The request, cost, context and workload rollups hold minutes, quarter hours or hours,
written by views in the insert that writes llm_requests; long windows read their six-hour
and day tiers instead (analytics/sources/rollups.py `pieces`). Views on the finer rollups
wrote those tiers on every insert too, about a third of a lone request's insert and an
eighth of a busy one's CPU (BENCHMARKS.md, "Rollup tiers from settled periods"), so they
are filled here instead (migration 0049; the workload's arrival days, 0052, never had a
view): one six-hour period at a time, after it has
settled (`span_hours.settled`), each tier from the finer rollup its view read, and the
day tiers with a day's last period. Periods go newest first, each next to those filled,
so the filled periods are one unbroken run, recorded in analytics_results; readers take
a tier only over what it is filled over (`rollups.tiers_of`), the finer grains elsewhere.

A request that arrives after its period was filled is in the finer grains at once, and in
the tiers once the next call writes that period again (its hours' count no longer matches
the tier's; a reading in the moment between the delete and the write misses the period). Periods the views had written before migration 0049 are kept as they are: a
period that ended before it and holds rows counts as filled; the one it cut in two is
written again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from servelens.analytics import span_hours
from servelens.analytics.leases import runner_id
from servelens.analytics.sources import rollups, stored_run, traffic
from servelens.core.config import Settings
from servelens.core.store import StoreLike

JOB = rollups.TIER_JOB  # in analytics_results / analytics_leases
PERIOD = timedelta(hours=6)
MIGRATION = 49  # the migration that dropped the tiers' views
LIMIT = 120  # periods per call: a month of them in a few calls

_DD = rollups.SKETCH.replace("(", "MergeState(", 1)  # the request and context rollups' states
_TOKENS_DD = f"quantilesDDMergeState({rollups.DD_ACCURACY}, 0.5, 0.99)"  # the workload's (0039)
_REQUEST_SUMS = ("Requests", "Errors", "Retries", "Fallbacks", "RateLimited", "WithTtft", "InputTokens",
                 "OutputTokens", "CachedInputTokens", "LatencySum")
_COST_DIMS = ("ServiceName", "Deployment", "Model", "Provider", "Tenant", "Feature", "Team", "Retry", "Error",
              "InputFloor")
_COST_SUMS = ("Requests", "InputTokens", "OutputTokens", "CachedTokens", "CacheWriteTokens", "ReasoningTokens")
_CONTEXT_SUMS = ("Requests", "WithInput", "InputSum")


@dataclass(frozen=True)
class Tier:
    table: str
    source: str  # the finer rollup its rows are added up from
    seconds: int  # its grain: a six-hour period or a day
    time: str  # the time column of both
    dims: tuple[str, ...]
    sums: tuple[str, ...]
    sketches: tuple[tuple[str, str], ...]  # (column, its merge-state function)

    def insert_sql(self) -> str:
        """The tier's rows of [{lo_s}, {hi_s}) (seconds), from its source."""
        columns = (self.time, *self.dims, *self.sums, *(c for c, _ in self.sketches))
        values = (f"toDateTime(intDiv(toUInt32({self.time}), {self.seconds}) * {self.seconds}) AS {self.time}",
                  *self.dims, *(f"sum({c}) AS {c}" for c in self.sums),
                  *(f"{merge}({c}) AS {c}" for c, merge in self.sketches))
        return (f"INSERT INTO {self.table} ({', '.join(columns)}) SELECT {', '.join(values)} FROM {self.source} "
                f"WHERE {self.when(self.source)} GROUP BY {', '.join((self.time, *self.dims))}")

    def when(self, table: str = "") -> str:
        """[{lo_s}, {hi_s}) on the time column (of `table`'s rows, not the period it is
        rounded down to under the same name)."""
        column = f"{table}.{self.time}" if table else self.time
        return f"{column} >= toDateTime({{lo_s:Int64}}) AND {column} < toDateTime({{hi_s:Int64}})"


@dataclass(frozen=True)
class ArrivalTier(Tier):
    """rollup_arrivals_1d (migration 0052): its source holds each minute's per-second
    arrivals, not sums, so a day's row adds up each minute's arrival sums
    (sources/traffic.py `day_arrivals_sql`) instead of the source's columns."""

    def insert_sql(self) -> str:
        columns = (self.time, *self.dims, *self.sums)
        minutes = "Minute >= toDateTime({lo_s:Int64}) AND Minute < toDateTime({hi_s:Int64})"  # the source's time
        return f"INSERT INTO {self.table} ({', '.join(columns)}) {traffic.day_arrivals_sql(minutes)}"


_SIX, _DAY = 21600, 86400
TIERS = (
    Tier("rollup_requests_6h", "rollup_requests_1h", _SIX, "Minute",
         ("ServiceName", "Deployment", "Model", "Provider", "Operation", "Region"), _REQUEST_SUMS,
         tuple((c, _DD) for c in ("Ttft", "Latency", "Tpot", "Queue"))),
    Tier("rollup_costs_6h", "rollup_costs_15m", _SIX, "Bucket", _COST_DIMS, _COST_SUMS, ()),
    Tier("rollup_costs_1d", "rollup_costs_15m", _DAY, "Bucket", _COST_DIMS, _COST_SUMS, ()),
    Tier("rollup_context_6h", "rollup_context_1h", _SIX, "Hour", ("ServiceName", "InputBucket"), _CONTEXT_SUMS,
         (("Latency", _DD), ("Ttft", _DD))),
    Tier("rollup_context_1d", "rollup_context_1h", _DAY, "Hour", ("ServiceName", "InputBucket"), _CONTEXT_SUMS,
         (("Latency", _DD), ("Ttft", _DD))),
    Tier("rollup_context_all_1d", "rollup_context_1h", _DAY, "Hour", ("InputBucket",), _CONTEXT_SUMS,
         (("Latency", _DD), ("Ttft", _DD))),
    Tier("rollup_workload_1d", "rollup_workload_1h", _DAY, "Hour", ("ServiceName",),
         ("Requests", "Batch", "InputSum", "OutputSum"),
         tuple((c, _TOKENS_DD) for c in ("Input", "Output"))),
    ArrivalTier("rollup_arrivals_1d", "rollup_arrivals_1m", _DAY, "Day", ("ServiceName",),
                ("Arrivals", "ArrivalsSq", "PeakSecond", "PeakMinute", "FirstMinute", "LastMinute"), ()),
)


def _migrated_at(store: StoreLike) -> datetime | None:
    row = store.client().query("SELECT min(applied_at) FROM servelens_migrations WHERE version = {v:UInt32}",
                               parameters={"v": MIGRATION}).first_row
    return None if row is None or row[0] is None else row[0].replace(tzinfo=timezone.utc)


def _holds_rows(store: StoreLike, tier: Tier, params: dict[str, int]) -> bool:
    return bool(store.client().command(f"SELECT count() > 0 FROM {tier.table} WHERE {tier.when()}",
                                       parameters=params))


def _delete(store: StoreLike, settings: Settings, tier: Tier, params: dict[str, int]) -> None:
    cluster = settings.store.cluster
    table = f"{tier.table}_local ON CLUSTER {cluster}" if cluster else tier.table
    store.client().command(f"ALTER TABLE {table} DELETE WHERE {tier.when()}", parameters=params,
                           settings={"mutations_sync": 2})


def _span(tier: Tier, start: datetime) -> tuple[datetime, datetime]:
    """The period of `tier` the six hours from `start` are in: themselves, or their day."""
    lo = start if tier.seconds == _SIX else start.replace(hour=0)
    return lo, lo + timedelta(seconds=tier.seconds)


def _write(store: StoreLike, tier: Tier, params: dict[str, int], token: str | None) -> None:
    """The tier's rows of a span; `token` deduplicates a write repeated after a runner died
    before recording it (none: a span written again on purpose must not be taken for one)."""
    store.client().command(tier.insert_sql(), parameters=params,
                           settings={"insert_deduplication_token": token, "insert_deduplicate": 1} if token
                           else {"insert_deduplicate": 0})


def _fill_period(store: StoreLike, settings: Settings, start: datetime, migrated_at: datetime | None) -> None:
    """Write every tier's rows of the six hours from `start` (the day tiers with the day's
    last period)."""
    for tier in TIERS:
        lo, hi = _span(tier, start)
        if hi != start + PERIOD:
            continue  # a day tier, before the day's last six hours
        params = {"lo_s": int(lo.timestamp()), "hi_s": int(hi.timestamp())}
        if migrated_at is not None and hi <= migrated_at and _holds_rows(store, tier, params):
            continue  # written by the views before migration 0049
        if migrated_at is not None and lo < migrated_at < hi:
            _delete(store, settings, tier, params)  # the views wrote part of it
        _write(store, tier, params, f"{JOB}:{tier.table}:{lo.isoformat()}")


# Six hours filled whose requests have changed since: a request that arrived after its
# period was filled (a log replayed after a long outage, history sent late). The hour
# rollup is written by a view in every insert, so its count per six hours is the truth.
_STALE = """
    SELECT toUnixTimestamp(p) FROM (
        SELECT toDateTime(intDiv(toUInt32(Minute), 21600) * 21600) AS p, sum(Requests) AS n FROM rollup_requests_1h
        WHERE Minute >= toDateTime({lo_s:Int64}) AND Minute < toDateTime({hi_s:Int64}) GROUP BY p) AS fine
    LEFT JOIN (
        SELECT Minute AS p, sum(Requests) AS n FROM rollup_requests_6h
        WHERE Minute >= toDateTime({lo_s:Int64}) AND Minute < toDateTime({hi_s:Int64}) GROUP BY p) AS tier USING (p)
    WHERE fine.n != tier.n ORDER BY p DESC"""


def _stale(store: StoreLike) -> tuple[list[datetime], int]:
    """(the filled six hours whose requests changed since, newest first; the end of the filled run, s)."""
    run = stored_run(store, JOB, rollups.TIER_PERIOD_NS)
    if run is None:
        return [], 0
    lo_s, hi_s = run[0] // rollups.NS, run[1] // rollups.NS
    rows = store.client().query(_STALE, parameters={"lo_s": lo_s, "hi_s": hi_s}).result_rows
    return [datetime.fromtimestamp(t, tz=timezone.utc) for (t,) in rows], hi_s


def _refill(store: StoreLike, settings: Settings, start: datetime, top_s: int) -> None:
    """Write the six hours from `start` again in every tier, and their day where it was
    written (its last six hours filled, at most `top_s`)."""
    for tier in TIERS:
        lo, hi = _span(tier, start)
        if hi.timestamp() > top_s:
            continue
        params = {"lo_s": int(lo.timestamp()), "hi_s": int(hi.timestamp())}
        _delete(store, settings, tier, params)
        _write(store, tier, params, None)


def fill(store: StoreLike, settings: Settings, now: datetime | None = None, *, owner: str | None = None,
         limit: int = LIMIT, stop: threading.Event | None = None) -> dict[str, Any]:
    """Fill up to `limit` due periods, newest first, then write again those filled whose
    requests have changed since (`_STALE`). {"hours": periods written, "seconds": s};
    stops at a period another runner holds (the run must stay unbroken)."""
    started = time.perf_counter()
    migrated_at = _migrated_at(store)
    periods = span_hours.store_due(store, settings, now or datetime.now(timezone.utc), JOB, PERIOD,
                                   lambda start: _fill_period(store, settings, start, migrated_at),
                                   owner or runner_id(), limit, stop)
    stale, top_s = _stale(store)
    for start in stale[:max(0, limit - periods)]:
        if stop is not None and stop.is_set():
            break
        _refill(store, settings, start, top_s)
        periods += 1
    return {"hours": periods, "seconds": round(time.perf_counter() - started, 4)}
