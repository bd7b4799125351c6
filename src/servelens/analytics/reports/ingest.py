"""Ingest health: why a number is missing, in one place (GET /api/v1/reports/ingest).

One row per (service, dialect): spans seen, LLM requests recognized, and the requests a
report cannot use whole (no token usage, no model, an unpriced model, a stream without
TTFT). Spans of the service that no dialect recognized but whose attribute keys look like
GenAI data (`*token*`, `*model*`, `*usage*`) are listed with an example trace id: the
sign of a dialect servelens does not read yet, or a key to configure (analytics.sources.span_keys:
from the hours the analytics job stores, over long windows). Quarantined rows
(collector.spool) are on /api/v1/health, beside this report.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import polars as pl

from servelens.analytics.pricing import Catalog
from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import frame, span_keys
from servelens.analytics.sql import window
from servelens.core.config import Settings
from servelens.core.store import StoreLike

DEFAULT_BY = None


def report(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    in_window = window().sql
    params: dict[str, Any] = q.bounds()
    service = ""
    if q.filters.get("service"):
        service, params["service"] = " AND ServiceName = {service:String}", q.filters["service"]
    requests = frame(store, f"""
        SELECT ServiceName AS service, Dialect AS dialect, Model AS model,
               count() AS requests,
               countIf(InputTokens = 0 AND OutputTokens = 0 AND NOT IsError) AS without_usage,
               countIf(Model = '') AS without_model,
               countIf(Streaming = 1 AND TtftSeconds IS NULL) AS streams_without_ttft,
               any(TraceId) AS example_trace_id
        FROM llm_requests WHERE {in_window}{service}
        GROUP BY service, dialect, model""", params)
    spans = frame(store, f"""
        SELECT ServiceName AS service, count() AS spans_seen
        FROM otel_traces WHERE {in_window}{service} GROUP BY service""", params)
    unknown = span_keys.unrecognized(store, settings, q)
    return _assemble(requests, spans, unknown, Catalog.of(settings.pricing.models), q.until)


# What per (service, dialect) holds, for a window (or service) with no LLM request.
_PER_DIALECT = {"service": pl.String, "dialect": pl.String, "requests": pl.UInt64, "without_usage": pl.UInt64,
                "without_model": pl.UInt64, "unpriced_requests": pl.UInt64, "unpriced_models": pl.List(pl.String),
                "streams_without_ttft": pl.UInt64, "example_trace_id": pl.String}


def _assemble(requests: pl.DataFrame, spans: pl.DataFrame, unknown: pl.DataFrame, catalog: Catalog,
              at: datetime) -> pl.DataFrame:
    models = requests["model"].unique().to_list() if requests.height else []
    priced = {m: m != "" and catalog.price(m, at.astimezone(timezone.utc)) is not None for m in models}
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
