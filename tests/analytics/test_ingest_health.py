"""Ingest health on real libraries' output: what was recognized, and why numbers are missing."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from servelens.analytics.reports import registry as reports
from tests.collector.captures import CAPTURES, replay

pytestmark = pytest.mark.integration
LIBRARIES = sorted(p.name for p in CAPTURES.iterdir() if (p / "manifest.json").is_file())


def test_ingest_health_names_what_is_missing_per_service_and_dialect(collector, otlp_http, store, settings) -> None:
    replay("litellm", otlp_http)  # streams carry no TTFT on its spans; nothing is priced here
    provider = TracerProvider(resource=Resource.create({"service.name": "in-house"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces")))
    with provider.get_tracer("in-house").start_as_current_span("call llm") as span:
        span.set_attribute("acme.model_id", "gpt-4o")  # an in-house dialect no table knows
        span.set_attribute("acme.usage.prompt_tokens", 12)
    provider.shutdown()
    assert collector.writer.force_flush(30)

    rows = {(r["service"], r["dialect"]): r for r in reports.run("ingest", store, settings, {})["rows"]}
    [litellm] = [r for (service, dialect), r in rows.items() if dialect == "litellm"]
    assert litellm["requests"] == 6 and litellm["spans_seen"] == 10  # its raw child spans are no requests
    assert litellm["streams_without_ttft"] == 1
    # the failed calls' models (fail-500, fail-429) are priced by no catalog
    assert {"fail-500", "fail-429"} <= set(litellm["unpriced_models"])
    [(unpriced,)] = store.client().query("SELECT count() FROM llm_requests WHERE has({m:Array(String)}, Model)",
                                         parameters={"m": litellm["unpriced_models"]}).result_rows
    assert litellm["unpriced_requests"] == unpriced
    in_house = rows[("in-house", None)]
    assert in_house["requests"] == 0 and in_house["spans_seen"] == 1 and in_house["unrecognized_spans"] == 2
    assert set(in_house["unrecognized_keys"]) == {"acme.model_id", "acme.usage.prompt_tokens"}
    assert all(len(t) == 32 for t in in_house["unrecognized_examples"])


def test_no_library_span_is_unrecognized(collector, otlp_http, store, settings) -> None:
    """Every span of the libraries' captures is read: a request, a step of one (an agent
    step, a retrieval) or the outer span of a call (Vercel AI SDK 6's and 7's, LiteLLM's raw
    provider request); only an unknown dialect's keys are flagged."""
    for library in LIBRARIES:
        replay(library, otlp_http)
    assert collector.writer.force_flush(30)
    rows = reports.run("ingest", store, settings, {})["rows"]
    assert len({r["service"] for r in rows}) == len(LIBRARIES)
    assert [(r["service"], r["unrecognized_keys"]) for r in rows if r["unrecognized_spans"]] == []


def test_unrecognized_keys_from_stored_hours_equal_the_spans(store, make_settings) -> None:
    """Over hours the analytics job has stored (analytics.span_hours, rollup_span_keys_1h)
    the unrecognized keys, their spans and examples are what reading every span gives.
    Spans written as an otelcol-contrib exporter writes them, over five past hours."""
    from servelens.analytics import span_hours
    from servelens.analytics.sources import span_keys, traces

    t0 = _exporter_spans(store)
    raw, stored = make_settings(analytics={"use_rollups": False}), make_settings()
    windows = [{"since": (t0 + timedelta(minutes=17)).isoformat(), "until": (t0 + timedelta(hours=4, minutes=13)).isoformat()},
               {"since": t0.isoformat(), "until": (t0 + timedelta(hours=5)).isoformat(), "service": "in-house"}]

    def keys(settings, params) -> dict:
        rows = reports.run("ingest", store, settings, params)["rows"]
        return {r["service"]: (r["unrecognized_spans"], sorted(zip(r["unrecognized_keys"] or [], r["unrecognized_examples"] or [])))
                for r in rows}

    before = [keys(raw, w) for w in windows]
    assert before[0]["in-house"][0] > 0 and before[0]["batch"][0] > 0 and before[0]["chat-api"][0] == 0
    assert {k for k, _ in before[0]["in-house"][1]} == {"acme.model_id", "acme.usage.prompt_tokens"}
    assert {k for k, _ in before[0]["batch"][1]} == {"Vendor.TokenCount"}  # any case
    assert span_hours.fill(store, stored, job=span_hours.SPAN_KEYS)["hours"] >= 5
    assert traces.hours_stored(store, span_keys.JOB) is not None
    after = [keys(stored, w) for w in windows]
    for b, a in zip(before, after):
        assert {s: v[0] for s, v in a.items()} == {s: v[0] for s, v in b.items()}
        for service, (_, found) in a.items():
            assert [k for k, _ in found] == [k for k, _ in b[service][1]]
            for key, trace_id in found:  # an example is a span of that service with the key
                assert store.client().query(
                    "SELECT count() FROM otel_traces WHERE TraceId = {t:String} AND ServiceName = {s:String} "
                    "AND mapContains(SpanAttributes, {k:String})", parameters={"t": trace_id, "s": service, "k": key}
                ).result_rows[0][0] == 1


