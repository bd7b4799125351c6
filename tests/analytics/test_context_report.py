"""The `context` report on the real embedded ClickHouse.

- Real libraries: the retrieval-augmented captures of OpenInference (its RETRIEVER span's
  documents, flattened messages) and OpenLLMetry (GenAI semconv gen_ai.input.messages),
  replayed into the running receiver. The split is checked against what the prompt held,
  computed here from the manifest's messages by the report's stated rule.
- Measured parts: an application's own token counts per part, on spans the real
  OpenTelemetry SDK exports, with the remainder as `other`, priced at the unit's input
  price; the size classes with latency and the pass rate of evaluation events.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from servelens.analytics.query import QueryError
from servelens.analytics.reports import registry
from tests.collector.captures import CAPTURES, replay

pytestmark = pytest.mark.integration
S = 10**9
PRICES = {"models": [{"model": "m-ctx", "input_per_mtok": 2.0, "output_per_mtok": 8.0}], "catalog": "none"}


def _rows(store, settings, **params) -> list[dict]:
    now = datetime.now(timezone.utc)
    return registry.run("context", store, settings, {"since": (now - timedelta(hours=3)).isoformat(),
                                                     "until": now.isoformat(), **params})["rows"]


def _expected_chars(call: dict, with_documents: bool) -> dict[str, int]:
    """What each part of the call's prompt held, in characters, by the report's rule: system
    by role; tool results by role; the last user message is the question; the rest history;
    retrieved passages (where the library recorded them) moved out of the question."""
    messages = call["messages"]
    chars = {"system": 0, "history": 0, "tool_results": 0, "question": 0, "retrieved": 0}
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    for i, m in enumerate(messages):
        n = len(m["content"] or "")
        part = ("system" if m["role"] == "system" else "tool_results" if m["role"] == "tool"
                else "question" if i == last_user else "history")
        chars[part] += n
    if with_documents:
        retrieved = sum(len(p["content"]) for p in call["passages"])
        chars["retrieved"], chars["question"] = retrieved, chars["question"] - retrieved
    return chars


@pytest.mark.parametrize("library,documents", [("openinference_rag", True), ("traceloop_rag", False)])
def test_a_real_librarys_prompt_is_split_by_role_and_retrieved_passages(collector, settings, store,
                                                                          library, documents) -> None:
    replay(library, f"http://127.0.0.1:{collector.http.port}")
    assert collector.writer.force_flush(30)
    [call] = json.loads((CAPTURES / library / "manifest.json").read_text())["calls"]
    chars = _expected_chars(call, documents)
    total = sum(chars.values())
    parts = {r["part"]: r for r in _rows(store, settings) if r["kind"] == "part"}
    expected = {p: call["input_tokens"] * n / total for p, n in chars.items() if n}
    assert {p: r["tokens"] for p, r in parts.items()} == pytest.approx(expected, rel=1e-9)
    assert sum(r["token_share"] for r in parts.values()) == pytest.approx(1.0)
    assert all((r["requests"], r["covered"], r["measured"]) == (1, 1, 0) for r in parts.values())
    [size] = [r for r in _rows(store, settings) if r["kind"] == "size"]
    assert size["key"] == "< 1k" and size["requests"] == 1
    assert size["retrieved_share"] == pytest.approx(chars["retrieved"] / total)


class _App:
    """An application that counts its own context, exporting through the real SDK."""

    def __init__(self, otlp_http: str) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": "support-bot"}))
        self.provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces")))
        self.tracer = self.provider.get_tracer("support-bot")

    def call(self, start_ns: int, input_tokens: int, latency_s: float, parts: dict[str, int],
             passed: bool | None = None) -> None:
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
                      "gen_ai.request.model": "m-ctx", "gen_ai.response.model": "m-ctx",
                      "gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": 100,
                      **{f"app.context.{k}_tokens": v for k, v in parts.items()}}
        span = self.tracer.start_span("chat m-ctx", kind=SpanKind.CLIENT, attributes=attributes, start_time=start_ns)
        if passed is not None:
            span.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "answer_correct",
                                                        "gen_ai.evaluation.score.label": "pass" if passed else "fail"},
                           timestamp=start_ns + int(latency_s * S))
        span.end(end_time=start_ns + int(latency_s * S))


def test_measured_parts_are_priced_and_sizes_show_latency_and_pass_rate(collector, make_settings, store) -> None:
    app = _App(f"http://127.0.0.1:{collector.http.port}")
    t0 = time.time_ns() - 1800 * S
    # 40 small prompts (800 tokens: 300 retrieved, 100 system, 400 other), 3 in 4 pass, 1 s;
    # 40 large ones (20,000: 18,000 retrieved, 500 system, 1,500 other), 1 in 4 pass, 4 s.
    for i in range(40):
        app.call(t0 + i * S, 800, 1.0, {"retrieved": 300, "system": 100}, passed=i % 4 != 0)
        app.call(t0 + (100 + i) * S, 20_000, 4.0, {"retrieved": 18_000, "system": 500}, passed=i % 4 == 0)
    app.provider.shutdown()
    assert collector.writer.force_flush(30)
    settings = make_settings(pricing=PRICES)
    rows = _rows(store, settings)
    parts = {r["part"]: r for r in rows if r["kind"] == "part"}
    assert set(parts) == {"retrieved", "system", "other"}
    covered_tokens = 40 * (800 + 20_000)
    for part, tokens in {"retrieved": 40 * 18_300, "system": 40 * 600, "other": 40 * 1_900}.items():
        r = parts[part]
        assert (r["key"], r["requests"], r["covered"], r["measured"]) == ("support-bot", 80, 80, 80)
        assert r["tokens"] == pytest.approx(tokens) and r["token_share"] == pytest.approx(tokens / covered_tokens)
        assert r["cost_usd"] == pytest.approx(tokens * 2.0 / 1e6)  # $2 per million input tokens
    whole = 80 * 100 * 8.0 / 1e6 + covered_tokens * 2.0 / 1e6  # output and input of the 80 requests
    assert parts["retrieved"]["cost_share"] == pytest.approx(40 * 18_300 * 2.0 / 1e6 / whole)
    sizes = {r["key"]: r for r in rows if r["kind"] == "size"}
    assert set(sizes) == {"< 1k", "16k-64k"}
    small, large = sizes["< 1k"], sizes["16k-64k"]
    assert (small["requests"], small["evaluations"], small["pass_rate"]) == (40, 40, 0.75)
    assert (large["requests"], large["evaluations"], large["pass_rate"]) == (40, 40, 0.25)
    assert small["latency_p50_ms"] == pytest.approx(1000, rel=1e-6)
    assert large["latency_p99_ms"] == pytest.approx(4000, rel=1e-6)
    assert small["retrieved_share"] == pytest.approx(300 / 800) and large["retrieved_share"] == pytest.approx(0.9)


def test_requests_without_a_breakdown_are_counted_and_their_split_is_unknown(collector, settings, store) -> None:
    app = _App(f"http://127.0.0.1:{collector.http.port}")
    t0 = time.time_ns() - 1800 * S
    for i in range(5):
        app.call(t0 + i * S, 500, 0.5, {})
    app.provider.shutdown()
    assert collector.writer.force_flush(30)
    [row] = [r for r in _rows(store, settings) if r["kind"] == "part"]
    assert (row["key"], row["part"], row["requests"], row["covered"], row["tokens"]) == ("support-bot", None, 5, 0, None)
    assert "split unknown" in row["note"]
    with pytest.raises(QueryError):
        _rows(store, settings, by="no-such-key")
