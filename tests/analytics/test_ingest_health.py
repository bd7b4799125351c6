"""Ingest health on real libraries' output: what was recognized, and why numbers are missing."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from servelens.analytics.reports import registry as reports
from tests.collector.captures import replay

pytestmark = pytest.mark.integration


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
