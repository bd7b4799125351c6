"""ExportTraceServiceRequest -> otel_traces rows (column-oriented), pure and server-free.

Rows are spelled as the OpenTelemetry Collector's ClickHouse exporter writes them: ids
lowercase hex, `SPAN_KIND_*` and `STATUS_CODE_*` strings, Duration in nanoseconds,
attributes flattened to strings. A span with an invalid id is rejected on its own (the
request gets a partial success); the rest are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelens.collector.mapping.attributes import (MAX_TIME_NS, SPAN_ID_BYTES, TRACE_ID_BYTES, UNBOUNDED, TimeWindow,
                                                    to_map)

TRACE_COLUMNS = (
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind",
    "ServiceName", "ResourceAttributes", "ScopeName", "ScopeVersion", "SpanAttributes",
    "Duration", "StatusCode", "StatusMessage",
    "Events.Timestamp", "Events.Name", "Events.Attributes",
    "Links.TraceId", "Links.SpanId", "Links.TraceState", "Links.Attributes",
)

_SPAN_KINDS = ("SPAN_KIND_UNSPECIFIED", "SPAN_KIND_INTERNAL", "SPAN_KIND_SERVER",
               "SPAN_KIND_CLIENT", "SPAN_KIND_PRODUCER", "SPAN_KIND_CONSUMER")
_STATUS_CODES = ("STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR")

# The attribute a token's tenant is written to; any other tenant spelling is removed so
# the stamped tenant is the only one the mapping can read (one tenant cannot write as another).
TENANT_ATTRIBUTE = "app.tenant"


@dataclass
class Batch:
    """Column-oriented rows for one table, plus what was rejected and why."""

    table: str
    columns: tuple[str, ...]
    data: list[list[Any]]
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return block_rows(self.columns, self.data)


# A block of encoded export requests the engine maps itself (collector.engine_spans): the
# messages, and the spans each carries (a block's rows are its spans).
PROTOBUF_COLUMNS = ("@protobuf", "@spans")


def block_rows(columns: tuple[str, ...], data: list[list[Any]]) -> int:
    """Rows in a column-oriented block; for a protobuf block (collector.engine_spans), spans."""
    if not data or not data[0]:
        return 0
    return sum(data[1]) if columns == PROTOBUF_COLUMNS else len(data[0])


def _enum(names: tuple[str, ...], value: int) -> str:
    return names[value] if 0 <= value < len(names) else names[0]


def spans_to_rows(request: Any, tenant: str | None = None, tenant_keys: tuple[str, ...] = (),
                  window: TimeWindow = UNBOUNDED) -> Batch:
    """Map every span of `request`; `tenant` (from an auth token) overrides `tenant_keys`;
    a span starting outside `window` is rejected (partial success)."""
    cols: list[list[Any]] = [[] for _ in TRACE_COLUMNS]
    (ts, trace_id, span_id, parent, state, name, kind, service, res_attrs, scope_name,
     scope_version, span_attrs, duration, status, status_msg, ev_ts, ev_name, ev_attrs,
     ln_trace, ln_span, ln_state, ln_attrs) = cols
    batch = Batch("otel_traces", TRACE_COLUMNS, cols)
    for resource_spans in request.resource_spans:
        resource = to_map(resource_spans.resource.attributes)
        service_name = resource.get("service.name", "")
        if tenant is not None:
            resource = _stamp(resource, tenant, tenant_keys, set_key=False)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            for span in scope_spans.spans:
                problem = invalid_span(span, window)
                if problem:
                    batch.rejected += 1
                    if len(batch.errors) < 5:
                        batch.errors.append(problem)
                    continue
                attrs = to_map(span.attributes)
                if tenant is not None:
                    attrs = _stamp(attrs, tenant, tenant_keys, set_key=True)
                start, end = span.start_time_unix_nano, span.end_time_unix_nano
                ts.append(start)
                trace_id.append(span.trace_id.hex())
                span_id.append(span.span_id.hex())
                parent.append(span.parent_span_id.hex())
                state.append(span.trace_state)
                name.append(span.name)
                kind.append(_enum(_SPAN_KINDS, span.kind))
                service.append(service_name)
                res_attrs.append(resource)
                scope_name.append(scope.name)
                scope_version.append(scope.version)
                span_attrs.append(attrs)
                duration.append(end - start if end > start else 0)
                status.append(_enum(_STATUS_CODES, span.status.code))
                status_msg.append(span.status.message)
                ev_ts.append([e.time_unix_nano for e in span.events])
                ev_name.append([e.name for e in span.events])
                ev_attrs.append([to_map(e.attributes) for e in span.events])
                ln_trace.append([link.trace_id.hex() for link in span.links])
                ln_span.append([link.span_id.hex() for link in span.links])
                ln_state.append([link.trace_state for link in span.links])
                ln_attrs.append([to_map(link.attributes) for link in span.links])
    return batch


_ZERO_TRACE_ID, _ZERO_SPAN_ID = bytes(TRACE_ID_BYTES), bytes(SPAN_ID_BYTES)


def invalid_span(span: Any, window: TimeWindow = UNBOUNDED) -> str | None:
    """Why a span cannot be stored (ids OTLP does not allow, a start outside `window`, a
    time beyond 2262), or None.

    Runs on every span received, so the common case is a few C-level comparisons."""
    trace_id, span_id = span.trace_id, span.span_id
    if len(trace_id) != TRACE_ID_BYTES or trace_id == _ZERO_TRACE_ID:
        return f"span {span.name!r}: trace_id must be {TRACE_ID_BYTES} non-zero bytes, got {len(trace_id)}"
    if len(span_id) != SPAN_ID_BYTES or span_id == _ZERO_SPAN_ID:
        return f"span {span.name!r}: span_id must be {SPAN_ID_BYTES} non-zero bytes, got {len(span_id)}"
    if len(span.parent_span_id) not in (0, SPAN_ID_BYTES):
        return f"span {span.name!r}: parent_span_id must be empty or {SPAN_ID_BYTES} bytes"
    if span.links and any(len(link.trace_id) != TRACE_ID_BYTES or len(link.span_id) != SPAN_ID_BYTES
                          for link in span.links):
        return f"span {span.name!r}: a link has an invalid trace_id/span_id length"
    if (span.start_time_unix_nano > MAX_TIME_NS or span.end_time_unix_nano > MAX_TIME_NS
            or (span.events and max(e.time_unix_nano for e in span.events) > MAX_TIME_NS)):
        return f"span {span.name!r}: a timestamp is beyond 2262 (not storable in DateTime64(9))"
    problem = window.problem(span.start_time_unix_nano, "start time")
    return f"span {span.name!r}: {problem}" if problem else None


def _stamp(attrs: dict[str, str], tenant: str, tenant_keys: tuple[str, ...], set_key: bool) -> dict[str, str]:
    stamped = {k: v for k, v in attrs.items() if k not in tenant_keys and k != TENANT_ATTRIBUTE}
    if set_key:
        # app.tenant for the default mapping, and the first configured key for custom ones
        stamped[TENANT_ATTRIBUTE] = tenant
        if tenant_keys:
            stamped[tenant_keys[0]] = tenant
    return stamped
