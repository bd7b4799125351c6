"""Hand-built OTLP requests for tests that need exact control over the wire."""

from __future__ import annotations

import os
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def llm_request(n_spans: int, service: str = "svc", model: str = "gpt-4o-mini", tenant: str = "acme",
                start_ns: int | None = None) -> ExportTraceServiceRequest:
    """One request with `n_spans` chat spans (distinct random ids), 100 in / 10 out tokens each."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.append(kv("service.name", service))
    spans = rs.scope_spans.add()
    spans.scope.name = "tests"
    start = start_ns or time.time_ns() - 1_000_000_000
    for i in range(n_spans):
        span = spans.spans.add()
        span.trace_id = os.urandom(16)
        span.span_id = os.urandom(8)
        span.name = f"chat {model}"
        span.kind = Span.SPAN_KIND_CLIENT
        span.start_time_unix_nano = start + i * 1000
        span.end_time_unix_nano = start + i * 1000 + 500_000_000
        span.attributes.extend([
            kv("gen_ai.operation.name", "chat"), kv("gen_ai.request.model", model),
            kv("gen_ai.usage.input_tokens", 100), kv("gen_ai.usage.output_tokens", 10), kv("app.tenant", tenant),
        ])
    return request
