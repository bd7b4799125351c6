"""The `reliability` report: errors, retries, amplification, fallbacks, rate limiting.

Integration cases send spans through the real OpenTelemetry SDK (OTLP/HTTP,
one export per send, flushed: the receiver answers once the rows are committed) with explicit
start/end times, and compare every field with values computed here from what was sent
(numpy for the fallback p99).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
import polars as pl
import pytest
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode
from polars.testing import assert_frame_equal

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports import reliability
from servelens.analytics.reports.registry import to_records

S = 10**9
MS = 10**6
SINCE_NS = (time.time_ns() // S - 3600) * S
UNTIL_NS = SINCE_NS + 600 * S
LLAMA = "meta-llama/Llama-3.1-70B-Instruct"
COLUMNS = ["service", "requests", "error_rate", "retry_rate", "amplification", "fallback_rate",
           "fallback_latency_p99_ms", "primary_budget_ms", "fallback_over_budget", "rate_limited"]


def at(ns: int) -> datetime:
    return datetime.fromtimestamp(ns // S, tz=timezone.utc)


WINDOW = ReportQuery(at(SINCE_NS), at(UNTIL_NS))


@dataclass
class Attempt:
    """One LLM attempt and the SPEC 3 attributes that decide its reliability fields."""
    model: str = "gpt-4o-mini"
    latency_ms: int = 500
    deployment: str | None = None
    retry: int = 0
    fallback: bool | None = None
    status_code: int | None = None
    error_type: str | None = None
    span_error: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def attrs(self) -> dict[str, Any]:
        a: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": self.model,
                             "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 20,
                             "app.retry.attempt": self.retry, **self.extra}
        optional = {"app.deployment": self.deployment, "app.fallback": self.fallback,
                    "http.response.status_code": self.status_code, "error.type": self.error_type}
        a.update({k: v for k, v in optional.items() if v is not None})
        return a

    @property
    def is_error(self) -> bool:
        return self.span_error or bool(self.error_type)


@pytest.fixture
def send(otlp_http: str):
    """send(service, [Attempt...]): one finished span each, 1 s apart from the window start."""
    providers: dict[str, TracerProvider] = {}

    def _send(service: str, attempts: list[Attempt]) -> None:
        if service not in providers:
            providers[service] = TracerProvider(resource=Resource.create({"service.name": service}))
            providers[service].add_span_processor(BatchSpanProcessor(
                OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces"), schedule_delay_millis=60_000))
        tracer = providers[service].get_tracer("test.reliability")
        for i, a in enumerate(attempts):
            start = SINCE_NS + (i + 1) * S
            span = tracer.start_span(f"chat {a.model}", context=Context(), attributes=a.attrs(), start_time=start)
            if a.span_error:
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=start + a.latency_ms * MS)
        # One OTLP request for the lot (chDB inserts dominate test time); it returns once the
        # receiver has answered, i.e. once the rows are committed.
        assert providers[service].force_flush(30_000)

    yield _send
    for p in providers.values():
        p.shutdown()


def deployment(name: str, primary: str | None = None, total: str | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "gpus": {"count": 2}, "gpu_hourly_usd": 2.5}
    if primary:
        d["primary_model"] = primary
    if total:
        d["budgets"] = {"total": total, "queue": "200ms"}
    return d


def rows_by(frame: pl.DataFrame, key: str = "service") -> dict[str, dict[str, Any]]:
    assert frame.columns == [key, *COLUMNS[1:]]
    records = to_records(frame)
    assert json.loads(json.dumps(records, allow_nan=False)) == records  # the API's JSON, no NaN
    return {r[key]: r for r in records}


@pytest.mark.integration
def test_no_retries_no_fallbacks(send, store, settings) -> None:
    attempts = [Attempt() for _ in range(6)] + [Attempt(span_error=True), Attempt(error_type="timeout")]
    send("chat-api", attempts)

    row = rows_by(reliability.report(store, settings, WINDOW))["chat-api"]
    assert row == {
        "service": "chat-api", "requests": 8, "error_rate": 2 / 8, "retry_rate": 0.0, "amplification": 1.0,
        "fallback_rate": 0.0, "fallback_latency_p99_ms": None, "primary_budget_ms": None,
        "fallback_over_budget": None, "rate_limited": 0.0,
    }


@pytest.mark.integration
def test_retries_amplify_and_rate_limits_are_counted(send, store, settings) -> None:
    # 5 originals; 4 retries (two of one request, app.retry.attempt 1 and 2). Rate limits come
    # as an HTTP 429, an error.type of "429", OpenAI's RateLimitError and a rate_limit_* code;
    # a 503 and a plain error are errors but not rate limits.
    attempts = [
        Attempt(status_code=429, error_type="429"), Attempt(retry=1),
        Attempt(status_code=429), Attempt(retry=1, error_type="openai.RateLimitError"), Attempt(retry=2),
        Attempt(error_type="rate_limit_exceeded"), Attempt(retry=1),
        Attempt(status_code=503, error_type="503"),
        Attempt(span_error=True),
    ]
    send("chat-api", attempts)
    # Another service only retried inside the window (its originals came before): no base.
    send("late-api", [Attempt(retry=1), Attempt(retry=2)])

    rows = rows_by(reliability.report(store, settings, WINDOW))
    assert list(rows) == ["chat-api", "late-api"]
    n = len(attempts)
    originals = sum(a.retry == 0 for a in attempts)
    limited = sum(a.status_code == 429 or "429" in (a.error_type or "") or "rate" in (a.error_type or "").lower()
                  for a in attempts)
    assert (originals, limited) == (5, 4)
    assert rows["chat-api"] == {
        "service": "chat-api", "requests": n, "error_rate": sum(a.is_error for a in attempts) / n,
        "retry_rate": sum(a.retry > 0 for a in attempts) / n, "amplification": n / originals,
        "fallback_rate": 0.0, "fallback_latency_p99_ms": None, "primary_budget_ms": None,
        "fallback_over_budget": None, "rate_limited": limited / n,
    }
    assert rows["late-api"]["amplification"] is None and rows["late-api"]["retry_rate"] == 1.0


@pytest.mark.integration
def test_fallback_by_model_mismatch_against_the_primary_budget(send, store, make_settings) -> None:
    settings = make_settings(deployments=[
        deployment("llama-prod", primary=LLAMA, total="4s"),
        deployment("mistral-prod", primary="mistral-large", total="1500ms"),
        deployment("no-budget", primary="qwen-72b"),
    ])
    # chat-api runs mostly on llama-prod. Fallbacks: a smaller model served by the same
    # deployment (model != primary_model), and an API model flagged app.fallback = true
    # on a deployment that is not configured. A request without a model is not judged.
    chat = ([Attempt(LLAMA, 900, "llama-prod") for _ in range(6)]
            + [Attempt("meta-llama/Llama-3.1-8B-Instruct", ms, "llama-prod") for ms in (3000, 5200)]
            + [Attempt("gpt-4o", 4700, "openai", fallback=True)]
            + [Attempt("", 800, "llama-prod", extra={"gen_ai.usage.input_tokens": 10})])
    # search-api mostly on mistral-prod: its one fallback (flag only, primary model) is fast.
    search = [Attempt("mistral-large", 300, "mistral-prod") for _ in range(3)] \
        + [Attempt("mistral-large", 1200, "mistral-prod", fallback=True)] + [Attempt("gpt-4o", 200, "openai")]
    # batch-api on a deployment without budgets: falls back, no budget to compare with.
    batch = [Attempt("qwen-72b", 2000, "no-budget"), Attempt("qwen-7b", 2500, "no-budget")]
    send("chat-api", chat)
    send("search-api", search)
    send("batch-api", batch)

    rows = rows_by(reliability.report(store, settings, WINDOW))
    chat_fb = np.array([3000, 5200, 4700], dtype=float)
    assert rows["chat-api"]["fallback_rate"] == 3 / len(chat)
    assert rows["chat-api"]["fallback_latency_p99_ms"] == pytest.approx(np.percentile(chat_fb, 99), rel=1e-9)
    assert rows["chat-api"]["primary_budget_ms"] == 4000.0
    assert rows["chat-api"]["fallback_over_budget"] is True  # p99 ≈ 5190 ms > 4 s
    assert rows["chat-api"]["amplification"] == 1.0 and rows["chat-api"]["error_rate"] == 0.0

    assert rows["search-api"]["fallback_rate"] == 1 / 5
    assert rows["search-api"]["fallback_latency_p99_ms"] == pytest.approx(1200.0)
    assert rows["search-api"]["primary_budget_ms"] == 1500.0
    assert rows["search-api"]["fallback_over_budget"] is False

    assert rows["batch-api"]["fallback_rate"] == 1 / 2
    assert rows["batch-api"]["fallback_latency_p99_ms"] == pytest.approx(2500.0)
    assert rows["batch-api"]["primary_budget_ms"] is None
    assert rows["batch-api"]["fallback_over_budget"] is None

    # Without deployments configured, only the explicit flags are fallbacks.
    plain = rows_by(reliability.report(store, make_settings(), WINDOW))
    assert plain["chat-api"]["fallback_rate"] == 1 / len(chat)
    assert plain["chat-api"]["fallback_latency_p99_ms"] == pytest.approx(4700.0)
    assert plain["chat-api"]["primary_budget_ms"] is None

    # By deployment: each deployment is judged against its own budget.
    by_dep = rows_by(reliability.report(store, settings, ReportQuery(WINDOW.since, WINDOW.until, by="deployment")),
                     "deployment")
    llama_fb = np.array([3000, 5200], dtype=float)
    assert by_dep["llama-prod"]["requests"] == 9
    assert by_dep["llama-prod"]["fallback_latency_p99_ms"] == pytest.approx(np.percentile(llama_fb, 99), rel=1e-9)
    assert by_dep["llama-prod"]["primary_budget_ms"] == 4000.0
    assert by_dep["openai"]["primary_budget_ms"] is None and by_dep["openai"]["fallback_rate"] == 1 / 2


@pytest.mark.integration
def test_empty_window_is_an_empty_frame(store, settings) -> None:
    frame = reliability.report(store, settings, WINDOW)
    assert frame.height == 0 and frame.columns == COLUMNS


def test_primary_budget_is_the_busiest_deployments_with_ties_by_name() -> None:
    mix = pl.LazyFrame({"key": ["a", "a", "b", "b", "c"], "deployment": ["x", "y", "y", "x", "z"],
                        "requests": [2, 5, 3, 3, 1]})
    budgets = pl.LazyFrame({"deployment": ["x", "y"], "primary_budget_ms": [100.0, 200.0]})
    got = reliability.primary_budgets(mix, budgets).sort("key").collect()
    want = pl.DataFrame({"key": ["a", "b", "c"], "primary_budget_ms": [200.0, 100.0, None]})
    assert_frame_equal(got, want)
