"""The dialect table against the real output of the instrumentation libraries.

tests/interop/captures/<lib>/ holds what each library exported while driving the real
`openai` client (the Vercel AI SDK: its own) against a fake OpenAI server (interop/,
`make interop-capture`), and the manifest of what that server answered. Each capture goes
through the real receiver (both span mappings; chunked where the library streamed its
body) into the real store; then:
- the llm_requests view and the Python reading (collector.dialects.request_fields) give
  the same fields for every span;
- every call is one row, with the tokens, cache tokens, TTFT, error flag and tenant the
  library sent, equal to what the fake server returned.
"""

from __future__ import annotations

import json

import pytest

from servelens.analytics.sql import RATE_LIMITED
from servelens.collector.mapping import dialects
from servelens.collector.service import Collector
from servelens.core.migrate import MIGRATIONS_DIR
from servelens.core.store import Store
from tests.collector.captures import CAPTURES, replay, span_views

pytestmark = pytest.mark.integration
LIBRARIES = sorted(p.name for p in CAPTURES.iterdir() if (p / "manifest.json").is_file())
# What each library carries (interop/README.md): a missing carrier is no failure of ours.
# (<lib>_rag: the same library's retrieval-augmented capture, callplan.rag_plan.)
ANTHROPIC = {lib for lib in LIBRARIES if lib.startswith("anthropic_")}
# (<lib>_responses: the same library's calls through OpenAI's Responses API, callplan.responses_plan.)
RESPONSES = {lib for lib in LIBRARIES if lib.endswith("_responses")}
SENDS_CACHED = {"traceloop", "openlit", "openinference", "langfuse", "vercel_ai", "vercel_ai_v7", "traceloop_rag",
                "openinference_rag", "pydantic_ai", "strands", "langchain_traceloop", "langchain_openinference",
                *ANTHROPIC, *(RESPONSES - {"litellm_responses"})}
# (traceloop: non-streamed only)
SENDS_REASONING = {"openinference", "langfuse", "vercel_ai", "openinference_rag", "pydantic_ai",
                   "langchain_openinference", *(RESPONSES - {"vercel_ai_v7_responses", "litellm_responses"})}
# (the langchain_* captures: a LangChain span, the one read, holds none)
SENDS_TTFT = {"traceloop", "openlit", "openinference", "langfuse", "vercel_ai", "vercel_ai_v7", "pydantic_ai",
              "strands", "anthropic_openinference", "anthropic_openlit", "openinference_responses",
              "openlit_responses", "vercel_ai_v7_responses", "pydantic_ai_responses",
              "langfuse_responses"}
# Langfuse names one model, not both; the Agents SDK's generation span the model configured,
# its response span the model answered
SENDS_REQUEST_MODEL = set(LIBRARIES) - {"langfuse", "langfuse_responses", "openai_agents",
                                        "openai_agents_responses"}
# The Agents SDK's response span of a failed call names no model (only its status message
# says what failed): its attempts are told apart by their HTTP status.
SENDS_FAILED_MODEL = set(LIBRARIES) - {"openai_agents_responses"}
# The refusal's HTTP status or an error type that names it (AI SDK 6: AI_APICallError for any
# status; Langfuse records no exception)
SENDS_RATE_LIMIT = set(LIBRARIES) - {"langfuse", "vercel_ai"}
# The Agents SDK's generation span records neither an exception nor an error type (its status
# message quotes the status, which is read); nor does Langfuse's (its status message too, on
# the Responses API).
SENDS_ERROR_TYPE = set(LIBRARIES) - {"openai_agents", "openai_agents_responses", "langfuse_responses"}
# What a library itself gets wrong, which no reading can restore (interop/README.md): the
# counts its spans hold, from the server's.
MISREPORTED = {
    # OpenLLMetry adds the placeholder output token of Anthropic's message_start to the total
    ("anthropic_traceloop", "stream-acme"): lambda call: {"output_tokens": call["output_tokens"] + 1},
    # OpenLIT's Anthropic stream records no cache reads or writes: its input is the uncached part
    ("anthropic_openlit", "stream-acme"): lambda call: {
        "input_tokens": call["input_tokens"] - call["cached_tokens"] - call["cache_write_tokens"],
        "cached_tokens": 0, "cache_write_tokens": 0},
    # its failed calls' spans carry no attribute at all (read from their names), so no tenant
    **{("anthropic_openlit", label): lambda call: {"tenant": ""} for label in ("error500-acme", "error429-acme")},
}

