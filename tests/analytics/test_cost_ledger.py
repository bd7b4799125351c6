"""The cost report against a ledger computed here, in plain Python, from the same traffic.

Traffic goes through the real path: OTel SDK spans (explicit start/end times in the last
hours) -> OTLPSpanExporter over HTTP -> the collector -> ClickHouse -> analytics.reports.run.
The ledger knows each request's true model, tokens and flags, and prices them with its
own reading of SPEC 4 (exact name, else first full-match regex; latest effective_from at
or before the request; cached input at the cached price; unknown -> null).
"""

from __future__ import annotations

import random
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from servelens.analytics.reports.registry import run

pytestmark = pytest.mark.integration

NOW = datetime.now(timezone.utc).replace(second=0, microsecond=0)
SINCE = NOW - timedelta(hours=6)
UNTIL = NOW + timedelta(minutes=1)
WINDOW = {"since": SINCE.isoformat(), "until": UNTIL.isoformat()}
PRICE_CHANGE = NOW - timedelta(hours=3)  # gpt-4o gets cheaper here
LAUNCH = NOW - timedelta(hours=1)  # new-model has no price before this

PRICING = {"models": [
    {"model": "gpt-4o-mini", "input_per_mtok": 0.15, "output_per_mtok": 0.60, "cached_input_per_mtok": 0.075},
    {"model": "gpt-4o", "match": r"gpt-4o(-\d{4}-\d{2}-\d{2})?", "input_per_mtok": 2.5, "output_per_mtok": 10,
     "effective_from": "2025-01-01"},
    {"model": "gpt-4o", "input_per_mtok": 2.0, "output_per_mtok": 8.0, "cached_input_per_mtok": 1.0,
     "effective_from": PRICE_CHANGE.isoformat()},
    {"model": "gpt-generic", "match": r"gpt-.*", "input_per_mtok": 1.0, "output_per_mtok": 3.0},
    {"model": "new-model", "input_per_mtok": 0.5, "output_per_mtok": 1.5, "effective_from": LAUNCH.isoformat()},
]}


# --- traffic --------------------------------------------------------------------------------

@dataclass
class LlmRequest:
    """One request's truth, and how its span spells it."""

    start: datetime
    latency_s: float
    model: str  # the model that served it (what prices it)
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    tenant: str = ""
    feature: str = ""
    service: str = "chat-api"
    retry: int = 0
    error: bool = False
    ttft_s: float | None = None
    request_model: str | None = None  # when the span also names a different requested model
    spelling: int = 0  # which of the attribute spellings to use (current / deprecated)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def start_ns(self) -> int:
        return _ns(self.start)

    @property
    def end_ns(self) -> int:
        return self.start_ns + round(self.latency_s * 1e9)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9  # what the span's Duration says

    def attributes(self) -> dict[str, Any]:
        s = self.spelling
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai"}
        if self.request_model:
            attrs["gen_ai.request.model"] = self.request_model
            attrs["gen_ai.response.model"] = self.model
        else:
            attrs["gen_ai.request.model"] = self.model
        if s % 2 == 0:
            attrs.update({"gen_ai.usage.input_tokens": self.input_tokens, "gen_ai.usage.output_tokens": self.output_tokens})
        else:
            attrs.update({"gen_ai.usage.prompt_tokens": self.input_tokens,
                          "gen_ai.usage.completion_tokens": self.output_tokens})
        if self.cached_tokens:
            cached_key = ("gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens",
                          "gen_ai.usage.cached_tokens")[s % 3]
            attrs[cached_key] = self.cached_tokens
        if self.tenant:
            attrs["app.tenant" if s % 2 == 0 else "tenant.id"] = self.tenant
        if self.feature:
            attrs["app.feature"] = self.feature
        if self.retry:
            attrs["http.request.resend_count" if s % 2 == 0 else "app.retry.attempt"] = self.retry
        if self.error and s % 2 == 1:
            attrs["error.type"] = "429"
        if self.ttft_s is not None:
            attrs["gen_ai.response.time_to_first_chunk" if s % 2 == 0 else "gen_ai.latency.time_to_first_token"] = self.ttft_s
        attrs.update(self.extra)
        return attrs

    @property
    def error_status(self) -> bool:
        return self.error and self.spelling % 2 == 0  # the other spelling uses error.type


