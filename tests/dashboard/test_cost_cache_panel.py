"""The Cost page's "What caching saves" panel: spans with provider cache reads and writes and
spans of an application's response cache, exported by the real OpenTelemetry SDK to the
running receiver, read back through the cache report into the panel's rows, to the cent."""

from __future__ import annotations

import time

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from servelens.dashboard import data
from servelens.dashboard.app import create_app
from servelens.dashboard.components import pct, usd
from tests.dashboard.conftest import table_rows

pytestmark = pytest.mark.integration

PRICES = {"models": [{"model": "m-cached", "input_per_mtok": 2.5, "cached_input_per_mtok": 1.25,
                      "cache_write_per_mtok": 3.125, "output_per_mtok": 10.0}], "catalog": "none"}


@pytest.fixture
def settings(make_settings):
    return make_settings(pricing=PRICES)


def _export(otlp_http: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "chat"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces", timeout=10),
                                                   schedule_delay_millis=60_000))
    tracer = provider.get_tracer("cache-panel-test")
    start = time.time_ns() - 600 * 10**9
    for i in range(40):  # 40 requests of 1,000 input tokens: 400 read from the cache, 100 written to it
        span = tracer.start_span("chat m-cached", kind=SpanKind.CLIENT, start_time=start + i * 10**9, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "m-cached", "gen_ai.usage.input_tokens": 1000,
            "gen_ai.usage.output_tokens": 200, "gen_ai.usage.cache_read.input_tokens": 400,
            "gen_ai.usage.cache_write.input_tokens": 100})
        span.end(end_time=start + i * 10**9 + 500_000_000)
    for i in range(10):  # the application's own cache in front of the model: 3 of 10 lookups hit
        span = tracer.start_span("answer cache", start_time=start + i * 10**9, attributes={"app.cache.hit": i < 3})
        span.end(end_time=start + i * 10**9 + 1_000_000)
    assert provider.force_flush(timeout_millis=30_000)
    provider.shutdown()


def test_the_panel_lists_each_cache_with_what_it_saved(settings, store, otlp_http) -> None:
    _export(otlp_http)
    create_app(settings, store)  # registers the pages
    from servelens.dashboard.pages import cost as page

    rows = page.cache_rows(page.fetch_cache(data.DataSource(settings, store), data.Filters()))
    by_kind = {r["kind"]: r for r in rows}
    provider, response = by_kind["provider"], by_kind["response"]
    assert (provider["key"], provider["lookups"], provider["hits"], provider["writes"]) == ("m-cached", 40_000,
                                                                                            16_000, 4_000)
    # 16k reads save (2.5 - 1.25) $/M = $0.02; 4k writes cost (3.125 - 2.5) $/M more = $0.0025
    assert provider["saved_usd"] == pytest.approx(0.0175)
    assert (response["key"], response["lookups"], response["hits"]) == ("chat", 10, 3)
    assert [r["kind"] for r in rows] == ["provider", "response"]  # no vLLM counters: no prefix row

    panel, more = page.cache_panel(rows)
    assert more is None  # every row listed
    cells = table_rows(panel)
    assert cells[0][:2] == ["Provider prompt cache", "m-cached"]
    assert pct(0.4) in cells[0] and usd(0.0175) in cells[0]
    assert cells[1][:2] == ["Response cache (app.cache.hit)", "chat"] and pct(0.3) in cells[1]


def test_without_caching_the_panel_says_what_it_looks_for(settings, store) -> None:
    create_app(settings, store)
    from servelens.dashboard.pages import cost as page

    panel, _ = page.cache_panel(page.fetch_cache(data.DataSource(settings, store), data.Filters()))
    assert "No caching measured" in str(panel.children)


def test_the_panel_lists_the_first_rows_of_each_kind_and_counts_the_rest(settings, store) -> None:
    create_app(settings, store)
    from servelens.dashboard.pages import cost as page

    rows = [{"kind": "provider", "key": f"m-{i}", "unit": "input tokens", "lookups": 1000, "hits": i, "writes": 0,
             "hit_rate": i / 1000, "saved_usd": i / 100, "saved_prefill_s": None, "note": None} for i in range(60)]
    panel, more = page.cache_panel(rows, n=25)
    keys = [row[1] for row in table_rows(panel)]
    assert keys == [f"m-{i}" for i in range(59, 34, -1)]  # the largest savings first
    assert "35 more not listed" in str(more.children)
