"""Aggregates of llm_requests (one typed row per LLM request)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import polars as pl

from analytics.query import ReportQuery, key_expr
from analytics.sources import frame
from servelens.config import Settings

QUANTILES = (0.5, 0.95, 0.99)
# quantilesExactInclusive interpolates linearly between closest ranks (numpy's default
# "linear" method): exact, and cheap at these sizes since ClickHouse sorts per group.
_Q = "quantilesExactInclusive(0.5, 0.95, 0.99)"


def latency_groups(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per group: request count and exact p50/p95/p99 of TTFT, latency and TPOT (seconds)."""
    where, params = q.where(settings.attributes)
    key_sql, key_params = key_expr(q.by, settings.attributes) if q.by else ("''", {})
    params.update(key_params)
    sql = f"""
        SELECT {key_sql} AS key,
               count() AS requests,
               {_Q}(TtftSeconds) AS ttft,
               {_Q}(LatencySeconds) AS latency,
               {_Q}(if(OutputTokens > 1 AND LatencySeconds > TtftSeconds,
                       (LatencySeconds - TtftSeconds) / (OutputTokens - 1), NULL)) AS tpot
        FROM llm_requests
        WHERE {where}
        GROUP BY key
        ORDER BY requests DESC, key"""
    return frame(store, sql, params)


def cost_groups(store: Any, settings: Settings, q: ReportQuery, boundaries: list[datetime]) -> pl.DataFrame:
    """Token sums per (key, model, price period, retry?, error?, outcome?).

    `period` counts the catalog's effective_from boundaries at or before the request, so
    no price changes inside a group and pricing it in Polars is exact.
    """
    where, params = q.where(settings.attributes)
    key_sql, key_params = key_expr(q.by, settings.attributes) if q.by else ("''", {})
    params.update(key_params)
    params["bounds"] = [int(b.timestamp() * 1e9) for b in boundaries]
    sql = f"""
        SELECT {key_sql} AS key,
               Model AS model,
               Deployment AS deployment,
               arrayCount(b -> fromUnixTimestamp64Nano(b) <= Timestamp, {{bounds:Array(Int64)}}) AS period,
               RetryAttempt > 0 AS retry,
               IsError AS error,
               count() AS requests,
               sum(InputTokens) AS input_tokens,
               sum(OutputTokens) AS output_tokens,
               sum(least(CachedInputTokens, InputTokens)) AS cached_tokens
        FROM llm_requests
        WHERE {where}
        GROUP BY key, model, deployment, period, retry, error"""
    return frame(store, sql, params)


def overview_totals(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    where, params = q.where(settings.attributes)
    sql = f"""
        SELECT count() AS requests,
               quantileExactInclusive(0.99)(TtftSeconds) AS ttft_p99,
               quantileExactInclusive(0.99)(LatencySeconds) AS latency_p99,
               countIf(IsError) AS errors,
               countIf(RetryAttempt > 0) AS retries
        FROM llm_requests
        WHERE {where}"""
    return frame(store, sql, params)


def stage_p99(store: Any, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """Per deployment: p99 of the LLM span's queue, prefill and decode times (seconds)."""
    where, params = q.where(settings.attributes)
    sql = f"""
        SELECT Deployment AS deployment,
               quantileExactInclusive(0.99)(QueueSeconds) AS queue,
               quantileExactInclusive(0.99)(PrefillSeconds) AS prefill,
               quantileExactInclusive(0.99)(DecodeSeconds) AS decode,
               quantileExactInclusive(0.99)(LatencySeconds) AS total
        FROM llm_requests
        WHERE {where}
        GROUP BY deployment"""
    return frame(store, sql, params)


def gpu_utilization(store: Any, q: ReportQuery) -> float | None:
    """Mean of DCGM_FI_DEV_GPU_UTIL / 100 over the window (OpenLIT's gpu.utilization too)."""
    sql = """
        SELECT avg(Value) / 100 AS util, count() AS samples
        FROM otel_metrics_gauge
        WHERE MetricName IN ('DCGM_FI_DEV_GPU_UTIL', 'gpu.utilization')
          AND TimeUnix >= fromUnixTimestamp64Nano({since_ns:Int64})
          AND TimeUnix < fromUnixTimestamp64Nano({until_ns:Int64})"""
    row = store.client().query(sql, parameters=q.bounds()).first_row
    return float(row[0]) if row and row[1] else None
