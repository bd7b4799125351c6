"""ExportLogsServiceRequest -> otel_logs rows, pure, spelled as the exporter writes them."""

from __future__ import annotations

from typing import Any

from servelens.collector.mapping.attributes import MAX_TIME_NS, UNBOUNDED, TimeWindow, to_map, to_string
from servelens.collector.mapping.spans import Batch

LOG_COLUMNS = (
    "Timestamp", "TraceId", "SpanId", "TraceFlags", "SeverityText", "SeverityNumber",
    "ServiceName", "Body", "ResourceSchemaUrl", "ResourceAttributes", "ScopeSchemaUrl",
    "ScopeName", "ScopeVersion", "ScopeAttributes", "LogAttributes", "EventName",
)


def logs_to_rows(request: Any, window: TimeWindow = UNBOUNDED) -> Batch:
    """Map every record; one whose time is outside `window` is rejected (partial success)."""
    batch = Batch("otel_logs", LOG_COLUMNS, [[] for _ in LOG_COLUMNS])
    for resource_logs in request.resource_logs:
        resource = to_map(resource_logs.resource.attributes)
        service = resource.get("service.name", "")
        for scope_logs in resource_logs.scope_logs:
            scope = scope_logs.scope
            scope_attrs = to_map(scope.attributes)
            for record in scope_logs.log_records:
                if max(record.time_unix_nano, record.observed_time_unix_nano) > MAX_TIME_NS:
                    batch.rejected += 1
                    if len(batch.errors) < 5:
                        batch.errors.append("log record: timestamp beyond 2262 (not storable)")
                    continue
                problem = window.problem(record.time_unix_nano or record.observed_time_unix_nano, "log record time")
                if problem:
                    batch.rejected += 1
                    if len(batch.errors) < 5:
                        batch.errors.append(problem)
                    continue
                if len(record.trace_id) not in (0, 16) or len(record.span_id) not in (0, 8):
                    batch.rejected += 1
                    if len(batch.errors) < 5:
                        batch.errors.append("log record: trace_id/span_id has an invalid length")
                    continue
                row = [
                    record.time_unix_nano or record.observed_time_unix_nano,
                    record.trace_id.hex(), record.span_id.hex(), record.flags & 0xFF,
                    record.severity_text, record.severity_number & 0xFF, service,
                    to_string(record.body), resource_logs.schema_url, resource,
                    scope_logs.schema_url, scope.name, scope.version, scope_attrs,
                    to_map(record.attributes), record.event_name,
                ]
                for column, value in zip(batch.data, row, strict=True):
                    column.append(value)
    return batch
