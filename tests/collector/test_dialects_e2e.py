"""End to end: the real OpenTelemetry SDK + OTLP/HTTP exporter -> collector -> chDB ->
the llm_requests materialized view, one case per attribute dialect of SPEC 3.

Spans go through SimpleSpanProcessor (exported synchronously; the receiver answers once
the rows are committed) with explicit start/end times, so every typed field is exact.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from servelens.analytics.reports import registry as reports
from servelens.demo.traffic import DEMO_CONFIG, LLAMA, SERVICES, DemoTraffic

pytestmark = pytest.mark.integration

T0 = time.time_ns() - 600 * 10**9  # ten minutes ago: inside every report's default window
MS = 10**6
S = 10**9
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


class Sender:
    """One instrumented service: its own provider/resource, synchronous OTLP/HTTP export."""

    def __init__(self, endpoint: str, service: str = "chat-api", **resource: str) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": service, **resource}))
        self.provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
        self.tracer = self.provider.get_tracer("test.dialects", "1.0")

    def start(self, name: str, attrs: dict[str, Any], *, kind: SpanKind = SpanKind.CLIENT,
              start: int = T0, parent: trace.Span | None = None) -> trace.Span:
        context = trace.set_span_in_context(parent) if parent else Context()
        return self.tracer.start_span(name, context=context, kind=kind, attributes=attrs, start_time=start)

    def send(self, name: str, attrs: dict[str, Any], *, kind: SpanKind = SpanKind.CLIENT,
             start: int = T0, duration: int = 1500 * MS, status: Status | None = None) -> str:
        """Export one finished span; returns its span id as lowercase hex."""
        span = self.start(name, attrs, kind=kind, start=start)
        if status:
            span.set_status(status)
        span.end(end_time=start + duration)
        return trace.format_span_id(span.get_span_context().span_id)

    def close(self) -> None:
        self.provider.shutdown()


def llm_row(store, span_id: str) -> dict[str, Any]:
    rows = list(store.client().query(
        "SELECT * EXCEPT (Timestamp), toUnixTimestamp64Nano(Timestamp) AS ts_ns FROM llm_requests "
        "WHERE SpanId = {id:String}", parameters={"id": span_id}).named_results())
    assert len(rows) == 1, f"expected one llm_requests row for span {span_id}, got {len(rows)}"
    return rows[0]


def count(store, table: str, span_id: str) -> int:
    return store.client().command(f"SELECT count() FROM {table} WHERE SpanId = {{id:String}}",
                                  parameters={"id": span_id})


@pytest.fixture
def sender(otlp_http: str):
    senders: list[Sender] = []

    def make(service: str = "chat-api", **resource: str) -> Sender:
        senders.append(Sender(otlp_http, service, **resource))
        return senders[-1]

    yield make
    for s in senders:
        s.close()


@dataclass
class Case:
    attrs: dict[str, Any]
    expect: dict[str, Any]
    name: str = "chat gpt-4o"
    kind: SpanKind = SpanKind.CLIENT
    duration: int = 1500 * MS
    status: Status | None = None
    service: str = "chat-api"
    resource: dict[str, str] = field(default_factory=dict)


CURRENT = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o"}
VLLM = {
    "gen_ai.request.model": LLAMA, "gen_ai.response.model": LLAMA,
    "gen_ai.usage.prompt_tokens": 2048, "gen_ai.usage.completion_tokens": 200, "gen_ai.usage.cached_tokens": 1024,
    "gen_ai.latency.time_to_first_token": 0.3125, "gen_ai.latency.e2e": 4.0625,
    "gen_ai.latency.time_in_queue": 0.0625, "gen_ai.latency.time_in_model_prefill": 0.25,
    "gen_ai.latency.time_in_model_decode": 3.75, "gen_ai.request.id": "cmpl-1",
    "app.deployment": "llama-70b-prod",
}
NO_STAGES = {"QueueSeconds": None, "PrefillSeconds": None, "DecodeSeconds": None}

CASES = {
    # Current GenAI semconv, business units and slices, TTFT as time_to_first_chunk.
    "current-semconv": Case(
        {**CURRENT, "gen_ai.response.model": "gpt-4o-2024-08-06", "gen_ai.usage.input_tokens": 1200,
         "gen_ai.usage.output_tokens": 345, "gen_ai.usage.cache_read.input_tokens": 1024,
         "gen_ai.response.time_to_first_chunk": 0.25, "app.tenant": "acme", "app.feature": "assistant",
         "app.team": "core-ai", "user.id": "u-7", "app.task_type": "qa", "app.language": "de",
         "app.mode": "batch", "app.prefix_hash": "p1", "app.outcome": "completed"},
        {"Model": "gpt-4o-2024-08-06", "Provider": "openai", "Operation": "chat", "InputTokens": 1200,
         "OutputTokens": 345, "CachedInputTokens": 1024, "TtftSeconds": 0.25, **NO_STAGES,
         "LatencySeconds": 1.5, "IsError": False, "ErrorType": "", "RetryAttempt": 0, "Fallback": False,
         "Deployment": "chat-api", "ServiceName": "chat-api", "Region": "us-east-1", "Tenant": "acme",
         "Feature": "assistant", "Team": "core-ai", "UserId": "u-7", "TaskType": "qa", "Language": "de",
         "Mode": "batch", "PrefixHash": "p1", "Outcome": "completed", "HttpStatusCode": 0},
        resource={"cloud.region": "us-east-1"}),
    # Deprecated names: prompt/completion tokens, gen_ai.system; no operation name, request model only.
    "deprecated-names": Case(
        {"gen_ai.system": "anthropic", "gen_ai.request.model": "claude-sonnet-4",
         "gen_ai.usage.prompt_tokens": 800, "gen_ai.usage.completion_tokens": 90, "enduser.id": "e-1"},
        {"Model": "claude-sonnet-4", "Provider": "anthropic", "Operation": "", "InputTokens": 800,
         "OutputTokens": 90, "CachedInputTokens": 0, "TtftSeconds": None, "LatencySeconds": 1.5,
         "UserId": "e-1", "Mode": "interactive", "Tenant": "", "Region": ""}),
    # vLLM's own span: the duration is the latency (not e2e); stages and TTFT from gen_ai.latency.*.
    "vllm": Case(
        VLLM,
        {"Model": LLAMA, "Provider": "", "InputTokens": 2048, "OutputTokens": 200,
         "CachedInputTokens": 1024, "TtftSeconds": 0.3125, "QueueSeconds": 0.0625, "PrefillSeconds": 0.25,
         "DecodeSeconds": 3.75, "LatencySeconds": 4.0701, "Deployment": "llama-70b-prod",
         "ServiceName": "vllm-llama-70b", "IsError": False},
        name="llm_request", kind=SpanKind.SERVER, duration=4_070_100_000, service="vllm-llama-70b"),
    # A zero-length span has no duration to read: total latency falls back to gen_ai.latency.e2e.
    "vllm-e2e-fallback": Case(
        {"gen_ai.latency.e2e": 2.5, "gen_ai.usage.prompt_tokens": 10},
        {"LatencySeconds": 2.5, "InputTokens": 10, "Model": "", "Deployment": "vllm-llama-70b"},
        name="llm_request", kind=SpanKind.SERVER, duration=0, service="vllm-llama-70b"),
    # gen_ai.latency.e2e alone is enough to make a span an LLM request.
    "vllm-e2e-only": Case(
        {"gen_ai.latency.e2e": 0.75}, {"LatencySeconds": 0.5, "InputTokens": 0, "Model": ""},
        name="llm_request", kind=SpanKind.SERVER, duration=500 * MS),
    # OpenLLMetry legacy: llm.request.type, llm.*.model, cache_read_input_tokens, app.retry.attempt.
    "openllmetry": Case(
        {"llm.request.type": "chat", "llm.request.model": "gpt-4o-mini", "llm.response.model": "gpt-4o-mini-2024-07-18",
         "gen_ai.system": "openai", "gen_ai.usage.prompt_tokens": 700, "gen_ai.usage.completion_tokens": 50,
         "gen_ai.usage.cache_read_input_tokens": 256, "app.retry.attempt": 2, "tenant.id": "globex"},
        {"Model": "gpt-4o-mini-2024-07-18", "Operation": "chat", "Provider": "openai", "InputTokens": 700,
         "OutputTokens": 50, "CachedInputTokens": 256, "RetryAttempt": 2, "Tenant": "globex"},
        name="openai.chat"),
    # OpenLLMetry's legacy operation names are read as the GenAI semconv's (completion -> text_completion).
    "openllmetry-request-model-only": Case(
        {"llm.request.type": "completion", "llm.request.model": "gpt-3.5-turbo-instruct"},
        {"Model": "gpt-3.5-turbo-instruct", "Operation": "text_completion"}, name="openai.completion"),
    # Retry under the current spelling; a 429 with error.type only (status unset) is an error.
    "retry-resend-count-429": Case(
        {**CURRENT, "http.request.resend_count": 1, "error.type": "429", "http.response.status_code": 429},
        {"RetryAttempt": 1, "IsError": True, "ErrorType": "429", "HttpStatusCode": 429}, duration=80 * MS),
    "error-by-status": Case(
        {**CURRENT, "gen_ai.usage.input_tokens": 5}, {"IsError": True, "ErrorType": "", "InputTokens": 5},
        status=Status(StatusCode.ERROR, "upstream failed")),
    "ok-status-not-error": Case({**CURRENT}, {"IsError": False}, status=Status(StatusCode.OK)),
    "fallback": Case({**CURRENT, "app.fallback": True}, {"Fallback": True}),
    # Tenant: span app.tenant > span tenant.id > resource app.tenant > resource tenant.id.
    "tenant-span-precedence": Case(
        {**CURRENT, "app.tenant": "acme", "tenant.id": "other"}, {"Tenant": "acme"},
        resource={"app.tenant": "res-tenant"}),
    "tenant-span-over-resource": Case(
        {**CURRENT, "tenant.id": "globex"}, {"Tenant": "globex"}, resource={"app.tenant": "res-tenant"}),
    "tenant-resource-app": Case(
        {**CURRENT}, {"Tenant": "initech", "Feature": "search", "Team": "kb"},
        resource={"app.tenant": "initech", "tenant.id": "other", "app.feature": "search", "app.team": "kb"}),
    "tenant-resource-id": Case({**CURRENT}, {"Tenant": "hooli"}, resource={"tenant.id": "hooli"}),
    # Every current name wins over every older spelling when both are present.
    "current-wins": Case(
        {**CURRENT, "gen_ai.system": "azure.ai.openai", "gen_ai.response.model": "gpt-4o-2024-11-20",
         "llm.request.type": "completion", "llm.request.model": "x-req", "llm.response.model": "x-resp",
         "gen_ai.usage.input_tokens": 100, "gen_ai.usage.prompt_tokens": 999,
         "gen_ai.usage.output_tokens": 20, "gen_ai.usage.completion_tokens": 888,
         "gen_ai.usage.cache_read.input_tokens": 64, "gen_ai.usage.cache_read_input_tokens": 777,
         "gen_ai.usage.cached_tokens": 666, "gen_ai.latency.time_to_first_token": 0.125,
         "gen_ai.response.time_to_first_chunk": 0.5, "http.request.resend_count": 3, "app.retry.attempt": 1},
        {"Model": "gpt-4o-2024-11-20", "Provider": "openai", "Operation": "chat", "InputTokens": 100,
         "OutputTokens": 20, "CachedInputTokens": 64, "TtftSeconds": 0.125, "RetryAttempt": 3}),
    "request-model-over-llm-response-model": Case(
        {"gen_ai.request.model": "gpt-4o", "llm.response.model": "x-resp"}, {"Model": "gpt-4o"}),
    "cache-read-input-tokens-over-cached-tokens": Case(
        {**CURRENT, "gen_ai.usage.cache_read_input_tokens": 512, "gen_ai.usage.cached_tokens": 128},
        {"CachedInputTokens": 512}),
    # Usage per modality (conventions in flight): kept beside the totals, which include them.
    "modality-breakdown": Case(
        {**CURRENT, "gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 1500,
         "gen_ai.usage.output_tokens": 300, "gen_ai.usage.text.input_tokens": 1000,
         "gen_ai.usage.audio.input_tokens": 400, "gen_ai.usage.image.input_tokens": 100,
         "gen_ai.usage.audio.output_tokens": 250, "gen_ai.usage.audio.cache_read.input_tokens": 64},
        {"InputTokens": 1500, "OutputTokens": 300,
         "ModalityTokens": {"text.input": 1000, "image.input": 100, "audio.input": 400, "audio.output": 250,
                            "audio.cache_read": 64}}),
    # Only the per-modality counts: the totals are their sums, never a silent zero.
    "modality-only": Case(
        {**CURRENT, "gen_ai.usage.text.input_tokens": 700, "gen_ai.usage.image.input_tokens": 85,
         "gen_ai.usage.text.output_tokens": 40, "gen_ai.usage.audio.output_tokens": 160},
        {"InputTokens": 785, "OutputTokens": 200,
         "ModalityTokens": {"text.input": 700, "text.output": 40, "image.input": 85, "audio.output": 160}}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_dialect_maps_to_typed_row(case: Case, sender, store) -> None:
    span_id = sender(case.service, **case.resource).send(
        case.name, case.attrs, kind=case.kind, duration=case.duration, status=case.status)
    row = llm_row(store, span_id)
    assert row["ts_ns"] == T0
    got = {k: row[k] for k in case.expect}
    assert got == case.expect
    # Latency is the span's own duration whenever it has one.
    if case.duration:
        assert row["LatencySeconds"] == case.duration / 1e9


def test_pipeline_steps_and_plain_spans_are_not_llm_requests(sender, store) -> None:
    rag = sender("rag-service")
    root = rag.start("POST /ask", {"app.tenant": "acme"}, kind=SpanKind.SERVER)
    steps = {}
    for name, attrs in {
        "retrieval kb-docs": {"gen_ai.operation.name": "retrieval", "gen_ai.data_source.id": "kb-docs"},
        # a model name on a tool step does not make it a request either
        "execute_tool search": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                                "gen_ai.request.model": "gpt-4o"},
    }.items():
        span = rag.start(name, attrs, kind=SpanKind.INTERNAL, start=T0 + 10 * MS, parent=root)
        span.end(end_time=T0 + 200 * MS)
        steps[name] = trace.format_span_id(span.get_span_context().span_id)
    llm = rag.start("chat gpt-4o", {**CURRENT, "gen_ai.usage.input_tokens": 10}, start=T0 + 200 * MS, parent=root)
    llm.end(end_time=T0 + 900 * MS)
    root.end(end_time=T0 + S)
    root_id = trace.format_span_id(root.get_span_context().span_id)
    llm_id = trace.format_span_id(llm.get_span_context().span_id)

    for span_id in [*steps.values(), root_id]:
        assert count(store, "otel_traces", span_id) == 1
        assert count(store, "llm_requests", span_id) == 0
    row = llm_row(store, llm_id)
    assert row["ParentSpanId"] == root_id
    assert row["TraceId"] == trace.format_trace_id(root.get_span_context().trace_id)


def test_otel_traces_row_is_exporter_spelled(sender, store) -> None:
    s = sender("chat-api", **{"cloud.region": "eu-west-1"})
    root = s.start("POST /v1/chat", {"http.route": "/v1/chat"}, kind=SpanKind.SERVER)
    child = s.start("chat gpt-4o", {**CURRENT, "gen_ai.usage.input_tokens": 3}, start=T0 + 1_234_567, parent=root)
    child.set_status(Status(StatusCode.ERROR, "boom"))
    child.end(end_time=T0 + 987_654_321)
    internal = s.start("postprocess", {"app.stage": "postprocess"}, kind=SpanKind.INTERNAL, start=T0 + 987_654_321,
                       parent=root)
    internal.set_status(Status(StatusCode.OK))
    internal.end(end_time=T0 + 999_000_001)
    root.end(end_time=T0 + S + 7)

    trace_id = trace.format_trace_id(root.get_span_context().trace_id)
    rows = {r["SpanName"]: r for r in store.client().query(
        "SELECT SpanName, TraceId, SpanId, ParentSpanId, SpanKind, StatusCode, StatusMessage, Duration, "
        "toUnixTimestamp64Nano(Timestamp) AS ts_ns, ServiceName, ResourceAttributes, SpanAttributes, ScopeName "
        "FROM otel_traces WHERE TraceId = {t:String}", parameters={"t": trace_id}).named_results()}
    assert set(rows) == {"POST /v1/chat", "chat gpt-4o", "postprocess"}
    expected = {  # name: (span, kind, status, start, duration)
        "POST /v1/chat": (root, "SPAN_KIND_SERVER", "STATUS_CODE_UNSET", T0, S + 7),
        "chat gpt-4o": (child, "SPAN_KIND_CLIENT", "STATUS_CODE_ERROR", T0 + 1_234_567, 987_654_321 - 1_234_567),
        "postprocess": (internal, "SPAN_KIND_INTERNAL", "STATUS_CODE_OK", T0 + 987_654_321, 11_345_680),
    }
    root_id = trace.format_span_id(root.get_span_context().span_id)
    for name, (span, kind, status, start, duration) in expected.items():
        row = rows[name]
        assert HEX32.match(row["TraceId"]) and row["TraceId"] == trace_id
        assert HEX16.match(row["SpanId"]) and row["SpanId"] == trace.format_span_id(span.get_span_context().span_id)
        assert row["ParentSpanId"] == ("" if span is root else root_id)
        assert (row["SpanKind"], row["StatusCode"]) == (kind, status)
        assert (row["ts_ns"], row["Duration"]) == (start, duration)
        assert row["ServiceName"] == "chat-api" and row["ResourceAttributes"]["cloud.region"] == "eu-west-1"
        assert row["ScopeName"] == "test.dialects"
    assert rows["chat gpt-4o"]["StatusMessage"] == "boom"
    # Attribute values are flattened to strings as the exporter writes them.
    assert rows["chat gpt-4o"]["SpanAttributes"]["gen_ai.usage.input_tokens"] == "3"
    assert llm_row(store, rows["chat gpt-4o"]["SpanId"])["LatencySeconds"] == (987_654_321 - 1_234_567) / 1e9


def _query(store, sql: str) -> list[tuple]:
    return store.client().query(sql).result_rows


def test_demo_traffic_fills_every_service_and_report(otlp_http: str, store, make_settings) -> None:
    demo = DemoTraffic(otlp_http, rate_per_s=40.0, seed=11)
    try:
        backfilled = demo.backfill(minutes=5)  # 40/s * 300 s capped at MAX_BACKFILL_TRACES
        demo.start()
        time.sleep(2.0)
    finally:
        demo.shutdown(10.0)
    assert backfilled > 1000 and demo.sent_traces > backfilled  # live traces went out too

    traces = dict(_query(store, "SELECT ServiceName, uniqExact(TraceId) FROM otel_traces GROUP BY ServiceName"))
    assert set(traces) == set(SERVICES)
    assert sum(traces.values()) == demo.sent_traces  # nothing dropped on the way
    requests = dict(_query(store, "SELECT ServiceName, count() FROM llm_requests GROUP BY ServiceName"))
    assert set(requests) == set(SERVICES) and min(requests.values()) > 20
    # History spreads over the backfilled window; live traces end by now.
    oldest, newest = _query(store, "SELECT min(Timestamp), max(Timestamp) FROM otel_traces")[0]
    assert (newest - oldest).total_seconds() > 240

    (tenants, deployments, errors, rate_limited, retries, fallbacks, cached, ttft, stages, batch) = _query(store, """
        SELECT uniqExact(Tenant), groupUniqArray(Deployment), countIf(IsError), countIf(HttpStatusCode = 429),
               countIf(RetryAttempt > 0), countIf(Fallback), countIf(CachedInputTokens > 0),
               countIf(TtftSeconds IS NOT NULL), countIf(QueueSeconds IS NOT NULL), countIf(Mode = 'batch')
        FROM llm_requests""")[0]
    assert tenants >= 8 and "llama-70b-prod" in deployments
    assert min(errors, rate_limited, retries, fallbacks, cached, ttft, stages, batch) > 0
    assert _query(store, "SELECT count() FROM llm_requests WHERE Tenant = ''")[0][0] == 0
    # Retrieval and tool stages are stored, but not counted as requests.
    steps = _query(store, "SELECT count() FROM otel_traces WHERE SpanAttributes['gen_ai.operation.name'] "
                          "IN ('retrieval', 'execute_tool')")[0][0]
    assert steps > 0
    assert _query(store, "SELECT count() FROM llm_requests WHERE Operation IN ('retrieval', 'execute_tool')")[0][0] == 0
    assert _query(store, "SELECT count() FROM trace_outcomes")[0][0] > 0

    settings = make_settings(**DEMO_CONFIG)  # same database, the demo's prices and deployment
    total = _query(store, "SELECT count() FROM llm_requests")[0][0]
    by_tenant = reports.run("cost", store, settings, {})["rows"]
    assert by_tenant and sum(r["requests"] for r in by_tenant) == total
    assert all(r["cost_usd"] > 0 for r in by_tenant)
    # Every API model the demo emits (dated response names included) is priced by DEMO_CONFIG.
    by_model = {r["model"]: r for r in reports.run("cost", store, settings, {"by": "model"})["rows"]}
    api_models = [m for m in by_model if m != LLAMA]
    assert {"gpt-4o-2024-08-06", "gpt-4o-mini-2024-07-18", "claude-sonnet-4-20250514"} <= set(api_models)
    for model in api_models:
        # (a request model seen only on failed calls, which carry no tokens, costs nothing)
        row = by_model[model]
        assert row["unpriced_requests"] == 0 and (row["cost_usd"] > 0 or row["input_tokens"] == 0), model

    latency = {r["model"]: r for r in reports.run("latency", store, settings, {})["rows"]}
    assert set(latency) == set(by_model)
    for model, row in latency.items():
        assert row["requests"] > 0 and 0 < row["latency_p50_ms"] <= row["latency_p99_ms"], model
    assert latency[LLAMA]["ttft_p50_ms"] > 0

    # Several dialects, each read whole: tokens, tenant, and TTFT from its own carrier.
    by_dialect = {d: (n, tokens, tenants, sources) for d, n, tokens, tenants, sources in _query(store, """
        SELECT Dialect, count(), countIf(InputTokens > 0), countIf(Tenant != ''), groupUniqArray(TtftSource)
        FROM llm_requests GROUP BY Dialect""")}
    assert {"semconv", "vllm", "openllmetry", "openinference", "langfuse"} <= set(by_dialect)
    for d in ("openinference", "langfuse"):
        n, tokens, tenants, sources = by_dialect[d]
        assert tokens > 0.8 * n and tenants == n, d
    assert "event:First Token Stream Event" in by_dialect["openinference"][3]
    assert "timestamp:langfuse.observation.completion_start_time" in by_dialect["langfuse"][3]
    # Online evaluations reach the Quality page, the Japanese slice below the rest.
    quality = {r["language"]: r for r in reports.run("quality", store, settings, {"by": "language"})["rows"]}
    assert quality and quality["ja"]["pass_rate"] < quality["en"]["pass_rate"]


def test_demo_traffic_is_deterministic_when_seeded(otlp_http: str, store) -> None:
    for _ in range(2):
        demo = DemoTraffic(otlp_http, rate_per_s=0.5, seed=3)
        try:
            assert demo.backfill(minutes=4) == 120
        finally:
            demo.shutdown(10.0)
    # Timestamps move with the clock (Langfuse's completion-start time is one); names,
    # durations and the other attributes repeat exactly.
    rows = _query(store, """
        SELECT ServiceName, SpanName, Duration, StatusCode,
               toString(mapFilter((k, v) -> k != 'langfuse.observation.completion_start_time', SpanAttributes)) AS a,
               count() AS n
        FROM otel_traces GROUP BY ServiceName, SpanName, Duration, StatusCode, a""")
    assert rows and all(r[-1] % 2 == 0 for r in rows)
    assert sum(r[-1] for r in rows) > 240
