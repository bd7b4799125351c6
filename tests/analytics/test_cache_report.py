"""The `cache` report on the real embedded ClickHouse: provider prompt caching priced to the
cent, vLLM prefix-cache counters (with a restart) turned into hit rate and prefill time saved,
and an application's response cache read from spans the real OpenTelemetry SDK exported to
the running receiver; and Tier A's "hit rate + N points" what-if."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from bench.history import HOUR, Traffic, insert
from servelens.analytics.plan import capacity
from servelens.analytics.reports import registry

pytestmark = pytest.mark.integration

# The window ends an hour past the next full hour: spans the SDK exports "now" stay inside
# it when the test runs after an hour boundary the module was imported before.
UNTIL = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) + 2 * HOUR
SINCE = UNTIL - timedelta(hours=3)
PRICES = {"models": [{"model": "m-cached", "input_per_mtok": 2.5, "cached_input_per_mtok": 1.25,
                      "cache_write_per_mtok": 3.125, "output_per_mtok": 10.0}], "catalog": "none"}
LLAMA = {"name": "llama-prod", "gpus": {"count": 2}, "gpu_hourly_usd": 3.6}


def _requests(store, model: str, n: int, cached: int, written: int, service: str = "chat") -> None:
    at = SINCE + timedelta(minutes=30)
    rows = [[at + timedelta(seconds=i), service, model, "acme", 1000, 200, cached, written, 0.5, False]
            for i in range(n)]
    store.client().insert("llm_requests", rows, column_names=[
        "Timestamp", "ServiceName", "Model", "Tenant", "InputTokens", "OutputTokens", "CachedInputTokens",
        "CacheWriteInputTokens", "LatencySeconds", "IsError"])


def _rows(store, settings, **params) -> list[dict]:
    return registry.run("cache", store, settings, {"since": SINCE.isoformat(), "until": UNTIL.isoformat(), **params})[
        "rows"]


def test_provider_prompt_caching_is_priced_to_the_cent(store, make_settings) -> None:
    settings = make_settings(pricing=PRICES)
    _requests(store, "m-cached", 1000, cached=400, written=100)
    _requests(store, "m-unknown", 10, cached=500, written=0)
    rows = {r["key"]: r for r in _rows(store, settings) if r["kind"] == "provider"}
    m = rows["m-cached"]
    assert (m["lookups"], m["hits"], m["writes"]) == (1_000_000, 400_000, 100_000)
    assert m["hit_rate"] == pytest.approx(0.4)
    # 400k reads save (2.5 - 1.25) $/M, 100k writes cost (3.125 - 2.5) $/M more: $0.5 - $0.0625.
    assert round(m["saved_usd"], 2) == 0.44 and m["saved_usd"] == pytest.approx(0.4375)
    assert rows["m-unknown"]["saved_usd"] is None and "unpriced" in rows["m-unknown"]["note"]
    by_tenant = [r for r in _rows(store, settings, by="tenant") if r["kind"] == "provider"]
    assert [r["key"] for r in by_tenant] == ["acme"] and by_tenant[0]["saved_usd"] == pytest.approx(0.4375)


def test_vllm_prefix_cache_counters_give_hit_rate_and_prefill_time_saved(store, make_settings) -> None:
    settings = make_settings(deployments=[LLAMA])
    insert(store, SINCE, UNTIL, Traffic(service="llama-svc", deployment="llama-prod", model="llama-70b",
                                        per_hour=600, ttft_s=0.3, queue_s=0.05, input_tokens=800))
    # Cumulative token counters per instance; vllm-1 restarts (its counters fall to a new start).
    samples = []
    for m, (q0, h0, q1, h1) in enumerate([(0, 0, 5_000, 1_000), (10_000, 4_000, 9_000, 2_000),
                                          (20_000, 8_000, 1_000, 500), (30_000, 12_000, 4_000, 1_100)]):
        at = SINCE + timedelta(minutes=10 * (m + 1))
        samples += [[at, "llama-prod", "vllm-0", float(q0), float(h0)], [at, "llama-prod", "vllm-1", float(q1), float(h1)]]
    store.client().insert("engine_samples", samples, column_names=[
        "Timestamp", "Deployment", "Instance", "PrefixCacheQueries", "PrefixCacheHits"])
    (row,) = [r for r in _rows(store, settings) if r["kind"] == "prefix"]
    # vllm-0: 30,000 queried, 12,000 hit; vllm-1: +4,000 then a restart (its new 1,000) then +3,000 queried,
    # +1,000, the new 500, +600 hit: 8,000 / 2,100.
    assert (row["key"], row["lookups"], row["hits"]) == ("llama-prod", 38_000, 14_100)
    assert row["hit_rate"] == pytest.approx(14_100 / 38_000)
    per_token = store.client().query(
        "SELECT sum(TtftSeconds - QueueSeconds) / sum(InputTokens) FROM llm_requests "
        "WHERE Deployment = 'llama-prod' AND NOT IsError").first_row[0]
    assert row["saved_prefill_s"] == pytest.approx(14_100 * per_token, rel=1e-6)
    assert row["saved_usd"] == pytest.approx(row["saved_prefill_s"] / 3600 * 3.6)


def test_response_cache_hits_from_sdk_spans_are_counted_and_valued(store, make_settings, collector, otlp_http) -> None:
    settings = make_settings(pricing=PRICES)
    _requests(store, "m-cached", 100, cached=0, written=0, service="faq-bot")
    provider = TracerProvider(resource=Resource.create({"service.name": "faq-bot"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces")))
    tracer = provider.get_tracer("faq-bot")
    for i in range(40):
        with tracer.start_as_current_span("cache lookup") as span:
            span.set_attribute("app.cache.hit", i % 4 != 0)  # 30 hits of 40
    provider.shutdown()
    deadline = time.monotonic() + 30
    rows: list[dict] = []
    while time.monotonic() < deadline:
        rows = [r for r in _rows(store, settings) if r["kind"] == "response"]
        if rows and rows[0]["lookups"] == 40:
            break
        time.sleep(0.5)
    (row,) = rows
    assert (row["key"], row["lookups"], row["hits"]) == ("faq-bot", 40, 30)
    per_request = (1000 * 2.5 + 200 * 10.0) / 1e6
    assert row["saved_usd"] == pytest.approx(30 * per_request)


def test_tier_a_what_if_of_more_cache_hits_shortens_the_prefill(store, make_settings) -> None:
    settings = make_settings(deployments=[LLAMA])
    insert(store, SINCE, UNTIL, Traffic(service="llama-svc", deployment="llama-prod", model="llama-70b",
                                        per_hour=1800, ttft_s=0.4, queue_s=0.05, input_tokens=800))
    window = {"deployment": "llama-prod", "since": SINCE.isoformat(), "until": UNTIL.isoformat(),
              "target": "p99_ttft_ms:2000"}
    base = capacity.plan(store, settings, window)
    more = capacity.plan(store, settings, {**window, "cache_hit_points": "20"})
    assert more["what_if"]["cache_hit_points"] == 20
    assert more["what_if"]["cached_share_measured"] == 0
    by_n = {p["replicas"]: p for p in more["at"]}
    for p in base["at"]:
        if p["p99_ttft_ms"] is not None and p["replicas"] in by_n:
            assert by_n[p["replicas"]]["p99_ttft_ms"] < p["p99_ttft_ms"]
    with pytest.raises(Exception, match="cache_hit_points"):
        capacity.plan(store, settings, {**window, "cache_hit_points": "150"})
