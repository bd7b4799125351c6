"""Traces: search (GET /api/v1/traces), one trace's waterfall (GET /api/v1/traces/<id>) and
the Traces page, against the real store with traffic sent through the real OTel SDK
exporter to the real receiver; and the links other pages draw to it."""

from __future__ import annotations

import json
import math
import shutil
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from bench.dashboard_cardinality import dependencies, post_callback, refresh_body, refresh_dependency
from servelens.analytics.reports import registry as reports
from servelens.analytics.reports import traces_search
from servelens.core.migrate import migrate
from servelens.core.store import Store
from servelens.dashboard import data, traces_links
from servelens.dashboard.components import ms, usd
from tests.dashboard.conftest import PRICES, http, make_traffic, send
from tests.dashboard.test_browser import CHROMEDRIVER, CHROMIUM, browser  # noqa: F401 - the fixture
from tests.dashboard.test_hardening import HOSTILE_FILTERS, HOSTILE_VALUES

RAG = "rag-api"
TRAFFIC = make_traffic(30, seed=31, ago=(120, 20 * 3600))
MS = 1_000_000  # ns


def _exporter(otlp_http: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": RAG}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces", timeout=10),
                                                   schedule_delay_millis=60_000))
    return provider


def _flush(provider: TracerProvider) -> None:
    assert provider.force_flush(timeout_millis=30_000), "spans were not exported"
    provider.shutdown()


# One RAG request: the root, a retrieval, a tool that fails after calling a small model,
# the answer's LLM call (vLLM timings, streamed TTFT), and a post-processing step that
# leaves in a second export (so the trace id -> time table holds two rows for it).
# (name, parent, start ms, duration ms, kind, attributes, error)
LLM_ATTRS = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 1200,
             "gen_ai.usage.output_tokens": 300, "app.tenant": "acme", "gen_ai.response.time_to_first_chunk": 0.4,
             "gen_ai.latency.time_in_queue": 0.1, "gen_ai.latency.time_in_model_prefill": 0.3,
             "gen_ai.latency.time_in_model_decode": 1.4}
TOOL_LLM_ATTRS = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
                  "gen_ai.usage.input_tokens": 200, "gen_ai.usage.output_tokens": 50, "app.tenant": "acme"}
