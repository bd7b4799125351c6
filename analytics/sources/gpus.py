"""Aggregates of gpu_samples (one row per GPU per sample time, pivoted from DCGM gauges)."""

from __future__ import annotations

from typing import Any

import polars as pl

from analytics.query import ReportQuery
from analytics.sources import frame
from servelens.config import Settings


# One row per GPU sample: the table is an AggregatingMergeTree whose background merges
# may not have collapsed a sample's partial rows yet, so collapse them here.
_SAMPLES = """
    SELECT Host, GpuUuid, Timestamp, any(ModelName) AS ModelName, anyLast(Util) AS util
    FROM gpu_samples
    WHERE Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64})
      AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})
    GROUP BY Host, GpuUuid, Timestamp"""


def host_deployments(settings: Settings) -> dict[str, list[str]]:
    """{"hosts": [...], "deployments": [...]} parallel arrays for transform() in SQL."""
    hosts, names = [], []
    for d in settings.deployments:
        for host in d.gpus.hosts or []:
            hosts.append(host)
            names.append(d.name)
    return {"hosts": hosts, "deployments": names}


def per_gpu(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per GPU in the window: its deployment (by host), sample count, first/last sample,
    mean and p95 utilization (0-1), and the peak of its per-minute mean utilization.
    """
    mapping = host_deployments(settings)
    params = {**q.bounds(), **mapping}
    sql = f"""
        SELECT transform(Host, {{hosts:Array(String)}}, {{deployments:Array(String)}}, '') AS deployment,
               Host AS host, GpuUuid AS gpu, any(ModelName) AS model_name,
               count() AS samples,
               toUnixTimestamp64Nano(min(Timestamp)) AS first_ns,
               toUnixTimestamp64Nano(max(Timestamp)) AS last_ns,
               avg(util) AS util_mean,
               quantileExactInclusive(0.95)(util) AS util_p95,
               sum(util) AS util_sum
        FROM ({_SAMPLES})
        WHERE util IS NOT NULL
        GROUP BY deployment, host, gpu
        ORDER BY deployment, host, gpu"""
    return frame(store, sql, params)


def deployment_p95(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per deployment: p95 of utilization over all its GPUs' samples in the window."""
    params = {**q.bounds(), **host_deployments(settings)}
    sql = f"""
        SELECT transform(Host, {{hosts:Array(String)}}, {{deployments:Array(String)}}, '') AS deployment,
               quantileExactInclusive(0.95)(util) AS gpu_util_p95
        FROM ({_SAMPLES})
        WHERE util IS NOT NULL
        GROUP BY deployment"""
    return frame(store, sql, params)


def per_minute(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per deployment and minute: mean utilization over its GPUs (for peak-to-average)."""
    params = {**q.bounds(), **host_deployments(settings)}
    sql = f"""
        SELECT transform(Host, {{hosts:Array(String)}}, {{deployments:Array(String)}}, '') AS deployment,
               toStartOfMinute(Timestamp) AS minute, avg(util) AS minute_util
        FROM ({_SAMPLES})
        WHERE util IS NOT NULL
        GROUP BY deployment, minute"""
    return frame(store, sql, params)


def mean_utilization(store: Any, settings: Settings, q: ReportQuery) -> float | None:
    """Mean utilization over every GPU sample in the window; with a deployment filter,
    over that deployment's hosts only. None without samples."""
    params = {**q.bounds(), **host_deployments(settings)}
    only = ""
    if "deployment" in q.filters:
        only = "WHERE transform(Host, {hosts:Array(String)}, {deployments:Array(String)}, '') = {dep:String}"
        params["dep"] = q.filters["deployment"]
    row = store.client().query(f"SELECT avg(util), count() FROM ({_SAMPLES}) {only}", parameters=params).first_row
    return float(row[0]) if row and row[1] else None
