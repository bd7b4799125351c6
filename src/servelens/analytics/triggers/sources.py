"""ClickHouse aggregations the trigger detectors test: per window, per baseline.

Detectors compare the evaluation window [since, until) with the baseline before it. Where
the data has a daily rhythm, the fair comparison is with the same hours on earlier days
("like hours"): a row is in the like hours when its time of day falls in the window's
time of day, `positiveModulo(t - since, 1 day) < window`. Each query returns both the
like-hours and the whole-baseline aggregates in one pass, and the detector picks the
like hours when they hold enough data.

Every value is bound server-side; only column names from fixed tables are spliced in.
Nothing returns one row per request: at most one per (subject, minute).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from servelens.analytics import memo
from servelens.analytics.query import _ns
from servelens.analytics.sources import frame, gpus, rollups
from servelens.analytics.sql import (DAY_NS, Fragment, bind, fallback, gpu_busy_metric, gpu_busy_readings,
                                     gpu_deployment, length_class, like_hours, not_before, window)
from servelens.analytics.triggers.base import Evaluation
from servelens.core.config import Settings
from servelens.core.store import StoreLike

_METRICS = {"latency": "LatencySeconds", "ttft": "TtftSeconds"}
_T = "toUnixTimestamp64Nano(Timestamp)"
LIKE_HOURS = like_hours().sql
CURRENT = not_before().sql  # inside [base, until): the evaluation window's rows


def params(at: Evaluation) -> dict[str, int]:
    return {"since_ns": _ns(at.since), "until_ns": _ns(at.until), "base_ns": _ns(at.baseline_since),
            "window_ns": _ns(at.until) - _ns(at.since), "day_ns": DAY_NS}


def latency_tails(store: StoreLike, at: Evaluation, metric: str, deployments: list[str] | None = None,
                  baseline_until: datetime | None = None) -> pl.DataFrame:
    """Per deployment, successful requests only (a fast failure is no latency):
    window n and [p50, p99]; baseline like-hours and whole n and [p50, p99]; and how many
    window requests exceed each baseline p99 (the exceedance test's count). Also the like
    hours' p99.9 as one of their own values (`like_far`, quantileExact: no interpolation,
    so how many like-hours values lie above it follows from like_n) and how many window
    requests exceed it (`over_like_far`: the placement test's count).

    The whole baseline (seven days of every hour) uses a t-digest: an exact quantile would
    hold every value in memory; the like hours (a 24th of it) and the window stay exact.
    `deployments`: only these (a pooled span judges only the deployments it was chosen for).
    `baseline_until`: the baseline [at.baseline_since, baseline_until) instead of one that
    ends where the window starts (an open episode's baseline, from before it started).
    """
    col = _METRICS[metric]
    only = "AND toString(Deployment) IN {deployments:Array(String)}" if deployments is not None else ""
    sql = f"""
        WITH base AS (
            SELECT deployment, count() AS base_n, quantilesTDigest(0.5, 0.99)(x) AS base_q,
                   countIf(like_) AS like_n, quantilesExactInclusiveIf(0.5, 0.99)(x, like_) AS like_q,
                   quantileExactIf(0.999)(x, like_) AS like_far
            FROM (SELECT toString(Deployment) AS deployment, assumeNotNull({col}) AS x, {LIKE_HOURS} AS like_
                  FROM llm_requests
                  WHERE {window("base_ns", "base_until_ns").sql} AND {col} IS NOT NULL AND NOT IsError {only})
            GROUP BY deployment)
        SELECT deployment, count() AS n, quantilesExactInclusive(0.5, 0.99)(x) AS q,
               countIf(x > b.base_q[2]) AS over_base, countIf(x > b.like_q[2]) AS over_like,
               countIf(x > b.like_far) AS over_like_far,
               any(b.base_n) AS base_n, any(b.base_q) AS base_q, any(b.like_n) AS like_n, any(b.like_q) AS like_q,
               any(b.like_far) AS like_far
        FROM (SELECT toString(Deployment) AS deployment, assumeNotNull({col}) AS x FROM llm_requests
              WHERE {window("since_ns", "until_ns").sql} AND {col} IS NOT NULL AND NOT IsError {only}) AS c
        INNER JOIN base AS b USING (deployment)
        GROUP BY deployment
        ORDER BY deployment"""
    return frame(store, sql, {**params(at), "base_until_ns": _ns(baseline_until or at.since),
                              **({"deployments": deployments} if deployments is not None else {})})


def queue_series(store: StoreLike, series_since: datetime, until: datetime, step: timedelta,
                 baseline: timedelta) -> pl.DataFrame:
    """Queue-wait p95 per deployment and step: for the steps of [series_since, until)
    (recent = true, slot = 0, 1, ... in time order) and, for the baseline days before
    them, per step-sized time-of-day phase and day (recent = false, slot = the phase:
    slot i of the series has phase (i · step mod 1 day) / step; day = days before the
    series). `weekend`: the step falls on a Saturday or Sunday (UTC)."""
    p = {"series_ns": _ns(series_since), "until_ns": _ns(until), "base_ns": _ns(series_since - baseline),
         "step_ns": int(step.total_seconds() * 1e9), "day_ns": DAY_NS}
    sql = f"""
        SELECT toString(Deployment) AS deployment,
               toBool({not_before("series_ns").sql}) AS recent,
               if(recent, intDiv({_T} - {{series_ns:Int64}}, {{step_ns:Int64}}),
                  intDiv(positiveModulo({_T} - {{series_ns:Int64}}, {{day_ns:Int64}}), {{step_ns:Int64}})) AS slot,
               if(recent, 0, intDiv({{series_ns:Int64}} - {_T} - 1, {{day_ns:Int64}}) + 1) AS day,
               toBool(toDayOfWeek(min(Timestamp), 0, 'UTC') >= 6) AS weekend,
               count() AS requests,
               quantileExactInclusive(0.95)(assumeNotNull(QueueSeconds)) AS p95
        FROM llm_requests
        WHERE {window("base_ns", "until_ns").sql} AND QueueSeconds IS NOT NULL
        GROUP BY deployment, recent, slot, day
        ORDER BY deployment, recent, slot, day"""
    return frame(store, sql, p)


def reliability_counts(store: StoreLike, settings: Settings, at: Evaluation,
                       services: list[str] | None = None) -> pl.DataFrame:
    """Per service: attempts, errors, retries and originals in the window and the baseline
    (errors also in the like hours). Every attempt is a row, retries included.
    `services`: only these."""
    key = memo.key("sources.reliability_counts", store, settings, at, None if services is None else tuple(services))
    return memo.cached(key, lambda: _reliability_counts(store, settings, at, services))


def _counts(settings: Settings, at: Evaluation) -> tuple[str, dict[str, Any]]:
    """The baseline and window's requests as count rows (rollups.request_counts_sql)."""
    rows, p = rollups.request_counts_sql(settings, _ns(at.baseline_since), _ns(at.until), _align(at))
    return rows, {**p, **params(at)}


def _align(at: Evaluation) -> int:
    """What divides every bound the detectors' predicates draw (the window's start and
    length, a day): a rollup grain that divides it puts each row wholly on one side."""
    return math.gcd(_ns(at.since), _ns(at.until) - _ns(at.since), DAY_NS)


def _reliability_counts(store: StoreLike, settings: Settings, at: Evaluation, services: list[str] | None) -> pl.DataFrame:
    only = "WHERE ServiceName IN {services:Array(String)}" if services is not None else ""
    rows, p = _counts(settings, at)
    sql = f"""
        SELECT service,
               sumIf(Requests, cur) AS n, sumIf(Errors, cur) AS errors,
               sumIf(Retries, cur) AS retries, sumIf(Requests - Retries, cur) AS originals,
               sumIf(Requests, NOT cur) AS base_n, sumIf(Errors, NOT cur) AS base_errors,
               sumIf(Requests, NOT cur AND like_) AS like_n, sumIf(Errors, NOT cur AND like_) AS like_errors,
               sumIf(Retries, NOT cur) AS base_retries,
               sumIf(Requests - Retries, NOT cur) AS base_originals
        FROM (SELECT toString(ServiceName) AS service, Requests, Errors, Retries,
                     {CURRENT} AS cur, {LIKE_HOURS} AS like_
              FROM {rows} {only})
        GROUP BY service
        ORDER BY service"""
    return frame(store, sql, {**p, **({"services": services} if services is not None else {})})


def error_breakdown(store: StoreLike, settings: Settings, at: Evaluation, services: list[str]) -> pl.DataFrame:
    """Per (service, deployment, model) of `services`: attempts and errors in the window, in
    the baseline's like hours and in the whole baseline (what error_rate_spike tests, per part)."""
    rows, p = _counts(settings, at)
    sql = f"""
        SELECT toString(ServiceName) AS service, toString(Deployment) AS deployment, toString(Model) AS model,
               sumIf(Requests, cur) AS n, sumIf(Errors, cur) AS errors,
               sumIf(Requests, NOT cur) AS base_n, sumIf(Errors, NOT cur) AS base_errors,
               sumIf(Requests, NOT cur AND like_) AS like_n, sumIf(Errors, NOT cur AND like_) AS like_errors
        FROM (SELECT ServiceName, Deployment, Model, Requests, Errors,
                     {CURRENT} AS cur, {LIKE_HOURS} AS like_
              FROM {rows}
              WHERE ServiceName IN {{services:Array(String)}})
        GROUP BY service, deployment, model
        ORDER BY service, deployment, model"""
    return frame(store, sql, {**p, "services": services})


def fallback_tails(store: StoreLike, settings: Settings, at: Evaluation, budgets: dict[str, float]) -> pl.DataFrame:
    """Per service with a budget (seconds): fallback attempts in the window, their
    [p50, p99] latency and how many exceed the budget.

    A fallback is what the reliability report counts (analytics.sql.fallback).
    """
    is_fallback = fallback(settings.deployments)
    p = bind(is_fallback, **params(at), services=list(budgets), budgets=list(budgets.values()))
    sql = f"""
        WITH {is_fallback.sql} AS fallback_,
             transform(toString(ServiceName), {{services:Array(String)}}, {{budgets:Array(Float64)}}, 0.) AS budget_
        SELECT toString(ServiceName) AS service, any(budget_) AS budget_s,
               count() AS fallbacks, quantilesExactInclusive(0.5, 0.99)(LatencySeconds) AS q,
               countIf(LatencySeconds > budget_) AS over_budget
        FROM llm_requests
        WHERE {window("since_ns", "until_ns").sql} AND ServiceName IN {{services:Array(String)}} AND fallback_
        GROUP BY service
        ORDER BY service"""
    return frame(store, sql, p)


def gpu_utilization(store: StoreLike, settings: Settings, at: Evaluation) -> pl.DataFrame:
    """Per configured deployment (by host): GPU readings, distinct GPUs, mean busy fraction
    (0-1) in the window and the busy metric it was measured by ("mixed" when its GPUs
    differ). Readings are collapsed and each GPU's metric chosen by analytics.sql's
    gpu_busy_readings, as every gpu_samples reader does (merges may be pending)."""
    deployment = gpu_deployment(settings.deployments)
    readings = gpu_busy_readings(settings.gpus.busy_metric, window())
    sql = f"""
        SELECT {deployment.sql} AS deployment,
               count() AS samples, uniqExact(GpuUuid) AS gpus, avg(busy) AS util_mean,
               if(uniqExact(BusyMetric) > 1, 'mixed', any(BusyMetric)) AS busy_metric
        FROM ({readings.sql})
        WHERE deployment != ''
        GROUP BY deployment
        ORDER BY deployment"""
    return frame(store, sql, bind(deployment, readings, **params(at)))


def category_counts(store: StoreLike, settings: Settings, at: Evaluation, dimensions: list[str]) -> pl.DataFrame:
    """Per service, dimension and value: requests in the window (n), the baseline (base_n)
    and the baseline's like hours (like_n: the window's hours on earlier days). Value ''
    (attribute not set) is kept so the caller can total per dimension. One pass with a
    grouping set per dimension, not a row per request and dimension (BENCHMARKS.md
    "Categories in grouping sets")."""
    length = length_class(settings.quality.length_classes)
    values = {"task_type": "toString(TaskType)", "language": "toString(Language)", "length_class": length.sql,
              "batch_feature": "if(Mode = 'batch', if(Feature = '', '(batch)', toString(Feature)), '')"}
    chosen = [d for d in values if d in dimensions]
    if not chosen:
        return pl.DataFrame(schema={"service": pl.String, "dimension": pl.String, "value": pl.String,
                                    "n": pl.UInt64, "base_n": pl.UInt64, "like_n": pl.UInt64})

    def by_set(exprs: list[str]) -> str:
        """exprs[i] in the rows of the set that groups by d_i (grouping(d_i) = 0, standard SQL)."""
        if len(exprs) == 1:
            return exprs[0]
        return "multiIf(" + "".join(f"grouping(d_{i}) = 0, {e}, " for i, e in enumerate(exprs[:-1])) + f"{exprs[-1]})"

    dimension = by_set([f"'{d}'" for d in chosen])
    value = by_set([f"d_{i}" for i in range(len(chosen))])
    sql = f"""
        SELECT service, dimension, value,
               sumIf(c, cur) AS n, sumIf(c, NOT cur) AS base_n, sumIf(c, NOT cur AND like) AS like_n
        FROM (SELECT service, cur, like, {dimension} AS dimension, {value} AS value, count() AS c
              FROM (SELECT toString(ServiceName) AS service, {CURRENT} AS cur, {LIKE_HOURS} AS like,
                           {", ".join(f"{values[d]} AS d_{i}" for i, d in enumerate(chosen))}
                    FROM llm_requests WHERE {window("base_ns", "until_ns").sql})
              GROUP BY GROUPING SETS ({", ".join(f"(service, cur, like, d_{i})" for i in range(len(chosen)))}))
        GROUP BY service, dimension, value
        ORDER BY service, dimension, value
        SETTINGS force_grouping_standard_compatibility = 1"""
    return frame(store, sql, bind(length, **params(at)))


def minute_features(store: StoreLike, at: Evaluation) -> pl.DataFrame:
    """Per service and minute with arrivals, in the window (current) and the baseline's
    like hours: arrivals, mean log input / output tokens and batch share, with the day
    (0 = the window's, -1 the day before ...) for day-against-day comparisons and whether
    the minute falls on a Saturday or Sunday (UTC)."""
    sql = f"""
        SELECT toString(ServiceName) AS service,
               intDiv({_T} - {{base_ns:Int64}}, 60000000000) AS minute,
               toBool({CURRENT}) AS current,
               toInt64(floor(({_T} - {{since_ns:Int64}}) / {{day_ns:Int64}})) AS day,
               toBool(toDayOfWeek(min(Timestamp), 0, 'UTC') >= 6) AS weekend,
               count() AS arrivals,
               avg(log1p(InputTokens)) AS log_input,
               avg(log1p(OutputTokens)) AS log_output,
               avg(Mode = 'batch') AS batch_share
        FROM llm_requests
        WHERE {window("base_ns", "until_ns").sql}
          AND ({CURRENT} OR {LIKE_HOURS})
        GROUP BY service, minute, current, day
        ORDER BY service, minute"""
    return frame(store, sql, params(at))


# Window index w: 0 is the evaluation window, -1 the one before it, ... Kept: the
# `recent` windows just before, and the like-hour windows (w · window a whole number of days).
_WINDOW_INDEX = f"toInt64(floor(({_T} - {{since_ns:Int64}}) / {{window_ns:Int64}}))"
_KEPT = "(w >= -{recent:Int64} OR positiveModulo(w * {window_ns:Int64}, {day_ns:Int64}) = 0)"


def cost_token_groups(store: StoreLike, settings: Settings, at: Evaluation, boundaries: list[datetime],
                      recent: int) -> pl.DataFrame:
    """Token sums per (window index w, service, model, deployment, price period, retry,
    error): the columns analytics.cost.priced prices, one window at a time."""
    bounds = [_ns(b) for b in boundaries]
    rows, p = rollups.cost_counts_sql(settings, _ns(at.baseline_since), _ns(at.until), _align(at), bounds)
    sql = f"""
        SELECT {_WINDOW_INDEX} AS w, toString(ServiceName) AS service, toString(Model) AS model,
               toString(Deployment) AS deployment,
               arrayCount(b -> fromUnixTimestamp64Nano(b) <= Timestamp, {{bounds:Array(Int64)}}) AS period,
               toUInt8(Retry) AS retry, Error AS error,
               sum(Requests) AS requests, sum(InputTokens) AS input_tokens, sum(OutputTokens) AS output_tokens,
               sum(CachedTokens) AS cached_tokens
        FROM {rows}
        WHERE {_KEPT}
        GROUP BY w, service, model, deployment, period, retry, error"""
    return frame(store, sql, {**p, **params(at), "recent": recent, "bounds": bounds})


def cost_gpu_windows(store: StoreLike, settings: Settings, at: Evaluation, recent: int) -> pl.DataFrame:
    """Per (window index w, GPU): the columns analytics.utilization.deployment_rollup
    needs (analytics.sources.gpus.per_gpu's, per window). Windows of whole hours read the
    hours' busy-time states (gpu_util_hours: readings summed per GPU, metric and hour,
    exactly as from the samples, analytics.sources.gpus), 168 rows per GPU and metric for
    the week's baseline instead of every sample (BENCHMARKS.md "GPU windows from stored
    hours"); other windows, or a baseline off the hours, read the samples."""
    deployment = gpu_deployment(settings.deployments)
    if _align(at) % gpus.HOUR_NS == 0 and _ns(at.baseline_since) % gpus.HOUR_NS == 0:
        readings = gpu_busy_metric(settings.gpus.busy_metric, Fragment(_GPU_HOURS, {}),
                                   Fragment(_GPU_HOURS_WITH_GR, {}), per=_WINDOW_INDEX)
        measures = """sum(Samples) AS samples, toUnixTimestamp64Nano(min(FirstSample)) AS first_ns,
               toUnixTimestamp64Nano(max(LastSample)) AS last_ns, sum(UtilSum) / samples AS util_mean,
               sum(UtilSum) AS util_sum"""
    else:
        readings = gpu_busy_readings(settings.gpus.busy_metric, window("base_ns", "until_ns"), per=_WINDOW_INDEX)
        measures = """count() AS samples, toUnixTimestamp64Nano(min(Timestamp)) AS first_ns,
               toUnixTimestamp64Nano(max(Timestamp)) AS last_ns, avg(busy) AS util_mean, sum(busy) AS util_sum"""
    sql = f"""
        SELECT {_WINDOW_INDEX} AS w,
               {deployment.sql} AS deployment,
               Host AS host, GpuUuid AS gpu, any(BusyMetric) AS busy_metric, {measures}
        FROM ({readings.sql})
        WHERE deployment != '' AND {_KEPT}
        GROUP BY w, deployment, host, gpu"""
    hours = {"full_since_h_s": _ns(at.baseline_since) // 10**9, "full_until_h_s": _ns(at.until) // 10**9}
    return frame(store, sql, bind(deployment, readings, **params(at), **hours, recent=recent))


# The hours' states over [full_since_h_s, full_until_h_s) (analytics.sources.gpus), each
# stamped with its hour as Timestamp, which the window index reads (cost_gpu_windows).
_GPU_HOURS = f"SELECT *, toDateTime64(Minute, 9) AS Timestamp FROM ({gpus.HOURS})"
_GPU_HOURS_WITH_GR = f"SELECT Host, GpuUuid, Timestamp FROM ({_GPU_HOURS}) WHERE BusyMetric = 'gr_engine_active'"
