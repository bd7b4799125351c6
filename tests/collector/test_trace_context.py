"""A request read in the company of its trace's spans (migration 0045): the business units
its own span lacks from the other spans of its trace, and one call traced as an outer and
an inner span counted once. Spans from the real OTel SDK (batched, as apps run it) through
the real receiver, both span mappings, into the real store; the Python reading
(dialects.requests) must give the view's rows.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from servelens.analytics.reports import traces_search
from servelens.collector.mapping import dialects
from servelens.collector.service import Collector
from servelens.core.migrate import migrate
from servelens.core.store import Store
from tests.collector.captures import replay, span_views

pytestmark = pytest.mark.integration

CONTEXT = {"ai.settings.context.tenant": "acme", "ai.settings.context.userId": "u-42",
           "ai.settings.context.sessionId": "s-1", "ai.settings.context.feature": "search"}


@pytest.fixture(params=["python", "engine"])
def sent(request, make_settings, tmp_path) -> Iterator[tuple[Store, Collector, str]]:
    settings = make_settings(collector={"trace_mapping": request.param}, data_dir=str(tmp_path / "data"))
    store = Store(settings.store_url, settings.store.database)
    migrate(store.client())
    collector = Collector(settings, store)
    collector.start()
    yield store, collector, f"http://127.0.0.1:{collector.http.port}/v1/traces"
    collector.shutdown()


def _export(endpoint: str, build, resource: dict[str, str] | None = None) -> None:
    """The spans `build(tracer)` makes, exported as a batch when the provider shuts down."""
    provider = TracerProvider(resource=Resource.create({"service.name": "ctx-app", **(resource or {})}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    build(provider.get_tracer("gen_ai"))
    provider.shutdown()


def _call(tracer, name: str, model: str, tokens: int | None, **extra: str) -> None:
    attributes = {"gen_ai.operation.name": name, "gen_ai.request.model": model, **extra}
    if tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = tokens
    with tracer.start_as_current_span(f"{name} {model}", kind=SpanKind.CLIENT, attributes=attributes):
        pass


def _rows(store: Store) -> list[dict]:
    names = ["SpanId", "Operation", "Model", "InputTokens", "Tenant", "Feature", "UserId", "SessionId", "Team"]
    rows = store.client().query(f"SELECT {', '.join(names)} FROM llm_requests ORDER BY InputTokens").result_rows
    return [dict(zip(names, row)) for row in rows]


def _python_agrees(store: Store) -> None:
    python = dialects.requests(span_views(store))
    rows = {r["SpanId"]: r for r in _rows(store)}
    assert set(python) == set(rows)
    for sid, fields in python.items():
        assert (fields["tenant"], fields["feature"], fields["user"], fields["session"], fields["team"]) == (
            rows[sid]["Tenant"], rows[sid]["Feature"], rows[sid]["UserId"], rows[sid]["SessionId"], rows[sid]["Team"])


def test_a_model_call_takes_its_agents_context_and_its_resource_comes_after(sent) -> None:
    store, collector, endpoint = sent

    def build(tracer):
        # AI SDK 7's shape: invoke_agent > step > chat, the context on the first two only
        with tracer.start_as_current_span("invoke_agent m", attributes={"gen_ai.operation.name": "invoke_agent",
                                                                        **CONTEXT}):
            with tracer.start_as_current_span("step 1", attributes={"gen_ai.operation.name": "agent_step", **CONTEXT}):
                _call(tracer, "chat", "m", 11)
        # a trace whose spans name two tenants: none is the trace's, the resource's stands
        with tracer.start_as_current_span("fan-out", attributes={"app.tenant": "globex"}):
            with tracer.start_as_current_span("other", attributes={"app.tenant": "initech"}):
                _call(tracer, "chat", "m", 22)
        # a call that carries a unit of its own reads its own span and resource only
        with tracer.start_as_current_span("job", attributes=CONTEXT):
            _call(tracer, "chat", "m", 33, **{"app.tenant": "umbrella"})

    _export(endpoint, build, resource={"app.team": "platform", "app.tenant": "resource-tenant"})
    assert collector.writer.force_flush(30)
    rows = _rows(store)
    assert [(r["InputTokens"], r["Tenant"], r["Feature"], r["UserId"], r["SessionId"], r["Team"]) for r in rows] == [
        (11, "acme", "search", "u-42", "s-1", "platform"),
        (22, "resource-tenant", "", "", "", "platform"),
        (33, "umbrella", "", "", "", "platform"),
    ]
    _python_agrees(store)


def test_one_call_traced_twice_is_one_request(sent) -> None:
    store, collector, endpoint = sent

    def build(tracer):
        # AI SDK 7's embed: an `embeddings` operation span around the provider call's
        with tracer.start_as_current_span("embeddings e", kind=SpanKind.CLIENT,
                                          attributes={"gen_ai.operation.name": "embeddings",
                                                      "gen_ai.request.model": "e", **CONTEXT}):
            _call(tracer, "embeddings", "e", 29, **CONTEXT)
        # a call that makes another model's call is two requests
        with tracer.start_as_current_span("chat router", kind=SpanKind.CLIENT,
                                          attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "router",
                                                      "gen_ai.usage.input_tokens": 5}):
            _call(tracer, "chat", "m", 40)

    _export(endpoint, build)
    assert collector.writer.force_flush(30)
    assert [(r["Operation"], r["Model"], r["InputTokens"], r["Tenant"]) for r in _rows(store)] == [
        ("chat", "router", 5, ""), ("embeddings", "e", 29, "acme"), ("chat", "m", 40, "")]
    _python_agrees(store)


def test_another_services_spans_of_the_trace_change_nothing(sent) -> None:
    """An app's call through a gateway that traces it too: two services' spans of one trace,
    exported by two processes, which may land in one insert or two. Each service's request
    is read with its own service's spans only, so the rows are the same either way."""
    store, collector, endpoint = sent
    app = TracerProvider(resource=Resource.create({"service.name": "app"}))
    gateway = TracerProvider(resource=Resource.create({"service.name": "gateway"}))
    for provider in (app, gateway):
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    call = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}
    with app.get_tracer("app").start_as_current_span("handle", attributes={"app.tenant": "acme"}):
        with app.get_tracer("app").start_as_current_span("chat m", kind=SpanKind.CLIENT,
                                                         attributes={**call, "gen_ai.usage.input_tokens": 7}):
            with gateway.get_tracer("gw").start_as_current_span("chat m", kind=SpanKind.SERVER,
                                                                attributes={**call, "gen_ai.usage.input_tokens": 8}):
                pass
    gateway.shutdown()
    app.shutdown()
    assert collector.writer.force_flush(30)
    assert [(r["InputTokens"], r["Tenant"]) for r in _rows(store)] == [(7, "acme"), (8, "")]
    _python_agrees(store)
    # the same spans again, both services' in one insert: the same two rows again
    store.client().command("INSERT INTO otel_traces SELECT * FROM otel_traces")
    assert [(r["InputTokens"], r["Tenant"]) for r in _rows(store)] == [(7, "acme"), (7, "acme"), (8, ""), (8, "")]