COLUMNS = {  # llm_requests column -> request_fields key
    "Model": "model", "Provider": "provider", "Operation": "operation", "Tenant": "tenant", "Feature": "feature",
    "Team": "team", "UserId": "user", "SessionId": "session", "InputTokens": "input_tokens",
    "OutputTokens": "output_tokens", "CachedInputTokens": "cache_read_tokens",
    "CacheWriteInputTokens": "cache_write_tokens", "ReasoningOutputTokens": "reasoning_tokens",
    "TtftSeconds": "ttft", "TtftSource": "ttft_source", "TpotSeconds": "tpot", "Streaming": "streaming",
    "ModalityTokens": "modality_tokens",
    "ClientCostUsd": "client_cost", "IsError": "is_error", "ErrorType": "error_type",
    "HttpStatusCode": "http_status", "Dialect": "dialect", "RequestModel": "request_model",
}


def test_the_migration_holds_the_current_rendering_of_the_dialect_table() -> None:
    text = (MIGRATIONS_DIR / dialects.VIEW_MIGRATION).read_text()
    assert dialects.llm_requests_view_sql() in text, "re-render: python -m collector.dialects"


@pytest.fixture(params=["python", "engine"])
def stored(request, make_settings, store, tmp_path):
    """library -> its capture stored through the real receiver; yields (store, load). The
    suite's migrated databases are handed on emptied (conftest), so a test migrates nothing."""
    settings = make_settings(collector={"trace_mapping": request.param}, data_dir=str(tmp_path / "data"))
    collector = Collector(settings, store)
    collector.start()

    def load(library: str) -> None:
        replay(library, f"http://127.0.0.1:{collector.http.port}")
        assert collector.writer.force_flush(30)

    yield store, load
    collector.shutdown()


def _requests(store: Store) -> dict[str, dict]:
    names = list(COLUMNS)
    rows = store.client().query(f"SELECT SpanId, {', '.join(names)} FROM llm_requests").result_rows
    return {row[0]: dict(zip(names, row[1:])) for row in rows}


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_capture_reads_as_its_library_sent_it(stored, library: str, make_settings) -> None:
    """The capture through the real receiver once per span mapping, and every check on it."""
    store, load = stored
    load(library)
    _the_view_and_the_python_reading_agree_on_every_span(store, library)
    _every_call_is_one_row_with_what_the_server_returned(store, library)
    if library in SENDS_RATE_LIMIT and "rag" not in library:
        _a_refused_call_is_read_as_rate_limited(store, library)
    if library in ANTHROPIC:
        _an_anthropic_call_costs_what_anthropic_bills_for_it(store, library, make_settings())


def _the_view_and_the_python_reading_agree_on_every_span(store: Store, library: str) -> None:
    spans, rows = span_views(store), _requests(store)
    python = dialects.requests(spans)  # the capture's one export: one insert, one block
    assert set(python) == set(rows), "the same spans are requests"
    for sid, fields in python.items():
        row = rows[sid]
        for column, key in COLUMNS.items():
            expected, got = fields[key], row[column]
            if isinstance(expected, float) and got is not None:
                assert got == pytest.approx(expected, rel=1e-9, abs=1e-9), (library, column)
            else:
                assert got == expected, (library, column, sid)


def _a_refused_call_is_read_as_rate_limited(store: Store, library: str) -> None:
    """The 429 as the reports count it (analytics.sql.RATE_LIMITED), whatever says so."""
    rows = store.client().query(f"SELECT Model, {RATE_LIMITED.sql}, ErrorType, HttpStatusCode "
                                "FROM llm_requests WHERE IsError")
    # every attempt at the refused call (Strands retries it), none at the failed one
    if library in SENDS_FAILED_MODEL:
        assert sorted({(model, bool(limited)) for model, limited, _, _ in rows.result_rows}) == [
            ("fail-429", True), ("fail-500", False)], rows.result_rows
    else:
        assert sorted({(status, bool(limited)) for _, limited, _, status in rows.result_rows}) == [
            (429, True), (500, False)], rows.result_rows
    if library in SENDS_ERROR_TYPE:
        assert all(error_type for _, _, error_type, _ in rows.result_rows), "each failure has its type"


