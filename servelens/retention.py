"""store.retention_days as table TTLs: whole day-partitions drop once they are older.

Applied after migrations, only where the TTL in force differs, with
materialize_ttl_after_modify=0 so a change never rewrites existing parts in one go.
"""

from __future__ import annotations

from typing import Any

# table -> its time column (the partition key's source)
TTL_COLUMNS = {
    "otel_traces": "toDateTime(Timestamp)",
    "otel_traces_trace_id_ts": "Start",
    "otel_metrics_gauge": "toDateTime(TimeUnix)",
    "otel_metrics_sum": "toDateTime(TimeUnix)",
    "otel_metrics_histogram": "toDateTime(TimeUnix)",
    "otel_logs": "TimestampTime",
    "llm_requests": "toDateTime(Timestamp)",
    "trace_outcomes": "toDateTime(Timestamp)",
    "gpu_samples": "toDateTime(Timestamp)",
    "gpu_util_minutes": "Minute",
    "engine_samples": "toDateTime(Timestamp)",
    "stage_spans": "toDateTime(Timestamp)",
    "evaluations": "toDateTime(Timestamp)",
}


def apply_retention(client: Any, days: int) -> list[str]:
    """Set TTL <time> + days on every table; returns the tables changed."""
    engines = dict(client.query(
        "SELECT name, engine_full FROM system.tables WHERE database = currentDatabase()").result_rows)
    changed = []
    for table, column in TTL_COLUMNS.items():
        if table not in engines or f"toIntervalDay({days})" in engines[table]:
            continue
        client.command(f"ALTER TABLE {table} MODIFY TTL {column} + toIntervalDay({days})",
                       settings={"materialize_ttl_after_modify": 0})
        changed.append(table)
    return changed