def test_the_view_reads_the_insert_not_the_table(store) -> None:
    """Only the spans inserted together count: a parent inserted after its child changes
    nothing already written (the view reads its block; a table-wide read would also be
    a scan of every stored span on each insert)."""
    client = store.client()
    columns = ["Timestamp", "TraceId", "SpanId", "ParentSpanId", "SpanName", "SpanKind", "ServiceName", "SpanAttributes"]
    call = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}
    now = datetime.now(timezone.utc)
    client.insert("otel_traces", [[now, "t1", "child", "outer", "x", "SPAN_KIND_CLIENT", "svc", call]],
                  column_names=columns)
    client.insert("otel_traces", [[now, "t1", "outer", "", "x", "SPAN_KIND_CLIENT", "svc", {**call, "app.tenant": "acme"}]],
                  column_names=columns)
    assert client.query("SELECT SpanId, Tenant FROM llm_requests ORDER BY SpanId").result_rows == [
        ("child", ""), ("outer", "acme")]


def _shapes(store, settings) -> list[tuple]:
    """Each stored trace as the Traces page shows it (GET /api/v1/traces/<id>): per span its
    role, its depth and the tenant of the request it is, if it is one."""
    shapes = []
    for (trace_id,) in store.client().query("SELECT DISTINCT TraceId FROM otel_traces").result_rows:
        spans = traces_search.get_trace(store, settings, trace_id)["spans"]
        shapes.append(tuple((s["role"], s["depth"], (s["request"] or {}).get("tenant")) for s in spans))
    return shapes


def test_an_ai_sdk_7_trace_reads_as_agent_steps_around_one_priced_call(collector, otlp_http, store, settings) -> None:
    """The Vercel AI SDK 7 capture through the real receiver, each trace as the Traces page
    shows it (GET /api/v1/traces/<id>): the agent and its step around one LLM call that
    carries the agent's tenant; an embedding is its operation span around one call."""
    replay("vercel_ai_v7", otlp_http)
    assert collector.writer.force_flush(30)
    shapes = _shapes(store, settings)
    chat = (("agent", 0, None), ("agent", 1, None), ("llm", 2, "acme"))
    assert sorted(shapes) == sorted([chat] * 4 + [(("agent", 0, None), ("agent", 1, None), ("llm", 2, "globex")),
                                                  (("embedding", 0, None), ("llm", 1, "acme"))])


def test_a_strands_trace_reads_as_an_agent_loop_around_its_calls(collector, otlp_http, store, settings) -> None:
    """The Strands Agents capture: each run is the agent, one turn of its loop and the model
    call under it (the turn is no request), a call Strands retried after 429s one request per
    attempt; the calls' TTFT, which Strands sends in milliseconds, in seconds."""
    replay("strands", otlp_http)
    assert collector.writer.force_flush(30)
    shapes = _shapes(store, settings)
    loop = (("agent", 0, None), ("agent", 1, None))
    assert sorted(shapes) == sorted([loop + (("llm", 2, "acme"),)] * 3 + [loop + (("llm", 2, "acme"),) * 6]
                                    + [loop + (("llm", 2, "globex"),)])
    ttfts = [t for (t,) in store.client().query(
        "SELECT TtftSeconds FROM llm_requests WHERE NOT IsError ORDER BY Timestamp").result_rows]
    assert len(ttfts) == 3 and all(0.1 < t < 2 for t in ttfts), ttfts