def _every_call_is_one_row_with_what_the_server_returned(store: Store, library: str) -> None:
    manifest = json.loads((CAPTURES / library / "manifest.json").read_text())
    rows = list(_requests(store).values())
    calls = manifest["calls"]
    # one row per HTTP request the server answered (a library that retries a 429 itself,
    # as Strands does, makes one call of several attempts)
    assert len(rows) == sum(call["http_requests"] for call in calls), "one row per LLM request"
    for call in calls:
        call = {**call, **MISREPORTED.get((library, call["label"]), dict)(call)}
        if call["kind"].startswith("error"):
            attempts = ([r for r in rows if r["Model"] == call["request_model"]] if library in SENDS_FAILED_MODEL
                        else [r for r in rows if r["IsError"] and r["HttpStatusCode"] == call["http_status"]])
            assert len(attempts) == call["http_requests"], (library, call["label"])
            for row in attempts:
                assert row["IsError"] and row["Tenant"] == call["tenant"], (library, call["label"])
                if library in SENDS_REQUEST_MODEL:
                    assert row["RequestModel"] == call["request_model"], (library, call["label"])
            continue
        [row] = [r for r in rows if r["InputTokens"] == call["input_tokens"] and not r["IsError"]]
        what = (library, call["label"])
        if library in SENDS_REQUEST_MODEL:
            assert row["RequestModel"] == call["request_model"], what
        assert row["OutputTokens"] == call["output_tokens"], what
        assert row["Tenant"] == call["tenant"], what
        assert row["Operation"] == ("embeddings" if call["kind"] == "embedding" else "chat"), what
        if library in SENDS_CACHED and call["kind"] != "embedding":
            assert row["CachedInputTokens"] == call["cached_tokens"], what
        if "cache_write_tokens" in call:  # Anthropic's: the writes are part of the input
            assert row["CacheWriteInputTokens"] == call["cache_write_tokens"], what
        if library in SENDS_REASONING and call["kind"] != "embedding":
            assert row["ReasoningOutputTokens"] == call["reasoning_tokens"], what
        if call["kind"] == "stream" and library in SENDS_TTFT:
            # the server's first chunk, as late as the client saw it, never later than the call
            assert call["server_time_to_first_chunk_ms"] / 1000 * 0.9 <= row["TtftSeconds"], what
            assert row["TtftSeconds"] <= call["client_outcome"]["client_duration_ms"] / 1000, what
            assert row["TtftSource"], what
        elif call["kind"] != "stream" and library in ("openlit", "openlit_responses"):
            assert row["TtftSeconds"] is None, "OpenLIT's TTFT on a non-streamed call is the whole call"


def test_the_configs_default_business_unit_keys_are_the_dialect_tables() -> None:
    from servelens.core.config import AttributesConfig

    defaults = AttributesConfig()
    for unit in ("tenant", "feature", "team"):
        assert tuple(getattr(defaults, unit)) == dialects.UNIT_KEYS[unit]


@pytest.mark.parametrize(("value", "expected"), [
    ('"acme"', "acme"), ("acme", "acme"), ('"', '"'), ('"a"b"', '"a"b"'), ('""', ""),
])
def test_a_json_encoded_unit_value_is_decoded(value: str, expected: str) -> None:
    span = dialects.SpanView({"langfuse.trace.metadata.tenant": value}, {}, 0)
    assert dialects.unit_value(span, dialects.UNIT_KEYS["tenant"]) == expected


def test_a_unit_key_inside_a_json_attribute() -> None:
    span = dialects.SpanView({"metadata": '{"tenant": "acme", "n": 3}'}, {}, 0)
    assert dialects.unit_value(span, ("metadata.tenant",)) == "acme"
    assert dialects.unit_value(span, ("metadata.n",)) == "3"
    assert dialects.unit_value(dialects.SpanView({"metadata": "not json"}, {}, 0), ("metadata.tenant",)) == ""


def test_a_failed_call_with_no_attribute_is_read_from_its_name_only_there(store) -> None:
    # OpenLIT's Anthropic error spans (anthropic_openlit's capture reads them): an OpenLIT
    # scope, an error status, a name as the conventions write it. Not a succeeded span so
    # named, another scope's, or another name.
    spans = [("openlit.instrumentation.anthropic", "STATUS_CODE_ERROR", "chat fail-429"),
             ("openlit.instrumentation.anthropic", "STATUS_CODE_OK", "chat ok-model"),
             ("opentelemetry.instrumentation.httpx", "STATUS_CODE_ERROR", "chat other-scope"),
             ("openlit.instrumentation.anthropic", "STATUS_CODE_ERROR", "POST"),
             ("openlit.instrumentation.openai", "STATUS_CODE_ERROR", "embeddings text-embedding-3-small")]
    values = ", ".join(f"(now64(9), 't{i}', 's{i}', '', '{name}', 'SPAN_KIND_CLIENT', 'svc', '{scope}', map(), 1000000, "
                       f"'{status}', 'RateLimitError: Error code: 429 - rate limited')"
                       for i, (scope, status, name) in enumerate(spans))
    store.client().command("INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, "
                           f"ServiceName, ScopeName, SpanAttributes, Duration, StatusCode, StatusMessage) VALUES {values}")
    rows = store.client().query("SELECT SpanId, Operation, Model, RequestModel, HttpStatusCode, IsError "
                                "FROM llm_requests ORDER BY SpanId").result_rows
    assert rows == [("s0", "chat", "fail-429", "fail-429", 429, True),
                    ("s4", "embeddings", "text-embedding-3-small", "text-embedding-3-small", 429, True)]
    python = dialects.requests(span_views(store))
    assert {sid: (f["operation"], f["model"], f["http_status"]) for sid, f in python.items()} == {
        "s0": ("chat", "fail-429", 429), "s4": ("embeddings", "text-embedding-3-small", 429)}