SPANS = (
    ("POST /answer", None, 0, 3000, SpanKind.SERVER, {"http.request.method": "POST"}, False),
    ("retrieve documents", "POST /answer", 50, 300, SpanKind.INTERNAL, {"gen_ai.operation.name": "retrieval"}, False),
    ("execute_tool lookup", "POST /answer", 400, 500, SpanKind.INTERNAL,
     {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup"}, True),
    ("chat gpt-4o-mini", "execute_tool lookup", 450, 200, SpanKind.CLIENT, TOOL_LLM_ATTRS, False),
    ("chat gpt-4o", "POST /answer", 1000, 1800, SpanKind.CLIENT, LLM_ATTRS, False),
)
LATE = ("postprocess", "POST /answer", 2850, 140, SpanKind.INTERNAL, {"app.stage": "postprocess"}, False)
ORDER = [s[0] for s in SPANS] + [LATE[0]]
DEPTHS = [0, 1, 1, 2, 1, 1]


def send_rag_trace(otlp_http: str, ago_s: float = 600) -> tuple[str, dict[str, str]]:
    """(trace id, span id by name) of the trace above, started ago_s seconds ago."""
    t0 = time.time_ns() - int(ago_s * 1e9)
    provider = _exporter(otlp_http)
    tracer = provider.get_tracer("servelens-tests")
    spans: dict[str, Any] = {}
    for name, parent, start, duration, kind, attributes, error in SPANS:
        context = trace.set_span_in_context(spans[parent]) if parent else None
        span = tracer.start_span(name, context=context, kind=kind, start_time=t0 + start * MS, attributes=attributes)
        if error:
            span.set_status(Status(StatusCode.ERROR, "tool timed out"))
        spans[name] = span
    for (name, _, start, duration, *_rest) in SPANS:
        spans[name].end(end_time=t0 + (start + duration) * MS)
    _flush(provider)
    root = spans["POST /answer"].get_span_context()
    ids = {name: format(span.get_span_context().span_id, "016x") for name, span in spans.items()}

    provider = _exporter(otlp_http)  # later, from another process: only the trace context travels
    parent = NonRecordingSpan(SpanContext(root.trace_id, root.span_id, is_remote=True,
                                          trace_flags=TraceFlags(TraceFlags.SAMPLED)))
    name, _, start, duration, kind, attributes, _ = LATE
    late = provider.get_tracer("servelens-tests").start_span(
        name, context=trace.set_span_in_context(parent), kind=kind, start_time=t0 + start * MS, attributes=attributes)
    late.end(end_time=t0 + (start + duration) * MS)
    _flush(provider)
    ids[name] = format(late.get_span_context().span_id, "016x")
    return format(root.trace_id, "032x"), ids


def api_cost(model: str, input_tokens: int, output_tokens: int) -> float:
    price_in, price_out = PRICES[model]
    return (input_tokens * price_in + output_tokens * price_out) / 1e6


# --- API: one trace ---------------------------------------------------------------------------

def test_a_trace_is_its_spans_in_waterfall_order_with_parents_roles_and_request_numbers(dashboard, otlp_http, store):
    trace_id, ids = send_rag_trace(otlp_http)
    assert store.client().command(
        f"SELECT count() FROM otel_traces_trace_id_ts WHERE TraceId = '{trace_id}'") == 2  # two exports

    status, kind, body = http("GET", f"{dashboard.url}/api/v1/traces/{trace_id.upper()}")
    assert status == 200 and kind.startswith("application/json")
    assert body["trace_id"] == trace_id
    spans = body["spans"]
    assert [s["name"] for s in spans] == ORDER
    assert [s["depth"] for s in spans] == DEPTHS
    parents = {name: parent for name, parent, *_ in (*SPANS, LATE)}
    for s in spans:
        assert s["span_id"] == ids[s["name"]]
        assert s["parent_span_id"] == (ids[parents[s["name"]]] if parents[s["name"]] else "")
        assert s["service"] == RAG
    starts = [s["start"] for s in spans]
    assert starts == sorted(starts)  # a sequential trace: waterfall order is start order
    by = {s["name"]: s for s in spans}
    assert [by[n]["duration_ms"] for n in ORDER] == pytest.approx([3000, 300, 500, 200, 1800, 140])
    assert [by[n]["role"] for n in ORDER] == ["", "retrieval", "tool", "llm", "llm", "postprocess"]
    assert [by[n]["kind"] for n in ORDER] == ["server", "internal", "internal", "client", "client", "internal"]
    assert by["execute_tool lookup"]["status"] == "error"
    assert by["execute_tool lookup"]["status_message"] == "tool timed out"
    assert by["retrieve documents"]["request"] is None and by["POST /answer"]["request"] is None
    assert by["execute_tool lookup"]["attributes"]["gen_ai.tool.name"] == "lookup"

    llm = by["chat gpt-4o"]["request"]
    assert (llm["model"], llm["tenant"], llm["input_tokens"], llm["output_tokens"]) == ("gpt-4o", "acme", 1200, 300)
    assert llm["cost_usd"] == pytest.approx(api_cost("gpt-4o", 1200, 300))
    assert (llm["latency_ms"], llm["ttft_ms"]) == (pytest.approx(1800), pytest.approx(400))
    assert (llm["queue_ms"], llm["prefill_ms"], llm["decode_ms"]) == (
        pytest.approx(100), pytest.approx(300), pytest.approx(1400))
    assert llm["error"] is False
    small = by["chat gpt-4o-mini"]["request"]
    assert small["cost_usd"] == pytest.approx(api_cost("gpt-4o-mini", 200, 50))
    assert small["ttft_ms"] is None


def test_an_unknown_trace_is_404_and_a_malformed_id_400(dashboard):
    status, _, body = http("GET", f"{dashboard.url}/api/v1/traces/{'ab' * 16}")
    assert status == 404 and "no trace" in body["error"]
    for bad in ("xyz", "a" * 31, "a" * 33, "g" * 32, "%27%20OR%201%3D1"):
        status, kind, body = http("GET", f"{dashboard.url}/api/v1/traces/{bad}")
        assert status == 400 and kind.startswith("application/json") and "32 hexadecimal" in body["error"], bad


def test_the_lookup_finds_spans_through_the_trace_id_table_only(store, otlp_http, settings):
    trace_id, _ = send_rag_trace(otlp_http)
    assert len(traces_search.get_trace(store, settings, trace_id)["spans"]) == len(ORDER)
    # The spans stay, the trace id -> time rows go: the lookup, which never scans
    # otel_traces for an id, finds nothing.
    store.client().command("TRUNCATE TABLE otel_traces_trace_id_ts")
    assert store.client().command(f"SELECT count() FROM otel_traces WHERE TraceId = '{trace_id}'") == len(ORDER)
    assert traces_search.get_trace(store, settings, trace_id) is None


def test_waterfall_puts_each_span_under_its_parent_and_keeps_orphans():
    def span(span_id: str, parent: str, start: int) -> dict[str, Any]:
        return {"span_id": span_id, "parent_span_id": parent, "start_ns": start}

    # started in this order: a parallel sibling (c) starts before a's child (a1); x's parent
    # was never received; y and z are each other's parent.
    spans = [span("r", "", 0), span("a", "r", 1), span("c", "r", 2), span("a1", "a", 3), span("x", "gone", 4),
             span("y", "z", 5), span("z", "y", 6)]
    out = traces_search.waterfall(spans)
    assert [(s["span_id"], s["depth"]) for s in out] == [("r", 0), ("a", 1), ("a1", 2), ("c", 1), ("x", 0),
                                                         ("y", 0), ("z", 1)]


def test_self_hosted_requests_cost_their_share_of_the_gpu_bill_as_the_cost_report_says(make_settings):
    settings = make_settings(deployments=[{"name": "gpu-svc", "gpus": {"count": 2}, "gpu_hourly_usd": 2.0}])
    store = Store(settings.store_url, settings.store.database)
    migrate(store.client())
    try:
        store.client().command("""
            INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                     SpanAttributes, Duration, StatusCode)
            SELECT now64(9) - toIntervalSecond(600 - number), repeat('c', 32), concat('s', toString(number)), '',
                   'chat', 'SPAN_KIND_CLIENT', 'gpu-svc',
                   map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'llama-3-8b',
                       'gen_ai.usage.input_tokens', toString(1000 * (number + 1)), 'gen_ai.usage.output_tokens', '100'),
                   1000000000, 'STATUS_CODE_OK'
            FROM numbers(2)""")
        spans = traces_search.get_trace(store, settings, "c" * 32)["spans"]
        shares = [s["request"]["cost_usd"] for s in spans]
        (row,) = reports.run("cost", store, settings, {"by": "deployment"})["rows"]
        assert sum(shares) == pytest.approx(row["cost_usd"]) and row["cost_usd"] == pytest.approx(2 * 24 * 2.0)
        assert shares[1] / shares[0] == pytest.approx((2000 + 100) / (1000 + 100))  # by weighted tokens
        found = traces_search.search(store, settings, {"sort": "cost"})["traces"]
        assert [t["cost_usd"] for t in found] == pytest.approx([max(shares)])  # one trace: its costliest request
    finally:
        store.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")


def test_an_older_traces_self_hosted_share_is_of_the_day_up_to_its_hours_end(make_settings):
    """A trace whose hour has ended shares the GPU cost of the 24 hours up to that hour's
    end (the hours' grid: stored hours only), as the cost report prices that window; a
    trace in the running hour, of the 24 hours up to now."""
    from datetime import datetime, timedelta, timezone

    settings = make_settings(deployments=[{"name": "gpu-svc", "gpus": {"count": 2}, "gpu_hourly_usd": 2.0}])
    store = Store(settings.store_url, settings.store.database)
    migrate(store.client())
    now = datetime.now(timezone.utc)
    at = now.replace(minute=20, second=0, microsecond=0) - timedelta(hours=3)  # two requests at hh:20 and hh:21
    try:
        store.client().command(f"""
            INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                                     SpanAttributes, Duration, StatusCode)
            SELECT fromUnixTimestamp64Nano(toInt64({int(at.timestamp())} + 60 * (number % 2)) * 1000000000),
                   repeat(['d', 'e'][1 + intDiv(number, 2)], 32), concat('s', toString(number)), '',
                   'chat', 'SPAN_KIND_CLIENT', 'gpu-svc',
                   map('gen_ai.operation.name', 'chat', 'gen_ai.request.model', 'llama-3-8b',
                       'gen_ai.usage.input_tokens', toString(1000 * (number + 1)), 'gen_ai.usage.output_tokens', '100'),
                   1000000000, 'STATUS_CODE_OK'
            FROM numbers(4)""")
        hour_end = at.replace(minute=0) + timedelta(hours=1)
        window = traces_search.cost_window(at + timedelta(minutes=1), now=now)
        assert (window.since, window.until) == (hour_end - timedelta(days=1), hour_end)
        running = traces_search.cost_window(now - timedelta(seconds=5), now=now)
        assert running.until == now
        (row,) = reports.run("cost", store, settings, {"by": "deployment", "since": window.since.isoformat(),
                                                        "until": hour_end.isoformat()})["rows"]
        shares = [s["request"]["cost_usd"] for t in ("d", "e") for s in traces_search.get_trace(store, settings,
                                                                                              t * 32)["spans"]]
        assert sum(shares) == pytest.approx(row["cost_usd"]) and row["cost_usd"] == pytest.approx(2 * 24 * 2.0)
    finally:
        store.client().command(f"DROP DATABASE IF EXISTS `{settings.store.database}`")


# --- API: search ------------------------------------------------------------------------------

def _search(dashboard, **params: Any) -> list[dict[str, Any]]:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    status, _, body = http("GET", f"{dashboard.url}/api/v1/traces?{query}")
    assert status == 200, body
    return body["traces"]


def test_search_by_thresholds_filters_and_orders(dashboard, otlp_http, store):
    send(otlp_http, TRAFFIC)
    trace_id, _ = send_rag_trace(otlp_http)
    every = [r.latency * 1000 for r in TRAFFIC] + [1800, 200]  # the RAG trace's two LLM requests

    newest = _search(dashboard)
    assert len(newest) == len(TRAFFIC) + 1  # one row per trace: the RAG trace once
    assert [t["start"] for t in newest] == sorted((t["start"] for t in newest), reverse=True)
    rag = next(t for t in newest if t["trace_id"] == trace_id)
    assert set(rag) == {"trace_id", "start", "service", "model", "tenant", "latency_ms", "ttft_ms", "cost_usd",
                        "error"}
    assert (rag["service"], rag["tenant"]) == (RAG, "acme")

    threshold = 3000
    slow = _search(dashboard, min_latency_ms=threshold, sort="latency")
    assert [t["latency_ms"] for t in slow] == pytest.approx(sorted((x for x in every if x >= threshold),
                                                                   reverse=True))
    # the RAG trace ranks by its slowest request
    assert _search(dashboard, sort="latency", service=RAG)[0]["latency_ms"] == pytest.approx(1800)
    assert [t["latency_ms"] for t in _search(dashboard, sort="latency", limit=3)] == pytest.approx(
        sorted(every, reverse=True)[:3])

    ttfts = sorted((r.ttft * 1000 for r in TRAFFIC if r.ttft is not None and r.ttft * 1000 >= 500), reverse=True)
    assert [t["ttft_ms"] for t in _search(dashboard, min_ttft_ms=500, sort="ttft")] == pytest.approx(ttfts)

    errors = _search(dashboard, error="true")
    assert len(errors) == sum(r.error for r in TRAFFIC) and all(t["error"] for t in errors)
    assert len(_search(dashboard, error="false")) == len(TRAFFIC) + 1 - len(errors)

    acme_mini = _search(dashboard, tenant="acme", model="gpt-4o-mini", service="chat-api")
    assert len(acme_mini) == sum(r.tenant == "acme" and r.model == "gpt-4o-mini" for r in TRAFFIC)

    costliest = _search(dashboard, sort="cost", tenant="globex")
    globex = [r for r in TRAFFIC if r.tenant == "globex"]
    expected = sorted((api_cost(r.model, r.input_tokens, r.output_tokens) for r in globex if r.model in PRICES),
                      reverse=True)
    assert [t["cost_usd"] for t in costliest[:len(expected)]] == pytest.approx(expected)
    assert [t["cost_usd"] for t in costliest[len(expected):]] == [None] * sum(r.model not in PRICES for r in globex)


@pytest.mark.parametrize("query, message", [
    ("sort=price", "sort"), ("limit=0", "limit"), ("limit=501", "limit"), ("limit=2.5", "limit"),
    ("min_latency_ms=fast", "min_latency_ms"), ("min_ttft_ms=nan", "min_ttft_ms"), ("error=maybe", "error"),
    ("since=yesterday", "since"),
])
def test_a_bad_search_parameter_is_400(dashboard, query, message):
    status, kind, body = http("GET", f"{dashboard.url}/api/v1/traces?{query}")
    assert status == 400 and kind.startswith("application/json") and message in body["error"]


def test_hostile_callback_inputs_are_dropped_and_the_traces_page_still_answers(dashboard, otlp_http):
    from servelens.dashboard.pages import traces as page  # registered by the app: importable once it exists

    send(otlp_http, TRAFFIC[:5])
    deps = dependencies(dashboard.url)
    dep = refresh_dependency(deps, "trc-alert")
    controls = [i["id"] for i in dep["inputs"] if i["property"] == "value"]
    assert set(controls) == {f"trc-{name}" for name in page.CONTROLS}
    for filters, value in zip(HOSTILE_FILTERS, HOSTILE_VALUES):
        status, payload = post_callback(dashboard.url, refresh_body(deps, "trc-alert", dict.fromkeys(controls, value),
                                                                    filters))
        response = json.loads(payload)["response"]
        assert status == 200 and response["trc-alert"]["children"] is None, (filters, value)
        assert "5 traces" in json.dumps(response["trc-results"])  # hostile values dropped: the default search
    # A window typed wrong is said so in the list, not as a failed load.
    typed = {**dict.fromkeys(controls), "trc-since": "yesterday"}
    status, payload = post_callback(dashboard.url, refresh_body(deps, "trc-alert", typed))
    response = json.loads(payload)["response"]
    assert status == 200 and response["trc-alert"]["children"] is None
    assert "Cannot search: since: not an ISO-8601 time" in json.dumps(response["trc-results"])
    # The waterfall's own callback: a trace id that is not a string, or not one, is no trace.
    waterfall = next(d for d in deps if d["output"] == "trc-trace.children")
    for value in (*HOSTILE_VALUES, "'; DROP TABLE otel_traces; --"):
        body = {"output": waterfall["output"], "outputs": {"id": "trc-trace", "property": "children"},
                "inputs": [{"id": "trc-trace-id", "property": "value", "value": value}], "changedPropIds": [],
                "state": []}
        status, payload = post_callback(dashboard.url, body)
        assert status in (200, 204), (value, payload[:200])


# --- Links ------------------------------------------------------------------------------------

def test_links_carry_the_window_filters_and_the_question():
    filters = data.Filters(range="6h", model="gpt-4o")
    query = parse_qs(urlsplit(traces_links.slowest(filters, "tenant", "a&b", 812.7)).query)
    assert {k: v[0] for k, v in query.items() if k not in ("since", "until")} == {
        "model": "gpt-4o", "tenant": "a&b", "min_latency_ms": "812", "sort": "latency"}
    assert query["since"][0] < query["until"][0]
    assert traces_links.costliest(filters, "team", "core") is None  # the search has no team filter
    episode = {"kind": "error_rate_spike", "subject": {"service": "embed-api"}, "evidence": {},
               "started_at": "2026-01-01T10:00:00Z", "resolved_at": None}
    assert traces_links.episode(episode) == "/traces?service=embed-api&since=2026-01-01T10%3A00%3A00Z&error=true"
    drift = {"kind": "p99_drift", "subject": {"deployment": "d1", "metric": "ttft"},
             "evidence": {"metric": "ttft", "baseline_p99_ms": 420.9}, "started_at": "2026-01-01T10:00:00Z",
             "resolved_at": "2026-01-01T12:00:00Z"}
    assert parse_qs(urlsplit(traces_links.episode(drift)).query) == {
        "deployment": ["d1"], "since": ["2026-01-01T10:00:00Z"], "until": ["2026-01-01T12:00:00Z"],
        "sort": ["ttft"], "min_ttft_ms": ["420"]}
    assert traces_links.trace_href("ab" * 16, {"model": "m"}) == f"/traces?model=m&trace_id={'ab' * 16}"


# --- In the browser ---------------------------------------------------------------------------

needs_chromium = (
    pytest.mark.browser, pytest.mark.integration,
    pytest.mark.skipif(not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)),
                       reason="needs Debian's chromium and chromium-driver"),
)


