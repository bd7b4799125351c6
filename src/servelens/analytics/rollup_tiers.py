"""Fill the rollups' coarser tiers (six hours, days) once a period has settled.

The request, cost, context and workload rollups hold minutes, quarter hours or hours,
written by views in the insert that writes llm_requests; long windows read their six-hour
and day tiers instead (analytics/sources/rollups.py `pieces`). Views on the finer rollups
wrote those tiers on every insert too, about a third of a lone request's insert and an
eighth of a busy one's CPU (BENCHMARKS.md, "Rollup tiers from settled periods"), so they
are filled here instead (migration 0049): one six-hour period at a time, after it has
settled (`span_hours.settled`), each tier from the finer rollup its view read, and the
day tiers with a day's last period. Periods go newest first, each next to those filled,
so the filled periods are one unbroken run, recorded in analytics_results; readers take
a tier only over what it is filled over (`rollups.tiers_of`), the finer grains elsewhere.

A row that arrives after its period was filled is in the finer grains, not in the tier
(as for the stage hours). Periods the views had written before migration 0049 are kept as
they are: a period that ended before it and holds rows counts as filled; the one it cut
in two is written again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from servelens.analytics import span_hours
from servelens.analytics.leases import Leases, runner_id
from servelens.analytics.sources import rollups
from servelens.core.config import Settings
from servelens.core.store import StoreLike

JOB = rollups.TIER_JOB  # in analytics_results / analytics_leases
PERIOD = timedelta(hours=6)
MIGRATION = 49  # the migration that dropped the tiers' views
LIMIT = 120  # periods per call: a month of them in a few calls

_DD = "quantilesDDMergeState(0.0025, 0.5, 0.95, 0.99)"
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
         tuple((c, "quantilesDDMergeState(0.0025, 0.5, 0.99)") for c in ("Input", "Output"))),
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


def _fill_period(store: StoreLike, settings: Settings, start: datetime, migrated_at: datetime | None) -> None:
    """Write every tier's rows of the six hours from `start` (the day tiers with the day's
    last period)."""
    for tier in TIERS:
        end = start + PERIOD
        if tier.seconds == _DAY:
            if end.timestamp() % _DAY:
                continue
            start_of = end - timedelta(days=1)
        else:
            start_of = start
        params = {"lo_s": int(start_of.timestamp()), "hi_s": int(end.timestamp())}
        if migrated_at is not None and end <= migrated_at and _holds_rows(store, tier, params):
            continue  # written by the views before migration 0049
        if migrated_at is not None and start_of < migrated_at < end:
            _delete(store, settings, tier, params)  # the views wrote part of it
        store.client().command(tier.insert_sql(), parameters=params, settings={
            "insert_deduplication_token": f"{JOB}:{tier.table}:{start_of.isoformat()}", "insert_deduplicate": 1})


def fill(store: StoreLike, settings: Settings, now: datetime | None = None, *, owner: str | None = None,
         limit: int = LIMIT, stop: threading.Event | None = None) -> dict[str, Any]:
    """Fill up to `limit` due periods, newest first. {"hours": periods filled, "seconds": s};
    stops at a period another runner holds (the run must stay unbroken)."""
    started = time.perf_counter()
    now = now or datetime.now(timezone.utc)
    owner = owner or runner_id()
    leases = Leases(store, owner)
    migrated_at = _migrated_at(store)
    periods = 0
    for start in span_hours.due(store, settings, now, JOB, PERIOD)[:limit]:
        if stop is not None and stop.is_set():
            break
        until = start + PERIOD
        if not leases.acquire(JOB, until, now):
            break
        _fill_period(store, settings, start, migrated_at)
        store.client().insert("analytics_results", [[JOB, start, until, datetime.now(timezone.utc), owner, "{}"]],
                              column_names=["report", "since", "until", "computed_at", "owner", "rows"])
        periods += 1
    return {"hours": periods, "seconds": round(time.perf_counter() - started, 4)}
