"""Aggregates of GPU busy time (DCGM gauges pivoted into gpu_samples).

Busy time is measured per GPU and window by one metric (`gpus.busy_metric`): with `auto`
DCGM_FI_PROF_GR_ENGINE_ACTIVE, the fraction of time the graphics engine was active, for a
GPU that reports it anywhere in the window (a profiling field: on MIG instances, where
DCGM_FI_DEV_GPU_UTIL is not reported, it is the only one), else DCGM_FI_DEV_GPU_UTIL
(the share of time any kernel ran, which reads 100 % for a GPU kept busy by a trickle of
work). `gr_engine_active` and `gpu_util` use that metric alone. Each GPU row says which
(`busy_metric`).

Every reader works from `_rows`: per (Host, GpuUuid, busy metric, minute) the additive
states of gpu_util_minutes (sample count, busy sum, first/last sample time, value -> count)
for the whole minutes inside the window, and for the partial minutes at its edges the
same states built from gpu_samples itself (analytics.sql.gpu_readings: partial rows
collapsed per reading, as they must be before background merges). So a window of any length and alignment covers
exactly the readings in [since, until), and a 30-day window reads ~43 k rows per GPU and
metric, not one per sample. A reading is one GPU's (or MIG instance's) value at one time:
the mean is the mean over readings, and the p95 is taken from the value distribution with
quantileExactInclusive's definition (`_p95`), so both equal what aggregating the readings
themselves gives (for DCGM_FI_PROF_GR_ENGINE_ACTIVE the distribution keeps three decimals:
migrations/0017).

Within a run of the report jobs (analytics.memo) each frame is computed once per window.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from servelens.analytics import memo
from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import frame
from servelens.analytics.sql import Fragment, gpu_busy_metric, gpu_deployment, gpu_readings, window
from servelens.core.config import Settings
from servelens.core.store import StoreLike

MINUTE_NS = 60 * 10**9
HOUR_NS = 60 * MINUTE_NS
P95 = 0.95

_DEPLOYMENT = gpu_deployment(()).sql  # the host -> deployment arrays it reads are bound by _params

# The window's partial minutes at its edges (bounds: _params).
_EDGES = f"""({window("since_ns", "full_since_ns").sql})
              OR ({window("full_until_ns", "until_ns").sql})"""

# The window's readings as per-(Host, GpuUuid, busy metric, minute or hour) states: whole
# hours from gpu_util_hours, the whole minutes left from gpu_util_minutes, the edges'
# readings (one row each) from gpu_samples. `_MINUTES` keeps every row a minute (peaks).
# HOURS alone also serves windows of whole hours (triggers.sources.cost_gpu_windows).
_STATE_COLUMNS = "Host, GpuUuid, toString(BusyMetric) AS BusyMetric, Minute, ModelName, Samples, UtilSum, FirstSample, LastSample, UtilCounts"
HOURS = f"""
    SELECT {_STATE_COLUMNS} FROM gpu_util_hours
    WHERE Minute >= toDateTime({{full_since_h_s:Int64}}) AND Minute < toDateTime({{full_until_h_s:Int64}})"""
_EDGE_MINUTES = """((Minute >= toDateTime({full_since_s:Int64}) AND Minute < toDateTime({full_since_h_s:Int64}))
                   OR (Minute >= toDateTime({full_until_h_s:Int64}) AND Minute < toDateTime({full_until_s:Int64})))"""
_ALL_MINUTES = "Minute >= toDateTime({full_since_s:Int64}) AND Minute < toDateTime({full_until_s:Int64})"
_EDGE_READINGS = f"""
    SELECT Host, GpuUuid, BusyMetric, toStartOfMinute(Timestamp), ModelName, toUInt64(1), busy, Timestamp, Timestamp,
           ([if(BusyMetric = 'gr_engine_active', round(busy, 3), busy)], [toUInt64(1)])
    FROM ({gpu_readings(Fragment(_EDGES, {})).sql})"""
_STATES = f"""{HOURS}
    UNION ALL
    SELECT {_STATE_COLUMNS} FROM gpu_util_minutes WHERE {_EDGE_MINUTES}
    UNION ALL {_EDGE_READINGS}"""
_MINUTES = f"""
    SELECT {_STATE_COLUMNS} FROM gpu_util_minutes WHERE {_ALL_MINUTES}
    UNION ALL {_EDGE_READINGS}"""


# The GPUs with graphics-engine readings in the window: a cheaper pass than the readings'
# (no collapsing: one non-null value is enough). A window on the hours' grid has no edge:
# its hours alone (the query's plan is most of its cost on a day's hours; BENCHMARKS.md,
# "One trace by id at 100 M").
_WITH_GR_HOURS = """
    SELECT Host, GpuUuid FROM gpu_util_hours
    WHERE Minute >= toDateTime({full_since_h_s:Int64}) AND Minute < toDateTime({full_until_h_s:Int64})
      AND BusyMetric = 'gr_engine_active'"""
_WITH_GR = f"""{_WITH_GR_HOURS}
    UNION ALL
    SELECT Host, GpuUuid FROM gpu_util_minutes WHERE {_EDGE_MINUTES} AND BusyMetric = 'gr_engine_active'
    UNION ALL
    SELECT Host, GpuUuid FROM gpu_samples WHERE ({_EDGES}) AND GrEngineActive IS NOT NULL"""


def _rows(settings: Settings, minutes: bool = False, q: ReportQuery | None = None) -> str:
    """SQL: the window's states of the busy metric each GPU is measured by (`minutes`:
    each row one minute, for per-minute peaks and buckets under an hour). With `q` on the
    hours' grid, from the stored hours alone."""
    if not minutes and q is not None and _on_hours(q):
        return gpu_busy_metric(settings.gpus.busy_metric, Fragment(HOURS, {}), Fragment(_WITH_GR_HOURS, {})).sql
    return gpu_busy_metric(settings.gpus.busy_metric, Fragment(_MINUTES if minutes else _STATES, {}),
                           Fragment(_WITH_GR, {})).sql


