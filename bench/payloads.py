"""Realistic OTLP/protobuf trace payloads for the ingest benchmark.

Each request carries one resource (an SDK-instrumented LLM gateway) and `spans` GenAI
client spans with the dozen attributes real instrumentations set (current GenAI semconv
plus the business-unit keys servelens groups by). Values are drawn from a seeded RNG so a
run is reproducible, and every span gets its own ids: payloads that repeat ids or values
would flatter both the parser (no) and the store's compression (yes, a lot).
"""

from __future__ import annotations

import random
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

# (request model, response model, provider, server.address, share)
_MODELS = [
    ("gpt-4o-mini", "gpt-4o-mini-2024-07-18", "openai", "api.openai.com", 55),
    ("gpt-4o", "gpt-4o-2024-08-06", "openai", "api.openai.com", 30),
    ("claude-sonnet-4", "claude-sonnet-4-20250514", "anthropic", "api.anthropic.com", 15),
]
_TENANTS = ["acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka", "tyrell", "cyberdyne"]
_TENANT_WEIGHTS = [30, 18, 12, 10, 8, 7, 6, 4, 3, 2]
_FEATURES = [("assistant", "core-ai"), ("code-review", "devtools"), ("email-draft", "growth"),
             ("kb-search", "knowledge"), ("ticket-triage", "support")]

ATTRIBUTES_PER_SPAN = 12


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def build_request(rng: random.Random, spans: int, now_ns: int) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend([
        _kv("service.name", "chat-gateway"), _kv("service.version", "1.14.2"),
        _kv("deployment.environment.name", "prod"), _kv("cloud.region", "us-east-1"),
        _kv("telemetry.sdk.language", "python"), _kv("telemetry.sdk.name", "opentelemetry"),
        _kv("telemetry.sdk.version", "1.27.0"),
    ])
    ss = rs.scope_spans.add()
    ss.scope.name = "opentelemetry.instrumentation.openai_v2"
    ss.scope.version = "2.0b0"
    models = [m[:4] for m in _MODELS]
    model_weights = [m[4] for m in _MODELS]
    for _ in range(spans):
        model, response_model, provider, server = rng.choices(models, model_weights)[0]
        feature, team = rng.choice(_FEATURES)
        input_tokens = int(min(60000, rng.lognormvariate(6.8, 1.0)))
        output_tokens = int(min(4096, rng.lognormvariate(5.4, 0.8)))
        cached = input_tokens * rng.randint(3, 9) // 10 // 128 * 128 if input_tokens >= 1024 and rng.random() < 0.35 else 0
        ttft = round(rng.lognormvariate(-1.0, 0.35), 6)
        duration_ns = int((ttft + output_tokens * rng.uniform(0.008, 0.03)) * 1e9)
        # Spread over the last ten minutes: one day partition, as live traffic would be.
        start = now_ns - rng.randrange(600 * 10**9)
        span = ss.spans.add()
        span.trace_id = rng.randbytes(16)
        span.span_id = rng.randbytes(8)
        span.parent_span_id = rng.randbytes(8)
        span.name = f"chat {model}"
        span.kind = Span.SPAN_KIND_CLIENT
        span.start_time_unix_nano = start
        span.end_time_unix_nano = start + duration_ns
        if rng.random() < 0.02:
            span.status.code = Status.STATUS_CODE_ERROR
            span.status.message = "rate limit exceeded"
        span.attributes.extend([
            _kv("gen_ai.operation.name", "chat"),
            _kv("gen_ai.provider.name", provider),
            _kv("gen_ai.request.model", model),
            _kv("gen_ai.response.model", response_model),
            _kv("gen_ai.usage.input_tokens", input_tokens),
            _kv("gen_ai.usage.output_tokens", output_tokens),
            _kv("gen_ai.usage.cache_read.input_tokens", cached),
            _kv("gen_ai.response.time_to_first_chunk", ttft),
            _kv("app.tenant", rng.choices(_TENANTS, _TENANT_WEIGHTS)[0]),
            _kv("app.feature", feature),
            _kv("app.team", team),
            _kv("server.address", server),
        ])
    return request


def build_payloads(count: int, spans: int, seed: int = 7) -> list[bytes]:
    """`count` serialized ExportTraceServiceRequests of `spans` spans each."""
    rng = random.Random(seed)
    now_ns = time.time_ns()
    return [build_request(rng, spans, now_ns).SerializeToString() for _ in range(count)]