def _ns(dt: datetime) -> int:
    return int(dt.timestamp()) * 10**9 + dt.microsecond * 1000


@dataclass
class PlainSpan:
    """A span that is not an LLM request (must not be counted)."""

    start: datetime
    name: str
    attributes: dict[str, Any]
    service: str = "chat-api"


def send(otlp_http: str, items: Iterable[LlmRequest | PlainSpan], headers: dict[str, str] | None = None,
         senders: int = 8, batched: bool = False) -> int:
    """Export each item as one span (SimpleSpanProcessor: one OTLP/HTTP export per span),
    from `senders` concurrent clients, as a fleet of services would; returns how many.
    `batched`: each client's spans of a service in one export (BatchSpanProcessor), where
    the spans are only the scene (an export is an insert: ~0.1 s each in the stored mode)."""
    items = list(items)
    chunks = [items[i::senders] for i in range(senders)]
    with ThreadPoolExecutor(senders) as pool:
        list(pool.map(lambda chunk: _send_one_client(otlp_http, chunk, headers, batched), chunks))
    return len(items)


def _send_one_client(otlp_http: str, items: list[LlmRequest | PlainSpan], headers: dict[str, str] | None,
                     batched: bool = False) -> None:
    providers: dict[str, TracerProvider] = {}
    for item in items:
        if item.service not in providers:
            provider = TracerProvider(resource=Resource.create({"service.name": item.service}))
            exporter = OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces", headers=headers, timeout=10)
            provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=len(items),
                                                           max_queue_size=max(len(items), 2048),
                                                           schedule_delay_millis=3_600_000)
                                        if batched else SimpleSpanProcessor(exporter))
            providers[item.service] = provider
        tracer = providers[item.service].get_tracer("servelens-tests")
        if isinstance(item, LlmRequest):
            span = tracer.start_span(f"chat {item.model}", kind=SpanKind.CLIENT, start_time=item.start_ns,
                                     attributes=item.attributes())
            if item.error_status:
                span.set_status(Status(StatusCode.ERROR, "upstream failed"))
            span.end(end_time=item.end_ns)
        else:
            start = _ns(item.start)
            tracer.start_span(item.name, start_time=start, attributes=item.attributes).end(end_time=start + 10**8)
    for provider in providers.values():
        provider.shutdown()


def stored_spans(store) -> int:
    return store.client().query("SELECT count() FROM otel_traces").first_row[0]


# --- the ledger -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    model: str
    match: str | None
    input: float
    output: float
    cached: float | None
    effective_from: datetime | None


def _catalog() -> list[Entry]:
    out = []
    for e in PRICING["models"]:
        eff = e.get("effective_from")
        eff_dt = None
        if eff:
            eff_dt = datetime.fromisoformat(eff)
            eff_dt = eff_dt if eff_dt.tzinfo else eff_dt.replace(tzinfo=timezone.utc)
        out.append(Entry(e["model"], e.get("match"), e["input_per_mtok"], e["output_per_mtok"],
                         e.get("cached_input_per_mtok"), eff_dt))
    return out


def ledger_cost(req: LlmRequest) -> float | None:
    catalog = _catalog()
    names = {e.model for e in catalog}
    if req.model in names:
        name = req.model
    else:
        name = next((e.model for e in catalog if e.match and re.fullmatch(e.match, req.model)), None)
    if name is None:
        return None
    in_force = [e for e in catalog if e.model == name
                and (e.effective_from is None or e.effective_from <= req.start)]
    if not in_force:
        return None
    price = max(in_force, key=lambda e: e.effective_from or datetime.min.replace(tzinfo=timezone.utc))
    cached = min(req.cached_tokens, req.input_tokens)
    cached_price = price.input if price.cached is None else price.cached
    return ((req.input_tokens - cached) * price.input + cached * cached_price
            + req.output_tokens * price.output) / 1e6


