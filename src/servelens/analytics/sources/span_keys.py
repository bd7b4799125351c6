"""Attribute keys that look like GenAI data on spans no dialect reads (the ingest report's
unrecognized keys; a dialect reads a span as an LLM request, a step of one, or the outer
span of a call: dialects.sql_is_read): per service, its most frequent such keys with an
example trace id each.

Read from the hours the analytics job has stored (analytics.span_hours,
rollup_span_keys_1h) where a window holds them whole, from the spans for the rest; the
answer is the same either way.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from servelens.analytics.query import ReportQuery
from servelens.analytics.sources import frame, rollups, traces
from servelens.analytics.sql import window
from servelens.collector.mapping.dialects import sql_is_read
from servelens.core.config import Settings
from servelens.core.store import StoreLike

JOB = "span_keys_hours"  # its name in analytics_results / analytics_leases
ROLLUP = "rollup_span_keys_1h"
# A key looks like GenAI data when its name holds one of these (any case). A substring
# search of each key, not a regular expression: every key of every span is tested.
GENAI_LOOKING = ("token", "model", "usage")
MAX_KEYS = 10  # keys shown per service


def _keys_sql(where: str) -> str:
    """Per (ServiceName, Key) of the spans matching `where`: Spans, Example (a trace id)."""
    needles = ", ".join(f"'{n}'" for n in GENAI_LOOKING)
    return f"""
        SELECT ServiceName, key AS Key, count() AS Spans, any(TraceId) AS Example
        FROM (SELECT ServiceName, TraceId, SpanName, StatusCode, ScopeName, SpanAttributes AS a FROM otel_traces
              WHERE {where})
        ARRAY JOIN arrayFilter(k -> multiSearchAnyCaseInsensitive(k, [{needles}]), mapKeys(a)) AS key
        WHERE NOT ({sql_is_read()})
        GROUP BY ServiceName, Key"""


def hour_rows_sql() -> str:
    """One hour's rows of rollup_span_keys_1h: the spans in [since_ns, until_ns)."""
    return _keys_sql(window().sql)


def unrecognized(store: StoreLike, settings: Settings, q: ReportQuery) -> pl.DataFrame:
    """service, unrecognized_keys (the MAX_KEYS most frequent), unrecognized_examples (a
    trace id for each), unrecognized_spans (spans by key, all keys added up)."""
    params: dict[str, Any] = {}
    service = ""
    if q.filters.get("service"):
        service, params["service"] = " AND ServiceName = {service:String}", q.filters["service"]
    bounds = q.bounds()
    stored = traces.hours_stored(store, JOB) if settings.analytics.use_rollups else None
    pieces = (traces.hour_pieces(bounds["since_ns"], bounds["until_ns"], stored, ((ROLLUP, 3600),)) if stored
              else [rollups.Piece("", bounds["since_ns"], bounds["until_ns"])])
    parts = rollups.selects_of(
        pieces, params,
        lambda table, when: f"SELECT ServiceName, Key, Spans, Example FROM {table} WHERE {when}{service}",
        lambda when: _keys_sql(when + service), column="Hour")
    return frame(store, f"""
        SELECT service, groupArray({MAX_KEYS})(key) AS unrecognized_keys,
               groupArray({MAX_KEYS})(example) AS unrecognized_examples,
               sum(n) AS unrecognized_spans
        FROM (SELECT toString(ServiceName) AS service, toString(Key) AS key, sum(Spans) AS n, any(Example) AS example
              FROM ({' UNION ALL '.join(parts)})
              GROUP BY service, key
              ORDER BY n DESC, key)
        GROUP BY service""", params)