def _on_hours(q: ReportQuery) -> bool:
    b = q.bounds()
    return b["since_ns"] % HOUR_NS == 0 and b["until_ns"] % HOUR_NS == 0 and b["since_ns"] < b["until_ns"]


def busy_metric_of(column: str = "busy_metric") -> pl.Expr:
    """Polars aggregation: the busy metric of a group of GPUs, "mixed" when they differ."""
    values = pl.col(column).drop_nulls()
    return pl.when(values.n_unique() > 1).then(pl.lit("mixed")).otherwise(values.first()).alias(column)


def _p95(states: str) -> str:
    """SQL: quantileExactInclusive(0.95) of the samples whose value -> count maps merge to
    sumMap(states), computed as ClickHouse computes it from the sorted samples
    (h = 0.95 (n - 1) + 1, k = floor(h), the values v at sorted positions k - 1 and k,
    v[k-1] + (h - k) (v[k] - v[k-1]); the largest value when k >= n), so the result is the
    same float. Null without samples."""
    return f"""multiIf(
        (arraySum((sumMap({states}) AS m_).2) AS n_) = 0, NULL,
        (toUInt64(({P95} * (n_ - 1) + 1) AS h_) AS k_) >= n_, m_.1[-1],
        (m_.1[arrayFirstIndex(c -> c >= k_, arrayCumSum(m_.2) AS cum_)] AS lo_)
            + (h_ - k_) * (m_.1[arrayFirstIndex(c -> c >= k_ + 1, cum_)] - lo_))"""