def _exporter_spans(store: Any) -> datetime:
    """3,000 spans over five past hours, written as an otelcol-contrib exporter writes them
    (the views make the requests): LLM calls (some with no usage, some streamed without a
    TTFT, some with no model), an in-house dialect no table reads, and other spans.
    Returns the first hour."""
    t0 = (datetime.now(timezone.utc) - timedelta(hours=8)).replace(minute=0, second=0, microsecond=0)
    store.client().command(f"""
        INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                 SpanAttributes, Duration, StatusCode)
        SELECT fromUnixTimestamp64Nano(toInt64({int(t0.timestamp())} * 1e9 + (cityHash64(number) % 18000) * 1e9)),
               lower(hex(cityHash64(number, 1))), lower(hex(cityHash64(number, 2))), '', 'call',
               'SPAN_KIND_CLIENT', ['chat-api', 'in-house', 'batch'][1 + number % 3],
               multiIf(number % 3 = 0 AND number % 5 = 0, map('gen_ai.operation.name', 'chat',
                                                              'gen_ai.request.model', 'gpt-4o'),
                       number % 3 = 0 AND number % 5 = 1, map('gen_ai.operation.name', 'chat',
                                                              'gen_ai.usage.input_tokens', '10',
                                                              'gen_ai.usage.output_tokens', '5'),
                       number % 3 = 0 AND number % 5 = 2, map('gen_ai.operation.name', 'chat',
                                                              'gen_ai.request.model', 'gpt-4o',
                                                              'gen_ai.request.stream', 'true',
                                                              'gen_ai.usage.input_tokens', '10',
                                                              'gen_ai.usage.output_tokens', '5'),
                       number % 3 = 0, map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'gpt-4o',
                                          'gen_ai.usage.input_tokens', '10', 'gen_ai.usage.output_tokens', '5'),
                       number % 3 = 1, map('acme.model_id', 'gpt-4o', 'acme.usage.prompt_tokens', '12',
                                          'http.route', '/v1/chat'),
                       number % 7 = 2, map('Vendor.TokenCount', '3'),
                       map('db.system', 'redis')),
               1000000, 'STATUS_CODE_OK'
        FROM numbers(3000)""")
    return t0


def test_ingest_counts_from_hours_equal_the_raw_rows(store, make_settings) -> None:
    """The whole hours of a window from the ingest rollups (migrations/0035), its partial
    hours raw: every count equal to reading every request and span, on spans written as an
    otelcol-contrib exporter writes them; the example trace is one of that service's
    requests."""
    t0 = _exporter_spans(store)
    raw, rolled = make_settings(analytics={"use_rollups": False}), make_settings()
    windows = [{"since": (t0 + timedelta(minutes=17)).isoformat(), "until": (t0 + timedelta(hours=4, minutes=13)).isoformat()},
               {"since": t0.isoformat(), "until": (t0 + timedelta(hours=5)).isoformat()},
               {"since": t0.isoformat(), "until": (t0 + timedelta(hours=5)).isoformat(), "service": "chat-api"},
               {"since": (t0 + timedelta(minutes=5)).isoformat(), "until": (t0 + timedelta(minutes=55)).isoformat()}]
    counts = ("requests", "spans_seen", "without_usage", "without_model", "streams_without_ttft",
              "unpriced_requests", "unpriced_models", "unrecognized_spans")

    def rows(settings: Any, params: dict[str, str]) -> dict:
        return {(r["service"], r["dialect"]): r for r in reports.run("ingest", store, settings, params)["rows"]}

    for window in windows:
        want, got = rows(raw, window), rows(rolled, window)
        assert got.keys() == want.keys()
        for key, row in got.items():
            assert {c: row[c] for c in counts} == {c: want[key][c] for c in counts}, (window, key)
            if row["requests"]:
                [(n,)] = store.client().query(
                    "SELECT count() FROM llm_requests WHERE TraceId = {t:String} AND ServiceName = {s:String}",
                    parameters={"t": row["example_trace_id"], "s": key[0]}).result_rows
                assert n == 1
    whole = rows(rolled, windows[1])
    chat = whole[("chat-api", "semconv")]
    assert chat["requests"] == 1000 and chat["spans_seen"] == 1000
    assert chat["without_usage"] == 200 and chat["without_model"] == 200 and chat["streams_without_ttft"] == 200
    [(stored,)] = store.client().query("SELECT sum(Spans) FROM rollup_spans_1h").result_rows
    assert stored == 3000


def test_a_model_a_gpu_deployment_served_is_priced(collector, otlp_http, store, settings, make_settings) -> None:
    """A self-hosted model has no token price; the cost report prices its requests by the
    GPUs' time where its deployment is configured, so ingest health does not list it as
    unpriced there. Sent by the OpenTelemetry SDK over the real receiver."""
    provider = TracerProvider(resource=Resource.create({"service.name": "llama-svc", "app.deployment": "llama-prod"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces")))
    for _ in range(3):
        with provider.get_tracer("llama").start_as_current_span("chat my-llama-8b") as span:
            span.set_attributes({"gen_ai.operation.name": "chat", "gen_ai.request.model": "my-llama-8b",
                                 "gen_ai.response.model": "my-llama-8b", "gen_ai.usage.input_tokens": 40,
                                 "gen_ai.usage.output_tokens": 9})
    provider.shutdown()
    assert collector.writer.force_flush(30)

    def llama(s: Any) -> dict:
        return {(r["service"], r["dialect"]): r for r in reports.run("ingest", store, s, {})["rows"]}[("llama-svc", "semconv")]

    assert llama(settings)["unpriced_requests"] == 3 and llama(settings)["unpriced_models"] == ["my-llama-8b"]
    gpu = make_settings(deployments=[{"name": "llama-prod", "gpus": {"hosts": ["gpu-1"]}, "gpu_hourly_usd": 2.0}])
    assert llama(gpu)["unpriced_requests"] == 0 and llama(gpu)["unpriced_models"] == []
    other = make_settings(deployments=[{"name": "other-prod", "gpus": {"hosts": ["gpu-1"]}, "gpu_hourly_usd": 2.0}])
    assert llama(other)["unpriced_requests"] == 3
