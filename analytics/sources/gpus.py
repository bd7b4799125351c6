"""Aggregates of GPU utilization samples (DCGM gauges pivoted into gpu_samples).

Every reader works from `_rows`: per (Host, GpuUuid, minute) the additive states of
gpu_util_minutes (sample count, utilization sum, first/last sample time, value -> count)
for the whole minutes inside the window, and for the partial minutes at its edges the
same states built from gpu_samples itself (partial rows collapsed per sample, as they
must be before background merges). So a window of any length and alignment covers
exactly the samples in [since, until), and a 30-day window reads ~43 k rows per GPU, not
one per sample. A sample is a utilization reading (Util not null): the mean is the mean
over samples, and the p95 is taken from the exact value distribution with
quantileExactInclusive's definition (`_p95`), so both equal what aggregating the samples
themselves gives.

Within a run of the report jobs (analytics.memo) each frame is computed once per window.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from analytics import memo
from analytics.query import ReportQuery
from analytics.sources import frame
from servelens.config import Settings

MINUTE_NS = 60 * 10**9
P95 = 0.95

_DEPLOYMENT = "transform(Host, {hosts:Array(String)}, {deployments:Array(String)}, '')"

# The window's samples as per-(Host, GpuUuid, minute) states: whole minutes from the
# rollup, the edges' samples (one row each) from gpu_samples.
_ROWS = """
    SELECT Host, GpuUuid, Minute, ModelName, Samples, UtilSum, FirstSample, LastSample, UtilCounts
    FROM gpu_util_minutes
    WHERE Minute >= toDateTime({full_since_s:Int64}) AND Minute < toDateTime({full_until_s:Int64})
    UNION ALL
    SELECT Host, GpuUuid, toStartOfMinute(Timestamp), ModelName, toUInt64(1), util, Timestamp, Timestamp,
           ([util], [toUInt64(1)])
    FROM (
        SELECT Host, GpuUuid, Timestamp, any(ModelName) AS ModelName, assumeNotNull(anyLast(Util)) AS util
        FROM gpu_samples
        WHERE (Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64})
               AND Timestamp < fromUnixTimestamp64Nano({full_since_ns:Int64}))
           OR (Timestamp >= fromUnixTimestamp64Nano({full_until_ns:Int64})
               AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64}))
        GROUP BY Host, GpuUuid, Timestamp
        HAVING anyLast(Util) IS NOT NULL)"""


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
    return {**b, "full_since_ns": full_since, "full_until_ns": full_until,
            "full_since_s": full_since // 10**9, "full_until_s": full_until // 10**9,
            **host_deployments(settings)}


def host_deployments(settings: Settings) -> dict[str, list[str]]:
    """{"hosts": [...], "deployments": [...]} parallel arrays for transform() in SQL."""
    hosts, names = [], []
    for d in settings.deployments:
        for host in d.gpus.hosts or []:
            hosts.append(host)
            names.append(d.name)
    return {"hosts": hosts, "deployments": names}


def _key(name: str, store: Any, settings: Settings, q: ReportQuery, *extra: Any) -> tuple[Any, ...]:
    b = q.bounds()
    return memo.key(f"gpus.{name}", store, settings, b["since_ns"], b["until_ns"], *extra)


def per_gpu(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per GPU in the window: its deployment (by host), sample count, first/last sample,
    mean and p95 utilization (0-1), and the sum of its samples' utilization.
    """
    sql = f"""
        SELECT {_DEPLOYMENT} AS deployment,
               toString(Host) AS host, toString(GpuUuid) AS gpu, toString(any(ModelName)) AS model_name,
               sum(Samples) AS samples,
               toUnixTimestamp64Nano(min(FirstSample)) AS first_ns,
               toUnixTimestamp64Nano(max(LastSample)) AS last_ns,
               sum(UtilSum) / samples AS util_mean,
               {_p95("UtilCounts")} AS util_p95,
               sum(UtilSum) AS util_sum
        FROM ({_ROWS})
        GROUP BY deployment, host, gpu
        ORDER BY deployment, host, gpu"""
    return memo.cached(_key("per_gpu", store, settings, q),
                       lambda: frame(store, sql, _params(settings, q)))


def deployment_p95(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per deployment: p95 of utilization over all its GPUs' samples in the window."""
    sql = f"""
        SELECT {_DEPLOYMENT} AS deployment, {_p95("UtilCounts")} AS gpu_util_p95
        FROM ({_ROWS})
        GROUP BY deployment"""
    return memo.cached(_key("deployment_p95", store, settings, q),
                       lambda: frame(store, sql, _params(settings, q)))


def per_minute(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per deployment and minute: mean utilization over its GPUs (for peak-to-average)."""
    sql = f"""
        SELECT {_DEPLOYMENT} AS deployment, Minute AS minute, sum(UtilSum) / sum(Samples) AS minute_util
        FROM ({_ROWS})
        GROUP BY deployment, minute"""
    return memo.cached(_key("per_minute", store, settings, q),
                       lambda: frame(store, sql, _params(settings, q)))


def mean_utilization(store: Any, settings: Settings, q: ReportQuery) -> float | None:
    """Mean utilization over every GPU sample in the window; with a deployment filter,
    over that deployment's hosts only. None without samples."""
    params = _params(settings, q)
    only = ""
    if "deployment" in q.filters:
        only = f"WHERE {_DEPLOYMENT} = {{dep:String}}"
        params["dep"] = q.filters["deployment"]

    def compute() -> float | None:
        row = store.client().query(f"SELECT sum(UtilSum) / sum(Samples), sum(Samples) FROM ({_ROWS}) {only}",
                                   parameters=params).first_row
        return float(row[0]) if row and row[1] else None

    return memo.cached(_key("mean_utilization", store, settings, q, q.filters.get("deployment")), compute)
