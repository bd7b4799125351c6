"""Ingest health: why a number is missing, in one place (GET /api/v1/reports/ingest).

One row per (service, dialect): spans seen, LLM requests recognized, and the requests a
report cannot use whole (no token usage, no model, an unpriced model, a stream without
TTFT). A model is priced when the price catalog knows it or a configured GPU deployment
served it in the window (the cost report prices those requests by the GPUs' time; a model
both served there and called elsewhere counts as priced everywhere). Spans of the service
that no dialect recognized but whose attribute keys look like GenAI data (`*token*`,
`*model*`, `*usage*`) are listed with an example trace id: the sign of a dialect servelens
does not read yet, or a key to configure (analytics.sources.span_keys: from the hours the
analytics job stores, over long windows). Quarantined rows (collector.spool) are on
/api/v1/health, beside this report.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import polars as pl

from servelens.analytics.pricing import Catalog
from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import frame, rollups, span_keys
from servelens.analytics.sql import window
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_BY = None


# The whole hours of a window come from the ingest rollups (migrations/0035), its partial
# hours from raw rows: a month of raw rows at 100 M requests was 16 s (BENCHMARKS.md,
# "Ingest health and reliability from hours").
_HOURS = 3600
# The partial hours' rows as the rollups' views compute them (a test holds both equal).
_REQUESTS_RAW = """
    SELECT ServiceName, Dialect, Model, count() AS Requests,
           countIf(InputTokens = 0 AND OutputTokens = 0 AND NOT IsError) AS WithoutUsage,
           countIf(Model = '') AS WithoutModel,
           countIf(Streaming = 1 AND TtftSeconds IS NULL) AS StreamsWithoutTtft,
           any(TraceId) AS ExampleTraceId
    FROM llm_requests WHERE {when}{service} GROUP BY ServiceName, Dialect, Model"""
_REQUESTS_ROLLUP = """
    SELECT ServiceName, Dialect, Model, Requests, WithoutUsage, WithoutModel, StreamsWithoutTtft, ExampleTraceId
    FROM rollup_ingest_1h WHERE {when}{service}"""
_SPANS_RAW = "SELECT ServiceName, count() AS Spans FROM otel_traces WHERE {when}{service} GROUP BY ServiceName"
_SPANS_ROLLUP = "SELECT ServiceName, Spans FROM rollup_spans_1h WHERE {when}{service}"


def _union(q: ReportQuery, settings: Settings, params: dict[str, Any], service: str, rollup: str, raw: str,
           table: str) -> str:
    """[since, until) as one UNION ALL: whole hours from `table`, the rest raw (or all raw
    where analytics.use_rollups is off)."""
    bounds = q.bounds()
    grains = ((table, _HOURS),) if settings.analytics.use_rollups else ()
    parts = rollups.piece_selects(bounds["since_ns"], bounds["until_ns"], grains, params,
                                  lambda _table, when: rollup.format(when=when, service=service),
                                  lambda when: raw.format(when=when, service=service), column="Hour")
    return " UNION ALL ".join(parts) or raw.format(when=window().sql, service=service)


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    params: dict[str, Any] = q.bounds()
    service = ""
    if q.filters.get("service"):
        service, params["service"] = " AND ServiceName = {service:String}", q.filters["service"]
    requests = frame(store, f"""
        SELECT toString(ServiceName) AS service, toString(Dialect) AS dialect, toString(Model) AS model,
               sum(Requests) AS requests, sum(WithoutUsage) AS without_usage, sum(WithoutModel) AS without_model,
               sum(StreamsWithoutTtft) AS streams_without_ttft, any(ExampleTraceId) AS example_trace_id
        FROM ({_union(q, settings, params, service, _REQUESTS_ROLLUP, _REQUESTS_RAW, "rollup_ingest_1h")})
        GROUP BY service, dialect, model""", params)
    spans = frame(store, f"""
        SELECT toString(ServiceName) AS service, sum(Spans) AS spans_seen
        FROM ({_union(q, settings, params, service, _SPANS_ROLLUP, _SPANS_RAW, "rollup_spans_1h")})
        GROUP BY service""", params)
    unknown = span_keys.unrecognized(store, settings, q)
    return _assemble(requests, spans, unknown, Catalog.of(settings.pricing.models), q.until,
                     _gpu_served(store, settings, params))


def _gpu_served(store: StoreLike, settings: Settings, params: dict[str, Any]) -> set[str]:
    """The models the configured GPU deployments served in the hours the window touches
    (the cost rollup's hours: a few rows per model and hour)."""
    deployments = [d.name for d in settings.deployments]
    if not deployments:
        return set()
    served = frame(store, """
        SELECT DISTINCT toString(Model) AS model FROM rollup_costs_models_1h
        WHERE Bucket >= toStartOfHour(fromUnixTimestamp64Nano({since_ns:Int64}))
          AND Bucket < fromUnixTimestamp64Nano({until_ns:Int64}) AND Deployment IN {gpu_deployments:Array(String)}""",
                   {**params, "gpu_deployments": deployments})
    return set(served["model"].to_list()) if served.height else set()


# What per (service, dialect) holds, for a window (or service) with no LLM request.
_PER_DIALECT = {"service": pl.String, "dialect": pl.String, "requests": pl.UInt64, "without_usage": pl.UInt64,
                "without_model": pl.UInt64, "unpriced_requests": pl.UInt64, "unpriced_models": pl.List(pl.String),
                "streams_without_ttft": pl.UInt64, "example_trace_id": pl.String}


def _assemble(requests: pl.DataFrame, spans: pl.DataFrame, unknown: pl.DataFrame, catalog: Catalog,
              at: datetime, gpu_served: set[str]) -> pl.DataFrame:
    models = requests["model"].unique().to_list() if requests.height else []
    priced = {m: m != "" and (m in gpu_served or catalog.price(m, at.astimezone(timezone.utc)) is not None)
              for m in models}
    per_dialect = (
        requests.with_columns(pl.col("model").replace_strict(priced, default=False, return_dtype=pl.Boolean)
                              .alias("priced"))
        .group_by("service", "dialect")
        .agg(pl.col("requests").sum(), pl.col("without_usage").sum(), pl.col("without_model").sum(),
             pl.col("requests").filter(~pl.col("priced") & (pl.col("model") != "")).sum().alias("unpriced_requests"),
             pl.col("model").filter(~pl.col("priced") & (pl.col("model") != "")).unique().sort()
             .alias("unpriced_models"),
             pl.col("streams_without_ttft").sum(), pl.col("example_trace_id").first())
        if requests.height else pl.DataFrame(schema=_PER_DIALECT)
    )
    services = spans.join(unknown, on="service", how="full", coalesce=True) if spans.height else spans
    if not services.height:
        return pl.DataFrame()
    out = services.join(per_dialect, on="service", how="left")
    return out.with_columns(pl.col("requests").fill_null(0).alias("requests"),
                            pl.col("unrecognized_spans").fill_null(0)).sort("service", "dialect", nulls_last=True)