def _params(settings: Settings, q: ReportQuery) -> dict[str, Any]:
    """The window's bounds, its whole minutes [full_since, full_until) and the host ->
    deployment mapping. A window inside one minute has no whole minute: all of it is edge."""
    b = q.bounds()
    since_ns, until_ns = b["since_ns"], b["until_ns"]
    full_since = -(-since_ns // MINUTE_NS) * MINUTE_NS
    full_until = until_ns // MINUTE_NS * MINUTE_NS
    if full_since >= full_until:
        full_since = full_until = until_ns
    # its whole hours, inside the whole minutes (none: both at full_until, so no hour row)
    full_since_h = -(-full_since // HOUR_NS) * HOUR_NS
    full_until_h = full_until // HOUR_NS * HOUR_NS
    if full_since_h >= full_until_h:
        full_since_h = full_until_h = full_until
    return {**b, "full_since_ns": full_since, "full_until_ns": full_until,
            "full_since_s": full_since // 10**9, "full_until_s": full_until // 10**9,
            "full_since_h_s": full_since_h // 10**9, "full_until_h_s": full_until_h // 10**9,
            "busy_metric": settings.gpus.busy_metric, **gpu_deployment(settings.deployments).params}


def _key(name: str, store: StoreLike, settings: Settings, q: ReportQuery, *extra: Any) -> tuple[Any, ...]:
    b = q.bounds()
    return memo.key(f"gpus.{name}", store, settings, b["since_ns"], b["until_ns"], *extra)


def per_gpu(store: StoreLike, settings: Settings, q: ReportQuery, p95: bool = True) -> pl.DataFrame:
    """Per GPU in the window: its deployment (by host), the busy metric it is measured by,
    reading count, first/last reading, mean and p95 busy fraction (0-1), and their sum.
    `p95=False`: util_p95 null, for what needs only the mean (a cost: the p95 merges every
    GPU's value counts, most of the query)."""
    full = _key("per_gpu", store, settings, q)
    known = None if p95 else memo.get(full)  # read with the p95 already in this run: a superset
    if known is not None:
        return known  # type: ignore[no-any-return]
    p95_sql = _p95("UtilCounts") if p95 else "CAST(NULL AS Nullable(Float64))"
    sql = f"""
        SELECT {_DEPLOYMENT} AS deployment,
               toString(Host) AS host, toString(GpuUuid) AS gpu, toString(any(ModelName)) AS model_name,
               any(BusyMetric) AS busy_metric,
               sum(Samples) AS samples,
               toUnixTimestamp64Nano(min(FirstSample)) AS first_ns,
               toUnixTimestamp64Nano(max(LastSample)) AS last_ns,
               sum(UtilSum) / samples AS util_mean,
               {p95_sql} AS util_p95,
               sum(UtilSum) AS util_sum
        FROM ({_rows(settings, q=q)})
        GROUP BY deployment, host, gpu
        ORDER BY deployment, host, gpu"""
    return memo.cached(full if p95 else _key("per_gpu_mean", store, settings, q),
                       lambda: frame(store, sql, _params(settings, q)))


def deployment_p95(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per deployment: p95 of utilization over all its GPUs' samples in the window."""
    sql = f"""
        SELECT {_DEPLOYMENT} AS deployment, {_p95("UtilCounts")} AS gpu_util_p95
        FROM ({_rows(settings)})
        GROUP BY deployment"""
    return memo.cached(_key("deployment_p95", store, settings, q),
                       lambda: frame(store, sql, _params(settings, q)))


def per_minute(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per deployment and minute: mean utilization over its GPUs (for peak-to-average)."""
    sql = f"""
        SELECT {_DEPLOYMENT} AS deployment, Minute AS minute, sum(UtilSum) / sum(Samples) AS minute_util
        FROM ({_rows(settings, minutes=True)})
        GROUP BY deployment, minute"""
    return memo.cached(_key("per_minute", store, settings, q),
                       lambda: frame(store, sql, _params(settings, q)))


def per_bucket(store: StoreLike, settings: Settings, q: ReportQuery, seconds: int) -> pl.DataFrame:
    """Per deployment and time bucket: readings, their busy sum and the GPUs seen (charts)."""
    sql = f"""
        SELECT {_DEPLOYMENT} AS deployment,
               toStartOfInterval(Minute, INTERVAL {int(seconds)} SECOND) AS bucket,
               sum(Samples) AS samples, sum(UtilSum) AS util_sum, uniqExact(Host, GpuUuid) AS gpus
        FROM ({_rows(settings, minutes=seconds % 3600 != 0)})
        GROUP BY deployment, bucket"""
    return memo.cached(_key("per_bucket", store, settings, q, seconds),
                       lambda: frame(store, sql, _params(settings, q)))


def mean_utilization(store: StoreLike, settings: Settings, q: ReportQuery) -> float | None:
    """Mean utilization over every GPU sample in the window; with a deployment filter,
    over that deployment's hosts only. None without samples."""
    params = _params(settings, q)
    only = ""
    if "deployment" in q.filters:
        only = f"WHERE {_DEPLOYMENT} = {{dep:String}}"
        params["dep"] = q.filters["deployment"]

    def compute() -> float | None:
        row = store.client().query(f"SELECT sum(UtilSum) / sum(Samples), sum(Samples) FROM ({_rows(settings)}) {only}",
                                   parameters=params).first_row
        return float(row[0]) if row and row[1] else None

    return memo.cached(_key("mean_utilization", store, settings, q, q.filters.get("deployment")), compute)