def ledger(reqs: list[LlmRequest], key) -> dict[str, dict[str, Any]]:
    """The cost report's rows, computed independently: {group: row}."""
    out: dict[str, dict[str, Any]] = {}
    for req in reqs:
        row = out.setdefault(key(req), {"requests": 0, "input_tokens": 0, "output_tokens": 0, "priced": 0,
                                        "cost_usd": None, "retry_cost_usd": 0.0, "error_cost_usd": 0.0,
                                        "unpriced_requests": 0})
        row["requests"] += 1
        row["input_tokens"] += req.input_tokens
        row["output_tokens"] += req.output_tokens
        cost = ledger_cost(req)
        if cost is None:
            row["unpriced_requests"] += 1
            continue
        row["priced"] += 1
        row["cost_usd"] = (row["cost_usd"] or 0.0) + cost
        if req.retry:
            row["retry_cost_usd"] += cost
        if req.error:
            row["error_cost_usd"] += cost
    for row in out.values():
        priced = row.pop("priced")
        row["cost_per_request_usd"] = row["cost_usd"] / priced if priced else None
    return out


def assert_matches_ledger(report_rows: list[dict], by: str, expected: dict[str, dict[str, Any]]) -> None:
    got = {row[by]: row for row in report_rows}
    assert sorted(got) == sorted(expected), f"{by} groups differ"
    for group, want in expected.items():
        row = got[group]
        for name in ("requests", "input_tokens", "output_tokens", "unpriced_requests"):
            assert row[name] == want[name], (by, group, name)
        for name in ("cost_usd", "cost_per_request_usd"):
            assert _same_money(row[name], want[name]), (by, group, name, row[name], want[name])
        if want["cost_usd"] is not None:  # an all-unpriced group: see test_unpriced_group_wastes_no_zero_dollars
            for name in ("retry_cost_usd", "error_cost_usd"):
                assert _same_money(row[name], want[name]), (by, group, name, row[name], want[name])
    # most expensive first, unpriced groups last
    costs = [row["cost_usd"] for row in report_rows]
    priced = [c for c in costs if c is not None]
    assert costs == priced + [None] * (len(costs) - len(priced)) and priced == sorted(priced, reverse=True)


def _same_money(got: float | None, want: float | None) -> bool:
    if want is None or got is None:
        return got is want
    # the cent is the bar; float sums in a different order may differ far below it
    return round(got, 2) == round(want, 2) and abs(got - want) <= 1e-9 * max(1.0, abs(want))


# --- the traffic with known answers ------------------------------------------------------------

