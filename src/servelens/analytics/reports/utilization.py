"""The `utilization` report: GPU utilization and what the idle part costs (SPEC 4, 5).

A deployment's GPUs in a window are the distinct GPU UUIDs seen in its hosts' DCGM
samples (or its configured `count`); utilization is the mean busy fraction over those
samples, each GPU measured by one metric (`gpus.busy_metric`, analytics.sources.gpus):
DCGM_FI_PROF_GR_ENGINE_ACTIVE where the GPU reports it, else DCGM_FI_DEV_GPU_UTIL/100.
The `busy_metric` column names it per GPU (`gr_engine_active` | `gpu_util`), and per
deployment ("mixed" when its GPUs differ). Provisioned cost = GPU-hours x hourly rate,
busy = provisioned x utilization, idle = provisioned - busy.

GPU-hours: a GPU seen in the window is counted for the part of the window its samples
span (n samples spanning t seconds stand for t * n / (n - 1) seconds: each sample covers
one interval), capped at the window; with regular sampling over the whole window this is
exactly "GPUs x hours in window". A GPU that appears mid-window is not charged for the
hours before anyone saw it. `count` deployments are charged for the whole window; without
samples their utilization is unknown (null), and so are busy and idle cost.
"""

from __future__ import annotations

import polars as pl

from servelens.analytics.query import QueryError, ReportQuery
from servelens.analytics.sources import gpus as source
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_BY = "deployment"
SINGLE_SAMPLE_SECONDS = 15.0  # one sample stands for one typical scrape interval

_GPU_SCHEMA = {"deployment": pl.String, "host": pl.String, "gpu": pl.String, "model_name": pl.String,
               "busy_metric": pl.String, "samples": pl.UInt64, "first_ns": pl.Int64, "last_ns": pl.Int64,
               "util_mean": pl.Float64, "util_p95": pl.Float64, "util_sum": pl.Float64}


def gpu_hours(gpus: pl.LazyFrame, window_hours: float) -> pl.LazyFrame:
    span_h = (pl.col("last_ns") - pl.col("first_ns")) / 3.6e12
    n = pl.col("samples").cast(pl.Float64)
    hours = (pl.when(n >= 2).then(span_h * n / (n - 1)).otherwise(SINGLE_SAMPLE_SECONDS / 3600)
             .clip(upper_bound=window_hours))
    return gpus.with_columns(hours.alias("gpu_hours"))


def _rates(settings: Settings) -> pl.LazyFrame:
    return pl.LazyFrame(
        {"deployment": [d.name for d in settings.deployments],
         "rate": [d.gpu_hourly_usd for d in settings.deployments],
         "count": [d.gpus.count for d in settings.deployments]},
        schema={"deployment": pl.String, "rate": pl.Float64, "count": pl.Int64})


def deployment_rollup(gpus: pl.LazyFrame, minutes: pl.LazyFrame, settings: Settings,
                      window_hours: float) -> pl.LazyFrame:
    """One row per configured deployment: gpus, utilization, provisioned/busy/idle cost."""
    seen = (
        gpu_hours(gpus, window_hours)
        .group_by("deployment")
        .agg(
            pl.col("gpu").n_unique().alias("gpus_seen"),
            (pl.col("util_sum").sum() / pl.col("samples").sum()).alias("gpu_util_mean"),
            pl.col("gpu_hours").sum().alias("gpu_hours_seen"),
            (pl.col("gpu_hours") * pl.col("util_mean")).sum().alias("busy_gpu_hours"),
            source.busy_metric_of(),
        )
    )
    peaks = minutes.group_by("deployment").agg(pl.col("minute_util").max().alias("util_minute_peak"))
    counted = pl.col("count").is_not_null()
    return (
        _rates(settings)
        .join(seen, on="deployment", how="left")
        .join(peaks, on="deployment", how="left")
        .with_columns(
            pl.when(counted).then(pl.col("count")).otherwise(pl.col("gpus_seen").fill_null(0)).alias("gpus"),
            pl.when(counted).then(pl.col("count") * window_hours)
            .otherwise(pl.col("gpu_hours_seen").fill_null(0.0)).alias("gpu_hours"),
        )
        .with_columns((pl.col("gpu_hours") * pl.col("rate")).alias("provisioned_cost_usd"))
        .with_columns(
            pl.when(counted).then(pl.col("provisioned_cost_usd") * pl.col("gpu_util_mean"))
            .otherwise(pl.col("busy_gpu_hours").fill_null(0.0) * pl.col("rate")).alias("busy_cost_usd"))
        .with_columns(
            (pl.col("provisioned_cost_usd") - pl.col("busy_cost_usd")).alias("idle_cost_usd"),
            (pl.col("util_minute_peak") / pl.col("gpu_util_mean")).alias("peak_to_average"),
        )
    )