def test_openinference_and_langfuse_stages_are_pipeline_stages(collector, otlp_http, store) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces")))
    tracer = provider.get_tracer("stages")
    with tracer.start_as_current_span("query", attributes={"openinference.span.kind": "CHAIN"}):
        for name, attrs in (("retrieve", {"openinference.span.kind": "RETRIEVER"}),
                            ("rerank", {"openinference.span.kind": "RERANKER"}),
                            ("search_tool", {"openinference.span.kind": "TOOL"}),
                            ("lookup", {"langfuse.observation.type": "tool"}),
                            ("plain", {"openinference.span.kind": "CHAIN"})):
            with tracer.start_as_current_span(name, attributes=attrs):
                pass
    provider.shutdown()
    assert collector.writer.force_flush(30)
    stages = sorted(store.client().query("SELECT Stage FROM stage_spans").result_rows)
    assert stages == [("retrieval",), ("retrieval",), ("root",), ("tool",), ("tool",)]


def _an_anthropic_call_costs_what_anthropic_bills_for_it(store: Store, library: str, settings) -> None:
    """Prompt caching priced as Anthropic bills it (genai-prices' rates): the uncached input,
    the cache reads and the cache writes each at their own rate, whichever split the library
    sent (OpenLIT sends Anthropic's, the others the whole prompt with its parts)."""
    from datetime import datetime, timedelta, timezone

    from genai_prices import Usage, calc_price

    from servelens.analytics.reports import registry

    manifest = json.loads((CAPTURES / library / "manifest.json").read_text())
    billed = 0.0
    for call in manifest["calls"]:
        if call["kind"].startswith("error"):
            continue
        call = {**call, **MISREPORTED.get((library, call["label"]), dict)(call)}
        usage = Usage(input_tokens=call["input_tokens"], cache_read_tokens=call["cached_tokens"],
                      cache_write_tokens=call["cache_write_tokens"], output_tokens=call["output_tokens"])
        billed += float(calc_price(usage, model_ref=call["response_model"], provider_id="anthropic").total_price)
    now = datetime.now(timezone.utc)
    report = registry.run("cost", store, settings, {
        "since": (now - timedelta(days=2)).isoformat(), "until": (now + timedelta(hours=1)).isoformat(), "by": "model"})
    [row] = [r for r in report["rows"] if r["model"] == "claude-haiku-4-5-20251001"]
    assert row["cost_usd"] == pytest.approx(billed, abs=2e-6), (library, row)


def test_a_call_a_detached_framework_span_traced_is_read_once_where_the_framework_traced_it(store) -> None:
    # OpenInference's LangChain span and the OpenAI SDK's span of the same call, in two traces
    # (langchain_openinference's capture): the LangChain one is the request. An SDK span of
    # another call (other tokens, or another service) stays a request of its own.
    lc, sdk = "openinference.instrumentation.langchain", "openinference.instrumentation.openai"
    spans = [("t1", "s1", "svc", lc, 43, 13), ("t2", "s2", "svc", sdk, 43, 13),  # one call, twice
             ("t3", "s3", "svc", sdk, 43, 14),  # another call of the service
             ("t4", "s4", "other", sdk, 43, 13)]  # the same counts in another service
    values = ", ".join(
        f"(now64(9), '{t}', '{s}', '', 'ChatOpenAI', 'SPAN_KIND_INTERNAL', '{svc}', '{scope}', "
        f"map('openinference.span.kind', 'LLM', 'llm.model_name', 'gpt-4o-mini', 'llm.token_count.prompt', '{i}', "
        f"'llm.token_count.completion', '{o}', 'llm.invocation_parameters', '{{\"model\": \"gpt-4o-mini\"}}'), "
        f"1000000, 'STATUS_CODE_OK', '')" for t, s, svc, scope, i, o in spans)
    store.client().command("INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, "
                           f"ServiceName, ScopeName, SpanAttributes, Duration, StatusCode, StatusMessage) VALUES {values}")
    rows = store.client().query("SELECT SpanId FROM llm_requests ORDER BY SpanId").result_rows
    assert rows == [("s1",), ("s3",), ("s4",)]
    assert sorted(dialects.requests(span_views(store))) == ["s1", "s3", "s4"]