def traffic(seed: int = 20260101) -> tuple[list[LlmRequest], list[Any]]:
    """(requests inside the window, other spans that must not count)."""
    rng = random.Random(seed)
    models = ["gpt-4o-mini", "gpt-4o", "gpt-4o-2024-08-06", "gpt-5-turbo", "gpt-4o-2024-08-06-preview",
              "claude-x", "new-model", "xgpt-4o"]
    reqs = []
    for i in range(56):
        model = models[i % len(models)]
        start = SINCE + timedelta(minutes=10 + rng.randrange(0, 340), seconds=rng.randrange(0, 60),
                                  microseconds=rng.randrange(0, 10**6))
        input_tokens = rng.randrange(1_000, 900_000)
        reqs.append(LlmRequest(
            start=start, latency_s=rng.uniform(0.2, 6.0), model=model,
            input_tokens=input_tokens, output_tokens=rng.randrange(10, 60_000),
            cached_tokens=rng.choice([0, 0, rng.randrange(0, input_tokens)]),
            tenant=rng.choice(["acme", "acme", "globex", ""]), feature=rng.choice(["chat", "search", ""]),
            retry=rng.choice([0, 0, 0, 1, 2]), error=rng.random() < 0.2,
            ttft_s=rng.choice([None, round(rng.uniform(0.05, 0.9), 6)]),
            request_model="gpt-4o" if model == "gpt-4o-2024-08-06" and (i // len(models)) % 2 else None,
            spelling=rng.randrange(0, 6)))
    # edges: exactly at a price change (the new price applies), cached > input (clamped)
    reqs.append(LlmRequest(start=PRICE_CHANGE, latency_s=1.0, model="gpt-4o", input_tokens=1_000_000,
                           output_tokens=100_000, cached_tokens=400_000, tenant="acme", feature="chat"))
    reqs.append(LlmRequest(start=PRICE_CHANGE - timedelta(milliseconds=1), latency_s=1.0, model="gpt-4o",
                           input_tokens=1_000_000, output_tokens=100_000, cached_tokens=400_000, tenant="acme",
                           feature="chat"))
    reqs.append(LlmRequest(start=LAUNCH, latency_s=0.5, model="new-model", input_tokens=2_000_000,
                           output_tokens=1_000_000, tenant="globex", feature="search"))
    reqs.append(LlmRequest(start=NOW - timedelta(minutes=30), latency_s=0.5, model="gpt-4o-mini",
                           input_tokens=1_000, output_tokens=10, cached_tokens=5_000, tenant="globex", spelling=2))
    others = [
        # outside the window
        LlmRequest(start=SINCE - timedelta(minutes=5), latency_s=1.0, model="gpt-4o", input_tokens=10**6,
                   output_tokens=10**6, tenant="acme", feature="chat"),
        # pipeline steps and plain spans are not requests
        PlainSpan(NOW - timedelta(hours=2), "execute_tool search",
                  {"gen_ai.operation.name": "execute_tool", "gen_ai.request.model": "gpt-4o",
                   "gen_ai.usage.input_tokens": 10**6, "app.tenant": "acme"}),
        PlainSpan(NOW - timedelta(hours=2), "retrieval docs",
                  {"gen_ai.operation.name": "retrieval", "gen_ai.usage.input_tokens": 10**6, "app.tenant": "acme"}),
        PlainSpan(NOW - timedelta(hours=2), "GET /health", {"http.request.method": "GET", "app.tenant": "acme"}),
    ]
    return reqs, others


@pytest.fixture
def settings(make_settings, request):
    """The pricing above; more overrides via `parametrize("settings", [{...}], indirect=True)`."""
    overrides = {"pricing": PRICING, **getattr(request, "param", {})}
    return make_settings(**overrides)


@pytest.fixture
def loaded(otlp_http, store) -> list[LlmRequest]:
    reqs, others = traffic()
    sent = send(otlp_http, [*reqs, *others])
    assert stored_spans(store) == sent  # every export landed (the SDK swallows failures)
    return reqs


# --- tests --------------------------------------------------------------------------------------

def test_ledger_has_the_cases_it_claims() -> None:
    # The traffic exercises what the cost model must get right; guard against a generator change.
    reqs, _ = traffic()
    costs = [ledger_cost(r) for r in reqs]
    assert any(c is None for c in costs) and any(c is not None for c in costs)
    gpt4o = [r for r in reqs if r.model.startswith("gpt-4o") and r.model != "gpt-4o-mini" and ledger_cost(r)]
    assert {r.start >= PRICE_CHANGE for r in gpt4o} == {True, False}
    assert {ledger_cost(r) is None for r in reqs if r.model == "new-model"} == {True, False}
    assert any(r.retry for r in reqs) and any(r.error for r in reqs) and any(r.cached_tokens for r in reqs)
    assert any(r.request_model for r in reqs)
    # the dated model is priced as gpt-4o, the over-long one falls through to the generic regex
    at = NOW - timedelta(hours=5)
    assert ledger_cost(LlmRequest(at, 1, "gpt-4o-2024-08-06", 10**6, 0)) == pytest.approx(2.5)
    assert ledger_cost(LlmRequest(at, 1, "gpt-4o-2024-08-06-preview", 10**6, 0)) == pytest.approx(1.0)
    assert ledger_cost(LlmRequest(NOW, 1, "gpt-4o", 10**6, 10**6, 10**6)) == pytest.approx(1.0 + 8.0)
    assert ledger_cost(LlmRequest(at, 1, "xgpt-4o", 10**6, 0)) is None


def served_model(loaded: list[LlmRequest], since: datetime, until: datetime):
    """The ledger's reading of the served model (analytics.model_names): a span naming only
    the model asked for groups with the model its service's requests for that name were
    answered with in the window's hours, the most frequent one; where its service has none
    and no request for that name that did not fail, with the fleet's."""
    first_hour = since.replace(minute=0, second=0, microsecond=0)
    answered: dict[tuple[str, str], dict[str, int]] = {}
    itself: set[tuple[str, str]] = set()
    for r in loaded:
        if not first_hour <= r.start < until:
            continue
        if r.request_model and r.request_model != r.model:
            for key in ((r.service, r.request_model), ("", r.request_model)):
                names = answered.setdefault(key, {})
                names[r.model] = names.get(r.model, 0) + 1
        elif not r.error:
            itself.add((r.service, r.model))
    chosen = {k: max(v.items(), key=lambda kv: (kv[1], kv[0]))[0] for k, v in answered.items()}

    def model_of(r: LlmRequest) -> str:
        if r.request_model:
            return r.model
        if (r.service, r.model) in chosen:
            return chosen[(r.service, r.model)]
        return r.model if (r.service, r.model) in itself else chosen.get(("", r.model), r.model)
    return model_of


def test_cost_report_matches_the_ledger(loaded, store, settings) -> None:
    model_of = served_model(loaded, SINCE, UNTIL)
    assert model_of(LlmRequest(NOW, 1, "gpt-4o", 1, 1)) == "gpt-4o-2024-08-06"  # the data holds the case
    for by in ("tenant", "model", "feature"):
        doc = run("cost", store, settings, {**WINDOW, "by": by})
        assert doc["report"] == "cost" and doc["since"].startswith(SINCE.strftime("%Y-%m-%dT%H:%M"))
        key = model_of if by == "model" else (lambda r, by=by: getattr(r, by))
        assert_matches_ledger(doc["rows"], by, ledger(loaded, key))
    # the default grouping is by tenant
    assert_matches_ledger(run("cost", store, settings, WINDOW)["rows"], "tenant", ledger(loaded, lambda r: r.tenant))

    # unknown models: cost null, every request counted as unpriced, never $0
    rows = {r["model"]: r for r in run("cost", store, settings, {**WINDOW, "by": "model"})["rows"]}
    for model in ("claude-x", "xgpt-4o"):
        assert rows[model]["cost_usd"] is None and rows[model]["cost_per_request_usd"] is None
        assert rows[model]["unpriced_requests"] == rows[model]["requests"] > 0
    # new-model: unpriced before its launch, priced from it on, in the same group
    new = rows["new-model"]
    before = sum(1 for r in loaded if r.model == "new-model" and r.start < LAUNCH)
    assert 0 < new["unpriced_requests"] == before < new["requests"]
    assert new["cost_usd"] > 0

    # filters narrow the population the ledger is computed over
    doc = run("cost", store, settings, {**WINDOW, "by": "model", "tenant": "acme"})
    assert_matches_ledger(doc["rows"], "model", ledger([r for r in loaded if r.tenant == "acme"], model_of))
    doc = run("cost", store, settings, {**WINDOW, "by": "tenant", "model": "gpt-4o-2024-08-06"})
    assert_matches_ledger(doc["rows"], "tenant",
                          ledger([r for r in loaded if model_of(r) == "gpt-4o-2024-08-06"], lambda r: r.tenant))
    doc = run("cost", store, settings, {**WINDOW, "by": "feature", "tenant": "globex", "feature": "search"})
    want = ledger([r for r in loaded if r.tenant == "globex" and r.feature == "search"], lambda r: r.feature)
    assert_matches_ledger(doc["rows"], "feature", want)
    # a narrower window: only the requests from the price change on
    doc = run("cost", store, settings, {"since": PRICE_CHANGE.isoformat(), "until": UNTIL.isoformat(), "by": "model"})
    assert_matches_ledger(doc["rows"], "model", ledger([r for r in loaded if r.start >= PRICE_CHANGE],
                                                       served_model(loaded, PRICE_CHANGE, UNTIL)))

    # overview: the headline numbers over the same window
    (row,) = run("overview", store, settings, WINDOW)["rows"]
    n = len(loaded)
    assert row["requests"] == n
    assert row["error_rate"] == pytest.approx(sum(r.error for r in loaded) / n, rel=1e-12)
    assert row["retry_rate"] == pytest.approx(sum(r.retry > 0 for r in loaded) / n, rel=1e-12)
    ttfts = [r.ttft_s for r in loaded if r.ttft_s is not None]
    assert row["ttft_p99_ms"] == pytest.approx(np.percentile(ttfts, 99) * 1000, rel=1e-9)
    assert row["latency_p99_ms"] == pytest.approx(np.percentile([r.duration_s for r in loaded], 99) * 1000, rel=1e-9)
    (total,) = ledger(loaded, lambda r: "all").values()
    assert _same_money(row["cost_per_request_usd"], total["cost_per_request_usd"])
    # and filtered to one tenant
    (row,) = run("overview", store, settings, {**WINDOW, "tenant": "globex"})["rows"]
    globex = [r for r in loaded if r.tenant == "globex"]
    assert row["requests"] == len(globex)
    assert row["error_rate"] == pytest.approx(sum(r.error for r in globex) / len(globex), rel=1e-12)
    (total,) = ledger(globex, lambda r: "all").values()
    assert _same_money(row["cost_per_request_usd"], total["cost_per_request_usd"])


def test_unpriced_group_wastes_no_zero_dollars(otlp_http, store, settings) -> None:
    at = NOW - timedelta(hours=1)
    send(otlp_http, [LlmRequest(at, 1.0, "claude-x", 1000, 100, retry=1, error=True, tenant="acme"),
                     LlmRequest(at, 1.0, "claude-x", 1000, 100, tenant="acme")])
    (row,) = run("cost", store, settings, {**WINDOW, "by": "model"})["rows"]
    assert row["cost_usd"] is None and row["unpriced_requests"] == 2
    assert row["retry_cost_usd"] is None and row["error_cost_usd"] is None


def test_cost_by_outcome_in_spend_order(otlp_http, store, settings) -> None:
    # one trace per request, each ending as its app.outcome says; spend order is neither
    # the names' nor the arrival's
    at = NOW - timedelta(hours=1)
    spend = {"resolved": [10**6], "escalated": [10**7, 10**7], "abandoned": [3 * 10**6], "handoff": [10**5],
             "retried": [2 * 10**6, 10**6], "": [5 * 10**5]}
    send(otlp_http, [LlmRequest(at, 1.0, "gpt-4o-mini", tokens, 0, extra={"app.outcome": outcome} if outcome else {})
                     for outcome, each in spend.items() for tokens in each])
    rows = run("cost", store, settings, {**WINDOW, "by": "outcome"})["rows"]
    assert [r["outcome"] for r in rows] == ["escalated", "abandoned", "retried", "resolved", "", "handoff"]
    for r in rows:  # gpt-4o-mini's input at $0.15 per million tokens
        assert _same_money(r["cost_usd"], sum(spend[r["outcome"]]) * 0.15e-6)
        assert r["outcomes"] == len(spend[r["outcome"]])  # traces; "" holds those without an outcome
    escalated = rows[0]
    assert _same_money(escalated["cost_per_outcome_usd"], 1.5)


@pytest.mark.parametrize("settings", [{"attributes": {"tenant": ["org"]},
                                       "collector": {"tokens": {"tok-a": "acme"}}}], indirect=True)
def test_token_tenant_with_custom_tenant_keys(otlp_http, store, settings) -> None:
    # attributes.tenant: [org]; the token's tenant must win over the span's claim
    at = NOW - timedelta(hours=1)
    send(otlp_http, [LlmRequest(at, 1.0, "gpt-4o-mini", 10**6, 0, extra={"org": "evil"})],
         headers={"Authorization": "Bearer tok-a"})
    assert stored_spans(store) == 1
    rows = run("cost", store, settings, {**WINDOW, "by": "tenant"})["rows"]
    assert [(r["tenant"], r["requests"]) for r in rows] == [("acme", 1)]