def _window_hours(q: ReportQuery) -> float:
    return (q.until - q.since).total_seconds() / 3600


def _gpus(store: StoreLike, settings: Settings, q: ReportQuery, p95: bool = True) -> pl.LazyFrame:
    gpus = source.per_gpu(store, settings, q, p95)
    return (gpus if gpus.height else pl.DataFrame(schema=_GPU_SCHEMA)).lazy()


def _gpu_frames(store: StoreLike, settings: Settings, q: ReportQuery) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    return _gpus(store, settings, q), source.per_minute(store, settings, q).lazy()


def deployment_costs(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """deployment, provisioned_cost_usd, busy_cost_usd, idle_cost_usd (for cost allocation)."""
    if not settings.deployments:
        return pl.DataFrame(schema={"deployment": pl.String, "provisioned_cost_usd": pl.Float64,
                                    "busy_cost_usd": pl.Float64, "idle_cost_usd": pl.Float64})
    # the costs need each GPU's hours and mean, not its p95 nor the per-minute peaks
    no_minutes = pl.LazyFrame(schema={"deployment": pl.String, "minute_util": pl.Float64})
    return (deployment_rollup(_gpus(store, settings, q, p95=False), no_minutes, settings, _window_hours(q))
            .select("deployment", "provisioned_cost_usd", "busy_cost_usd", "idle_cost_usd").collect())


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    by = q.by or DEFAULT_BY
    hours = _window_hours(q)
    if by == "gpu":
        gpus = _gpus(store, settings, q)
        rates = _rates(settings).select("deployment", "rate")
        return (
            gpu_hours(gpus, hours).join(rates, on="deployment", how="left")
            .select(
                pl.col("gpu"), pl.col("deployment"), pl.col("host"), pl.col("model_name"),
                pl.col("busy_metric"), pl.lit(1).alias("gpus"),
                pl.col("util_mean").alias("gpu_util_mean"), pl.col("util_p95").alias("gpu_util_p95"),
                (pl.col("util_p95") / pl.col("util_mean")).alias("peak_to_average"),
                (pl.col("gpu_hours") * pl.col("rate")).alias("provisioned_cost_usd"),
                (pl.col("gpu_hours") * pl.col("rate") * pl.col("util_mean")).alias("busy_cost_usd"),
            )
            .with_columns((pl.col("provisioned_cost_usd") - pl.col("busy_cost_usd")).alias("idle_cost_usd"))
            .sort("deployment", "host", "gpu")
            .collect()
        )
    if by != "deployment":
        raise QueryError("utilization is grouped by deployment or gpu")
    gpus, minutes = _gpu_frames(store, settings, q)
    p95 = source.deployment_p95(store, settings, q).lazy()
    return (
        deployment_rollup(gpus, minutes, settings, hours)
        .join(p95, on="deployment", how="left")
        .select("deployment", "gpus", "busy_metric", "gpu_util_mean", "gpu_util_p95", "peak_to_average",
                "provisioned_cost_usd", "busy_cost_usd", "idle_cost_usd")
        .sort("idle_cost_usd", descending=True, nulls_last=True)
        .collect()
    )