def _wait(driver, until, timeout: float = 20) -> None:
    WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=[StaleElementReferenceException]).until(until)


def _read(driver, script: str, *args: Any) -> Any:
    return driver.execute_script(script, *args)


_WATERFALL_JS = """
    return Array.from(document.querySelectorAll('#trc-waterfall .wf-row')).map(function (row) {
        return {name: row.querySelector('.wf-name').textContent, depth: row.getAttribute('data-depth'),
                span: row.getAttribute('data-span-id'), error: row.classList.contains('wf-error'),
                llm: (row.querySelector('.wf-llm') || {}).textContent || null,
                bar: row.querySelector('.wf-bar').style.left};
    });"""
_RESULTS_JS = """
    // the list's rows (a DataTable's header is a row of th cells)
    return Array.from(document.querySelectorAll('#trc-results tbody tr')).filter(function (tr) {
        return tr.querySelector('td');
    }).map(function (tr) {
        var cells = Array.from(tr.querySelectorAll('td')).map(function (td) { return td.textContent.trim(); });
        return {trace: tr.querySelector('a').getAttribute('title'), cells: cells};
    });"""


def _severe(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def browser_test(test):
    for mark in needs_chromium:
        test = mark(test)
    return test


@browser_test
def test_the_waterfall_draws_every_span_in_order_and_a_latency_search_finds_the_slow_traces(
        browser, dashboard, otlp_http):
    send(otlp_http, TRAFFIC)
    trace_id, ids = send_rag_trace(otlp_http)

    browser.get(f"{dashboard.url}/traces?trace_id={trace_id}")
    _wait(browser, lambda d: len(_read(d, _WATERFALL_JS)) == len(ORDER))
    rows = _read(browser, _WATERFALL_JS)
    assert [r["name"] for r in rows] == ORDER
    assert [int(r["depth"]) for r in rows] == DEPTHS
    assert [r["span"] for r in rows] == [ids[n] for n in ORDER]
    assert [r["error"] for r in rows] == [n == "execute_tool lookup" for n in ORDER]
    assert [float(r["bar"].rstrip("%")) for r in rows] == pytest.approx(
        [s[2] / 3000 * 100 for s in (*SPANS, LATE)], abs=0.01)  # bars placed by start
    llm = rows[ORDER.index("chat gpt-4o")]["llm"]
    for text in ("gpt-4o", "1,200 → 300 tok", usd(api_cost("gpt-4o", 1200, 300)), "TTFT 400 ms",
                 "queue 100 ms / prefill 300 ms / decode 1,400 ms"):
        assert text in llm, (text, llm)
    assert rows[ORDER.index("retrieve documents")]["llm"] is None
    facts = browser.find_element(By.ID, "trc-trace-facts").text
    assert "6 spans" in facts and "1 error" in facts and "2 LLM requests" in facts
    roles = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#trc-waterfall .wf-role")]
    assert roles == ["retrieval", "tool", "llm", "llm", "postprocess"]
    browser.save_screenshot("/tmp/servelens_trace_waterfall.png")

    threshold = 3500
    expected = sorted((r.latency * 1000 for r in TRAFFIC if r.latency * 1000 >= threshold), reverse=True)
    api = _search(dashboard, min_latency_ms=threshold, sort="latency")
    browser.get(f"{dashboard.url}/traces?min_latency_ms={threshold}&sort=latency")
    _wait(browser, lambda d: len(_read(d, _RESULTS_JS)) == len(expected))
    results = _read(browser, _RESULTS_JS)
    assert [r["trace"] for r in results] == [t["trace_id"] for t in api]
    assert [r["cells"][5] for r in results] == [ms(x) for x in expected]
    assert browser.find_element(By.ID, "trc-min_latency_ms").get_attribute("value") == str(threshold)
    assert f"latency ≥ {threshold} ms" in browser.find_element(By.ID, "trc-summary").text

    # Selecting a trace opens its waterfall and keeps the search.
    browser.find_element(By.CSS_SELECTOR, "#trc-results tbody tr a").click()
    _wait(browser, lambda d: results[0]["trace"] in d.find_element(By.ID, "trc-trace").text)
    assert len(_read(browser, _WATERFALL_JS)) == 1
    assert browser.find_element(By.ID, "trc-min_latency_ms").get_attribute("value") == str(threshold)
    # The threshold typed into the form narrows the list.
    field = browser.find_element(By.ID, "trc-min_latency_ms")
    field.clear()
    field.send_keys("5000\n")
    _wait(browser, lambda d: len(_read(d, _RESULTS_JS)) == sum(r.latency >= 5 for r in TRAFFIC))
    browser.save_screenshot("/tmp/servelens_traces.png")
    assert _severe(browser) == []


@browser_test
def test_cost_and_latency_rows_link_to_their_costliest_and_slowest_requests(browser, dashboard, otlp_http):
    send(otlp_http, TRAFFIC)
    browser.get(f"{dashboard.url}/cost")
    link = "//*[@id='cost-table']//a[normalize-space()='acme']"
    _wait(browser, lambda d: d.find_elements(By.XPATH, link))
    query = parse_qs(urlsplit(browser.find_element(By.XPATH, link).get_attribute("href")).query)
    assert (query["tenant"], query["sort"]) == (["acme"], ["cost"])
    browser.find_element(By.XPATH, link).click()
    acme = [r for r in TRAFFIC if r.tenant == "acme"]
    _wait(browser, lambda d: len(_read(d, _RESULTS_JS)) == len(acme))
    assert {r["cells"][4] for r in _read(browser, _RESULTS_JS)} == {"acme"}
    costs = [r["cells"][7] for r in _read(browser, _RESULTS_JS)]
    priced = sorted((api_cost(r.model, r.input_tokens, r.output_tokens) for r in acme if r.model in PRICES),
                    reverse=True)
    assert costs == [usd(c) for c in priced] + ["—"] * (len(acme) - len(priced))

    browser.get(f"{dashboard.url}/latency")
    link = "//*[@id='lat-table']//a[normalize-space()='gpt-4o']"
    _wait(browser, lambda d: d.find_elements(By.XPATH, link))
    gpt4o = [r.latency * 1000 for r in TRAFFIC if r.model == "gpt-4o"]
    p99 = math.floor(float(np.percentile(gpt4o, 99)))
    query = parse_qs(urlsplit(browser.find_element(By.XPATH, link).get_attribute("href")).query)
    assert (query["model"], query["min_latency_ms"], query["sort"]) == (["gpt-4o"], [str(p99)], ["latency"])
    browser.find_element(By.XPATH, link).click()
    _wait(browser, lambda d: len(_read(d, _RESULTS_JS)) == sum(x >= p99 for x in gpt4o))
    assert _severe(browser) == []
