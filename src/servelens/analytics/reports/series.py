"""Time series of the reports' numbers (SPEC 5 `GET /api/v1/series/<metric>`).

Every series is read per time bucket from the same sources as the reports: request
counts and percentiles from the request rollups (analytics/sources/rollups.py; percentiles are
always their sketches here, within 1 % of a value at the rank), cost from the cost groups
(priced exactly as the cost report, per bucket of 15 minutes or more), GPU busy time from
gpu_util_minutes, pass rates from the evaluations. A bucket without requests has no
percentile or rate (null: a gap in the chart, never a 0); counts there are 0.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

import polars as pl

from servelens.analytics import memo
from servelens.analytics.query import QueryError, ReportQuery
from servelens.analytics.reports import cost, quality
from servelens.analytics.sources import frame, gpus
from servelens.analytics.sources import requests as loader
from servelens.analytics.sources import results, rollups
from servelens.core.config import Settings
from servelens.core.store import StoreLike

BUCKETS = {"1m": 60, "5m": 300, "15m": 900, "1h": 3600, "6h": 21600, "1d": 86400}
# auto picks the finest bucket that keeps a series under this; a dashboard window on the
# bucket grid (dashboard.data.Filters.window) holds one bucket more than its range, and 6 h
# in minutes (360) plus that one stays in minutes.
MAX_POINTS = 400
MAX_SERIES = 8  # keys by volume; the rest are left out (`omitted` says how many)

_QUANTILE = {"p50": 0, "p95": 1, "p99": 2}
_REQUEST_METRICS: dict[str, Callable[[], pl.Expr]] = {
    "requests": lambda: pl.col("requests"),
    "arrival_rps": lambda: pl.col("requests") / pl.col("_bucket_s"),
    "errors": lambda: pl.col("errors"),
    "error_rate": lambda: pl.col("errors") / pl.col("requests"),
    "retry_rate": lambda: pl.col("retries") / pl.col("requests"),
    "fallback_rate": lambda: pl.col("fallbacks") / pl.col("requests"),
    "rate_limited": lambda: pl.col("rate_limited"),
    "input_tokens": lambda: pl.col("input_tokens"),
    "output_tokens": lambda: pl.col("output_tokens"),
}
for _m in ("ttft", "latency", "tpot", "queue"):
    for _q, _i in _QUANTILE.items():
        _REQUEST_METRICS[f"{_m}_{_q}_ms"] = (lambda m=_m, i=_i: pl.col(m).list.get(i, null_on_oob=True) * 1000)
COST_METRICS = ("cost_usd", "cost_per_request_usd")
GPU_METRICS = ("gpu_utilization", "idle_cost_usd")
METRICS = (*_REQUEST_METRICS, *COST_METRICS, *GPU_METRICS, "pass_rate")
COUNTS = ("requests", "errors", "rate_limited", "input_tokens", "output_tokens", "cost_usd")


def bucket_seconds(bucket: str | None, q: ReportQuery) -> int:
    """The bucket asked for, or (auto) the finest that keeps the window under MAX_POINTS."""
    if bucket and bucket != "auto":
        if bucket not in BUCKETS:
            raise QueryError(f"bucket: use auto or one of {list(BUCKETS)}")
        seconds = BUCKETS[bucket]
        if (q.until - q.since).total_seconds() / seconds > 20 * MAX_POINTS:
            raise QueryError(f"bucket {bucket} is too fine for this window; use a coarser one or auto")
        return seconds
    return auto_seconds((q.until - q.since).total_seconds())


def auto_seconds(span_s: float) -> int:
    """The finest bucket that keeps a window of span_s seconds under MAX_POINTS."""
    return next((s for s in BUCKETS.values() if span_s / s <= MAX_POINTS), BUCKETS["1d"])


def _name(seconds: int) -> str:
    return next(k for k, v in BUCKETS.items() if v == seconds)


def series(store: StoreLike, settings: Settings, metric: str, q: ReportQuery, bucket: str | None = None,
           also: Iterable[str] = ()) -> dict[str, Any]:
    """`also`: the other metrics this run reads for the same window, grouping and bucket (a
    page's charts): the request metrics among them share one reading of the request stats,
    every sketch they need merged in it."""
    with rollups.tiers_of(store):
        return _series(store, settings, metric, q, bucket, also)


def _series(store: StoreLike, settings: Settings, metric: str, q: ReportQuery, bucket: str | None,
            also: Iterable[str]) -> dict[str, Any]:
    if metric not in METRICS:
        raise QueryError(f"unknown metric {metric!r}; available: {sorted(METRICS)}")
    seconds = bucket_seconds(bucket, q)
    folded = 0  # keys read as one and not drawn (_costed)
    if metric in _REQUEST_METRICS:
        points = _request_points(store, settings, q, seconds, metric, also)
    elif metric in COST_METRICS:
        points, folded = _cost_points(store, settings, q, max(seconds, 900), metric)
        seconds = max(seconds, 900)
    elif metric in GPU_METRICS:
        points = _gpu_points(store, settings, q, seconds, metric)
    else:
        # Quarter hours at least, as cost: the results' stored hours hold quarter hours
        # (sources/results.py), and a finer bucket read every result and its request raw
        # (a 24 h window at 5 minutes: 2.7 s at 100 M requests, BENCHMARKS.md "Pass rate in
        # quarter hours").
        seconds = max(seconds, results.GRAIN_S)
        points = _pass_points(store, settings, q, seconds)
    return {"metric": metric, "bucket": _name(seconds), **_shape(points, q, seconds, metric, folded)}


def _request_points(store: StoreLike, settings: Settings, q: ReportQuery, seconds: int, metric: str,
                    also: Iterable[str] = ()) -> pl.DataFrame:
    # A small window sketches its raw rows: cheaper than merging the rollup's states when a
    # rollup row holds about one request (tens of thousands of models or regions a minute).
    # (the window's request count is read once per run: rollups.request_count)
    sketched = loader.sketched(store, settings, q, q.by)
    read = {metric, *(m for m in also if m in _REQUEST_METRICS)}
    sql, params = rollups.request_stats_sql(q, settings, q.by, bucket_s=seconds, rollup=sketched,
                                            raw_edges=sketched and rollups.edges_raw(store, settings, q, seconds),
                                            sketches=tuple(k for k in rollups.SKETCHES
                                                           if any(m.startswith(f"{k}_") for m in read)))
    # every request metric of one grouping, bucket and percentile column reads the same
    # stats: once per run (a chart of p50, p95 and p99 is one query; a count reads no sketch
    # unless one read with it does: a page's counts and percentiles are one query)
    stats = memo.cached(("series.request_stats", id(store), sql, repr(sorted(params.items()))),
                        lambda: frame(store, sql, params))
    if not stats.height:
        return _EMPTY
    return (_seconds(stats).with_columns(pl.lit(float(seconds)).alias("_bucket_s"))
            .select(pl.col("key"), "t", pl.col("requests").cast(pl.Float64).alias("_weight"),
                    _REQUEST_METRICS[metric]().cast(pl.Float64).alias("value")))


def _costed(store: StoreLike, settings: Settings, q: ReportQuery, seconds: int) -> tuple[pl.DataFrame, int]:
    """The window's priced groups per bucket, keyed by q.by, and how many keys were folded.
    Within a run an ungrouped series adds up a grouped one read for the same window, view
    and bucket (a page's spend stacked by tenant and its cost per request): the same groups
    under another key, the same sums (BENCHMARKS.md "Dashboard load in the browser").
    Keyed by a business unit of the cost rollups (tenants, features, teams: hundreds or
    thousands), the keys past the MAX_SERIES with the most requests, which _shape would
    leave out, are read as one (loader.FOLDED): the same series and total in far fewer
    groups. Their ranking reads the rollups; the other keys are few by design
    (rollups.REQUEST_DIMS) or ranked only from raw rows (outcome): ranking them would
    cost more than it saves (BENCHMARKS.md "Spend series by tenant")."""
    read: dict[str | None, tuple[pl.DataFrame, int]] = memo.cached(
        memo.key("series.costed", store, settings, repr(replace(q, by=None)), seconds), dict)
    if q.by is None and read:
        return next(iter(read.values()))[0].with_columns(pl.lit("").alias("key")), 0
    if q.by not in read:
        keep, folded = None, 0
        if q.by in rollups.COST_DIMS and q.by not in rollups.REQUEST_DIMS:
            ranked = cost.key_requests(store, settings, q).sort(["requests", "key"], descending=[True, False])
            if ranked.height > MAX_SERIES:
                keep, folded = ranked.get_column("key").head(MAX_SERIES).to_list(), ranked.height - MAX_SERIES
        read[q.by] = (cost.costed_groups(store, settings, q, per_model=q.by == "model", bucket_s=seconds,
                                         flags=False, keep=keep).collect(), folded)
    return read[q.by]


def _cost_points(store: StoreLike, settings: Settings, q: ReportQuery, seconds: int,
                 metric: str) -> tuple[pl.DataFrame, int]:
    costed, folded = _costed(store, settings, q, seconds)
    if not costed.height:
        return _EMPTY, 0
    costed = _seconds(costed).lazy()
    unpriced = pl.col("cost_usd").is_null()
    per = (costed.group_by("key", "t")
           .agg(pl.col("requests").sum().alias("_weight"),
                pl.when(unpriced.all()).then(None).otherwise(pl.col("cost_usd").sum()).alias("cost_usd"),
                pl.col("requests").filter(~unpriced).sum().alias("_priced"))
           .collect())
    value = pl.col("cost_usd") if metric == "cost_usd" else \
        pl.when(pl.col("_priced") > 0).then(pl.col("cost_usd") / pl.col("_priced"))
    return per.filter(pl.col("key") != loader.FOLDED).select(
        pl.col("key").cast(pl.String), "t", pl.col("_weight").cast(pl.Float64),
        value.cast(pl.Float64).alias("value")), folded


def _gpu_points(store: StoreLike, settings: Settings, q: ReportQuery, seconds: int, metric: str) -> pl.DataFrame:
    per = gpus.per_bucket(store, settings, q, seconds)
    if not per.height:
        return _EMPTY
    per = _seconds(per).with_columns(pl.col("deployment").cast(pl.String)).drop("bucket").rename({"t": "bucket"})
    if "deployment" in q.filters:
        per = per.filter(pl.col("deployment") == q.filters["deployment"])
    if metric == "gpu_utilization":
        if q.by == "deployment":
            out = per.select(pl.col("deployment").alias("key"), "bucket", pl.col("samples").alias("_weight"),
                             (pl.col("util_sum") / pl.col("samples")).alias("value"))
        else:
            out = (per.group_by("bucket").agg((pl.col("util_sum").sum() / pl.col("samples").sum()).alias("value"),
                                              pl.col("samples").sum().alias("_weight"))
                   .select(pl.lit("").alias("key"), "bucket", "_weight", "value"))
        return out.rename({"bucket": "t"}).with_columns(pl.col("_weight").cast(pl.Float64))
    rates = {d.name: (d.gpu_hourly_usd, d.gpus.count) for d in settings.deployments}
    configured = per.filter(pl.col("deployment").is_in(list(rates)))
    if not configured.height:
        return _EMPTY
    rate = pl.col("deployment").replace_strict({k: v[0] for k, v in rates.items()}, return_dtype=pl.Float64)
    count = pl.col("deployment").replace_strict({k: v[1] for k, v in rates.items()}, default=None,
                                                return_dtype=pl.Int64)
    gpus_in = pl.coalesce(count, pl.col("gpus")).cast(pl.Float64)
    idle = gpus_in * rate * (seconds / 3600) * (1 - pl.col("util_sum") / pl.col("samples"))
    out = configured.with_columns(idle.alias("value"))
    if q.by == "deployment":
        out = out.select(pl.col("deployment").alias("key"), "bucket", pl.col("samples").alias("_weight"), "value")
    else:
        out = (out.group_by("bucket").agg(pl.col("value").sum(), pl.col("samples").sum().alias("_weight"))
               .select(pl.lit("").alias("key"), "bucket", "_weight", "value"))
    return out.rename({"bucket": "t"}).with_columns(pl.col("_weight").cast(pl.Float64))


def _pass_points(store: StoreLike, settings: Settings, q: ReportQuery, seconds: int) -> pl.DataFrame:
    """Pass rate per bucket (of the slice keys, `by` may be one), as the quality report
    counts it (analytics/reports/quality.py, analytics/sources/results.py)."""
    keys = quality.parse_keys(q.by) if q.by else []
    table = quality.slice_table(store, settings, q.since, q.until, keys, q.filters, bucket_s=seconds)
    if not table.height:
        return _EMPTY
    key = pl.concat_str([pl.col(k).cast(pl.String) for k in keys], separator=" · ") if keys else pl.lit("")
    return _seconds(table).select(key.alias("key"), "t", pl.col("evaluations").cast(pl.Float64).alias("_weight"),
                        (pl.col("passed") / pl.col("evaluations")).cast(pl.Float64).alias("value"))


_EMPTY = pl.DataFrame(schema={"key": pl.String, "t": pl.Int64, "_weight": pl.Float64, "value": pl.Float64})


def _seconds(df: pl.DataFrame, column: str = "bucket") -> pl.DataFrame:
    """`column` as epoch seconds in `t`: an engine DateTime arrives as them already, a
    DateTime64 as a timestamp."""
    col = pl.col(column)
    t = col.dt.epoch("s") if df.schema[column].is_temporal() else col.cast(pl.Int64)
    return df.with_columns(t.cast(pl.Int64).alias("t"))


def _shape(points: pl.DataFrame, q: ReportQuery, seconds: int, metric: str, folded: int = 0) -> dict[str, Any]:
    """Series per key, the heaviest MAX_SERIES first, each with a point per bucket of
    the window (null where the bucket has nothing to say; 0 for counts). `folded`: keys
    the points leave out already, counted as omitted."""
    start = int(q.since.timestamp()) // seconds * seconds
    end = int(q.until.timestamp())
    grid = list(range(start, end, seconds))
    if not points.height:
        return {"series": [], "omitted": 0}
    weights = points.group_by("key").agg(pl.col("_weight").sum()).sort(["_weight", "key"], descending=[True, False])
    keys = weights.get_column("key").to_list()
    fill = 0.0 if metric in COUNTS else None
    by = q.by
    out = []
    for key in keys[:MAX_SERIES]:
        mine = points.filter(pl.col("key") == key)
        values = dict(zip(mine.get_column("t").to_list(), mine.get_column("value").to_list()))
        pts = [[_iso(t), _clean(values.get(t, fill))] for t in grid]
        out.append({"key": {by: key} if by else {}, "points": pts})
    return {"series": out, "omitted": max(0, len(keys) - MAX_SERIES) + folded}


def _clean(v: Any) -> Any:
    return None if v is None or v != v else v


def _iso(t: int) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def run(metric: str, store: StoreLike, settings: Settings, params: dict[str, Any],
        also: Iterable[str] = ()) -> dict[str, Any]:
    """The API document for `GET /api/v1/series/<metric>?by=&bucket=&…filters` (`also`: as series())."""
    q = ReportQuery.from_params(params)
    with memo.run():  # one call, one run (registry.run)
        return {**series(store, settings, metric, q, params.get("bucket"), also), **q.window_params()}
