"""store.retention_days as table TTLs: whole day-partitions drop once they are older.

A table's TTL is its partition key (the row's day) + retention + 1 day: every row of a
day expires at the same instant, the end of that day plus the retention, so
- ttl_only_drop_parts drops the day's parts whole, never rewriting them row by row;
- a raw table and its rollups (gpu_samples / gpu_util_minutes, otel_metrics_histogram /
  genai_metric_histograms) lose a day together: at the edge both hold it or neither;
- every row is kept at least `days` days (the collector refuses older ones at ingest).

Applied after migrations, only where the TTL in force differs, with
materialize_ttl_after_modify=0 so a change never rewrites existing parts in one go.
"""

from __future__ import annotations

import re
from typing import Any

# table -> its partition key, the day its rows expire with (a test checks they match)
TTL_COLUMNS = {
    "otel_traces": "toDate(Timestamp)",
    "otel_traces_trace_id_ts": "toDate(Start)",
    "otel_metrics_gauge": "toDate(TimeUnix)",
    "otel_metrics_sum": "toDate(TimeUnix)",
    "otel_metrics_histogram": "toDate(TimeUnix)",
    "otel_logs": "toDate(TimestampTime)",
    "llm_requests": "toDate(Timestamp)",
    "trace_outcomes": "toDate(Timestamp)",
    "gpu_samples": "toDate(Timestamp)",
    "gpu_util_minutes": "toDate(Minute)",
    "gpu_util_hours": "toDate(Minute)",
    "engine_samples": "toDate(Timestamp)",
    "stage_spans": "toDate(Timestamp)",
    "evaluations": "toDate(Timestamp)",
    "genai_metric_histograms": "toDate(Minute)",
    "rollup_requests_1m": "toDate(Minute)",
    "rollup_requests_1h": "toDate(Minute)",
    "rollup_requests_6h": "toDate(Minute)",
    "rollup_costs_15m": "toDate(Bucket)",
    "rollup_costs_6h": "toDate(Bucket)",
    "rollup_costs_1d": "toDate(Bucket)",
    "rollup_costs_models_1h": "toDate(Bucket)",
    "rollup_stages_1h": "toDate(Hour)",
    "rollup_stages_6h": "toDate(Hour)",
    "rollup_stages_5m": "toDate(Hour)",
    "rollup_span_keys_1h": "toDate(Hour)",
    "rollup_ingest_1h": "toDate(Hour)",
    "rollup_spans_1h": "toDate(Hour)",
    "rollup_reliability_1h": "toDate(Hour)",
    "rollup_context_1h": "toDate(Hour)",
    "rollup_context_6h": "toDate(Hour)",
    "rollup_context_1d": "toDate(Hour)",
    "rollup_context_all_1d": "toDate(Hour)",
    "rollup_arrivals_1m": "toDate(Minute)",
    "rollup_arrivals_1d": "toDate(Day)",
    "rollup_workload_1h": "toDate(Hour)",
    "rollup_workload_1d": "toDate(Hour)",
    "prefix_keys_1d": "toDate(Day)",
    "rollup_quality_15m": "toDate(Bucket)",
}

_TTL = re.compile(r" TTL (.+?)(?: SETTINGS |$)")


def ttl_expression(table: str, days: int) -> str:
    """The TTL `table` gets for `days` of retention, as the server prints it."""
    return f"{TTL_COLUMNS[table]} + toIntervalDay({days + 1})"


def apply_retention(client: Any, days: int, cluster: str | None = None) -> list[str]:
    """Set the day-aligned TTL on every table; returns the tables changed. On a cluster
    the rows live in the x_local tables (the plain names are Distributed tables, which
    hold none and take no TTL): the TTL goes there, on every node."""
    engines = dict(client.query(
        "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()").result_rows)
    changed = []
    for table in TTL_COLUMNS:
        stored = f"{table}_local" if cluster else table
        if stored not in engines:
            continue
        expression = ttl_expression(table, days)
        current = _TTL.search(engines[stored])
        if current and current.group(1) == expression:
            continue
        on = f" ON CLUSTER {cluster}" if cluster else ""
        client.command(f"ALTER TABLE {stored}{on} MODIFY TTL {expression}",
                       settings={"materialize_ttl_after_modify": 0})
        changed.append(stored)
    return changed
