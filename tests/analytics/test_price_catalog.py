"""The price catalog (analytics.pricing) against genai-prices' own arithmetic.

Expected dollars come from the package itself: genai_prices.calc_price on each request's
usage, at its time, for the model genai-prices matches; config-priced ones by hand from
the config's numbers. The cost report runs on real chDB: rows go straight into
llm_requests, the report's input, since which span attributes fill the cache-write and
reasoning columns is the collector's concern (its dialect tests).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable, Iterator

import pytest
from genai_prices import Usage, calc_price, data_snapshot
from genai_prices import types as gp

from servelens.analytics.pricing import SOURCE_CONFIG, SOURCE_GENAI, Catalog
from servelens.analytics.reports.registry import run
from servelens.app.cli import main
from servelens.core.config import ModelPrice

NOW = datetime.now(timezone.utc).replace(microsecond=0)
SNAPSHOT = data_snapshot.get_snapshot()


def _catalog(entries: list[dict[str, Any]] | None = None, catalog: str = "genai-prices") -> Catalog:
    return Catalog([ModelPrice.model_validate(e) for e in entries or []], catalog)


# --- requests and what genai-prices says they cost --------------------------------------------

@dataclass(frozen=True)
class Req:
    at: datetime
    model: str
    provider: str = "openai"
    input_tokens: int = 0
    output_tokens: int = 0
    cached: int = 0
    cache_write: int = 0
    reasoning: int = 0

    def usage(self) -> Usage:
        return Usage(input_tokens=self.input_tokens, cache_read_tokens=self.cached,
                     cache_write_tokens=self.cache_write, output_tokens=self.output_tokens,
                     output_reasoning_tokens=self.reasoning)


def genai_cost(req: Req, ref: str, provider_id: str | None) -> float:
    """What genai-prices charges for this request (ref/provider_id: how it is asked)."""
    return float(calc_price(req.usage(), ref, provider_id=provider_id, genai_request_timestamp=req.at).total_price)


def by_hand(req: Req, entry: dict[str, Any]) -> float:
    """SPEC 4's rule on a config entry: cache read/write at their prices (else input),
    reasoning at its price (else output), each a part of its whole."""
    inp, out = entry["input_per_mtok"], entry["output_per_mtok"]
    cached, write = entry.get("cached_input_per_mtok", inp), entry.get("cache_write_per_mtok", inp)
    reasoning = entry.get("reasoning_per_mtok", out)
    fresh = req.input_tokens - req.cached - req.cache_write
    return (fresh * inp + req.cached * cached + req.cache_write * write
            + (req.output_tokens - req.reasoning) * out + req.reasoning * reasoning) / 1e6


def insert(store, reqs: list[Req]) -> None:
    columns = ["Timestamp", "TraceId", "SpanId", "ServiceName", "Deployment", "Model", "Provider", "Tenant",
               "InputTokens", "OutputTokens", "CachedInputTokens", "CacheWriteInputTokens",
               "ReasoningOutputTokens", "LatencySeconds", "IsError", "RetryAttempt"]
    rows = [[r.at, uuid.uuid4().hex, uuid.uuid4().hex[:16], "chat-api", "chat-api", r.model, r.provider, "acme",
             r.input_tokens, r.output_tokens, r.cached, r.cache_write, r.reasoning, 1.0, False, 0] for r in reqs]
    store.client().insert("llm_requests", rows, column_names=columns)


def cost_by_model(store, settings, since: datetime) -> dict[str, dict[str, Any]]:
    doc = run("cost", store, settings, {"since": since.isoformat(), "until": (NOW + timedelta(minutes=1)).isoformat(),
                                        "by": "model"})
    return {row["model"]: row for row in doc["rows"]}


# --- picking models from the data (so a newer genai-prices keeps the tests honest) ----------

def _models() -> Iterator[tuple[gp.Provider, gp.ModelInfo]]:
    for provider in SNAPSHOT.providers:
        for model in provider.models:
            yield provider, model


def _prices(model: gp.ModelInfo) -> list[gp.ModelPrice]:
    return [c.prices for c in model.prices] if isinstance(model.prices, list) else [model.prices]


def _found_as(provider: gp.Provider, model: gp.ModelInfo) -> bool:
    """genai-prices finds this very model by its id at this provider (and so does the catalog)."""
    try:
        return SNAPSHOT.find_provider_model(model.id, None, provider.id, None)[1] is model
    except LookupError:
        return False


def pick(predicate: Callable[[gp.Provider, gp.ModelInfo], bool], what: str) -> tuple[gp.Provider, gp.ModelInfo]:
    found = next(((p, m) for p, m in _models() if predicate(p, m) and _found_as(p, m)), None)
    if found is None:
        pytest.fail(f"genai-prices {what}: none in this data")
    return found


def _recent_change(provider: gp.Provider, model: gp.ModelInfo) -> datetime | None:
    """The start of a dated price change in the last 20 days that changes the input price."""
    for c in model.prices if isinstance(model.prices, list) else []:
        if isinstance(c.constraint, gp.StartDateConstraint):
            start = datetime.combine(c.constraint.start_date, time(), timezone.utc)
            before = model.get_prices(start - timedelta(hours=1))
            if NOW - timedelta(days=20) < start <= NOW - timedelta(hours=2) \
                    and before.input_mtok != c.prices.input_mtok and isinstance(c.prices.input_mtok, Decimal):
                return start
    return None


def _flat(price: gp.ModelPrice, *keys: str) -> bool:
    return all(isinstance(getattr(price, k), Decimal) for k in keys)


# --- the catalog alone ---------------------------------------------------------------------------

def test_genai_names_dated_prefixed_and_by_provider() -> None:
    catalog = _catalog()
    _, gpt4o = SNAPSHOT.find_provider_model("gpt-4o", None, "openai", None)
    for name, provider in (("gpt-4o", "openai"), ("gpt-4o-2024-08-06", "openai"), ("openai/gpt-4o", ""),
                           ("openai/gpt-4o", "openai"), ("GPT-4o", "")):
        prices = catalog.resolve(name, provider)
        assert prices is not None and prices.source == SOURCE_GENAI and prices.name == f"openai:{gpt4o.id}", name
        price = catalog.price(name, NOW, provider)
        assert price.input_per_mtok == float(gpt4o.get_prices(NOW).input_mtok)
    # the semconv provider names map to genai-prices' providers
    assert catalog.resolve("claude-3-5-sonnet-20241022", "gcp.vertex_ai").name.startswith("google:")
    bedrock = catalog.resolve("anthropic.claude-3-5-sonnet-20241022-v2:0", "aws.bedrock")
    assert bedrock is not None and bedrock.name.startswith("aws:")
    assert catalog.resolve("gpt-4o", "azure.ai.openai").name.startswith("azure:")
    # neither knows it: unpriced, never a price of 0
    assert catalog.resolve("claude-x", "openai") is None and catalog.price("mystery-1", NOW) is None
    assert _catalog(catalog="none").resolve("gpt-4o", "openai") is None


def test_config_overrides_genai_prices() -> None:
    catalog = _catalog([{"model": "gpt-4o", "match": r"(openai/)?gpt-4o(-\d{4}-\d{2}-\d{2})?", "input_per_mtok": 9.0,
                         "output_per_mtok": 19.0, "effective_from": (NOW - timedelta(days=1)).isoformat()}])
    for name in ("gpt-4o", "gpt-4o-2024-08-06", "openai/gpt-4o"):
        price = catalog.price(name, NOW, "openai")
        assert (price.source, price.name, price.input_per_mtok, price.cached_input_per_mtok) == \
            (SOURCE_CONFIG, "gpt-4o", 9.0, 9.0)
    # before the config's first price the model is unpriced: the config alone prices what it names
    assert catalog.price("gpt-4o", NOW - timedelta(days=2), "openai") is None
    assert catalog.price("gpt-4o-mini", NOW, "openai").source == SOURCE_GENAI


def test_every_token_priced_model_costs_what_genai_prices_says() -> None:
    """Each genai-prices model, at a time and a usage of its own (tiers, cache reads and
    writes, reasoning): the catalog's Price.cost is calc_price's total."""
    catalog = _catalog()
    compared = 0
    for i, (provider, model) in enumerate(_models()):
        at = NOW - timedelta(days=i % 700, minutes=37 * i)
        req = Req(at, model.id, provider.id, input_tokens=(1_000, 150_000, 300_000, 600_000)[i % 4],
                  output_tokens=7_000 + i, cached=100 + i % 500, cache_write=300, reasoning=2_000)
        prices = catalog.genai.lookup(provider.id, model.id)
        if prices is None or not _found_as(provider, model):
            continue
        price = prices.price(at, req.input_tokens)
        token_priced = any(getattr(p, k) is not None for p in _prices(model) for k in ("input_mtok", "output_mtok"))
        if price is None:  # priced by characters, audio hours, pages: not by tokens
            assert not token_priced, model.id
            continue
        got = price.cost(req.input_tokens, req.output_tokens, req.cached, req.cache_write, req.reasoning)
        assert got == pytest.approx(genai_cost(req, model.id, provider.id), rel=1e-12, abs=1e-15), (provider.id, model.id)
        compared += 1
    assert compared > 1000


# --- the cost report ----------------------------------------------------------------------------

@pytest.fixture
def settings(make_settings, request):
    return make_settings(pricing=getattr(request, "param", {"models": []}))


def test_report_prices_from_genai_prices(store, settings) -> None:
    changed_provider, changed = pick(lambda p, m: _recent_change(p, m) is not None, "a recent dated price change")
    change = _recent_change(changed_provider, changed)
    anthropic, cached_model = pick(lambda p, m: p.id == "anthropic" and not isinstance(m.prices, list)
                                   and _flat(m.prices, "input_mtok", "cache_read_mtok", "cache_write_mtok",
                                             "output_mtok"), "an Anthropic model with cache prices")
    daily_provider, daily = pick(lambda p, m: isinstance(m.prices, list) and any(
        isinstance(c.constraint, gp.TimeOfDateConstraint) for c in m.prices), "a time-of-day price")
    tiered_provider, tiered = pick(lambda p, m: not isinstance(m.prices, list)
                                   and isinstance(m.prices.input_mtok, gp.TieredPrices), "a tiered price")
    threshold = tiered.prices.input_mtok.tiers[0].start
    day = NOW.replace(hour=0, minute=0, second=0) - timedelta(days=1)
    reqs = {
        # (request, how genai-prices is asked: ref, provider id)
        "dated": (Req(NOW - timedelta(hours=3), "gpt-4o-2024-08-06", "openai", 1_000_000, 100_000, cached=400_000),
                  "gpt-4o-2024-08-06", "openai"),
        "prefixed": (Req(NOW - timedelta(hours=2), "openai/gpt-4o", "", 200_000, 50_000, cached=20_000),
                     "gpt-4o", "openai"),
        "before change": (Req(change - timedelta(hours=1), changed.id, changed_provider.id, 300_000, 30_000),
                          changed.id, changed_provider.id),
        "after change": (Req(change + timedelta(hours=1), changed.id, changed_provider.id, 300_000, 30_000),
                         changed.id, changed_provider.id),
        "cache write": (Req(NOW - timedelta(hours=1), cached_model.id, "anthropic", 100_000, 4_000, cached=60_000,
                            cache_write=30_000), cached_model.id, "anthropic"),
        "reasoning": (Req(NOW - timedelta(hours=1), "o3", "openai", 10_000, 50_000, reasoning=40_000), "o3", "openai"),
        "daily a": (Req(day + timedelta(hours=3), daily.id, daily_provider.id, 50_000, 5_000),
                    daily.id, daily_provider.id),
        "daily b": (Req(day + timedelta(hours=20), daily.id, daily_provider.id, 50_000, 5_000),
                    daily.id, daily_provider.id),
        "short": (Req(NOW - timedelta(hours=1), tiered.id, tiered_provider.id, threshold, 1_000),
                  tiered.id, tiered_provider.id),
        "long": (Req(NOW - timedelta(hours=1), tiered.id, tiered_provider.id, threshold + 1, 1_000),
                 tiered.id, tiered_provider.id),
    }
    unknown = Req(NOW - timedelta(hours=1), "mystery-model-9", "openai", 10**6, 10**6)
    insert(store, [r for r, _, _ in reqs.values()] + [unknown, unknown])
    want = {case: genai_cost(r, ref, pid) for case, (r, ref, pid) in reqs.items()}
    # the data does what the cases claim: prices differ across the change, the day, the tier
    assert want["before change"] != want["after change"]
    assert want["daily a"] != want["daily b"]
    assert want["long"] / reqs["long"][0].input_tokens > want["short"] / reqs["short"][0].input_tokens * 1.0001
    # reasoning is billed as output (o3 has no reasoning price): no double count
    assert want["reasoning"] == pytest.approx(genai_cost(Req(NOW, "o3", input_tokens=10_000, output_tokens=50_000),
                                                         "o3", "openai"))

    rows = cost_by_model(store, settings, change - timedelta(days=1))
    expected: dict[str, float] = {}
    for case, (r, _, _) in reqs.items():
        expected[r.model] = expected.get(r.model, 0.0) + want[case]
    for model, usd in expected.items():
        row = rows[model]
        assert row["cost_usd"] == pytest.approx(usd, rel=1e-9), model
        assert row["price_source"] == SOURCE_GENAI and row["unpriced_requests"] == 0, model
    assert rows[changed.id]["price_updated"].startswith(change.date().isoformat())  # the newest price's start
    row = rows[unknown.model]
    assert row["cost_usd"] is None and row["cost_per_request_usd"] is None and row["price_source"] is None
    assert row["unpriced_requests"] == row["requests"] == 2


GPT4O = {"model": "gpt-4o", "match": r"(openai/)?gpt-4o(-\d{4}-\d{2}-\d{2})?", "input_per_mtok": 3.0,
         "output_per_mtok": 12.0, "cached_input_per_mtok": 1.5, "effective_from": "2025-01-01"}
O3 = {"model": "o3", "input_per_mtok": 2.0, "output_per_mtok": 8.0, "reasoning_per_mtok": 5.0}
CLAUDE = {"model": "claude-sonnet", "match": r"claude-.*sonnet.*", "input_per_mtok": 3.0, "output_per_mtok": 15.0,
          "cached_input_per_mtok": 0.3, "cache_write_per_mtok": 3.75}


@pytest.mark.parametrize("settings", [{"models": [GPT4O, O3, CLAUDE]}], indirect=True)
def test_report_prices_from_the_config_when_it_names_the_model(store, settings) -> None:
    at = NOW - timedelta(hours=2)
    reqs = [(Req(at, "gpt-4o-2024-08-06", "openai", 1_000_000, 100_000, cached=400_000), GPT4O),
            (Req(at, "openai/gpt-4o", "", 200_000, 50_000, cached=20_000), GPT4O),
            (Req(at, "o3", "openai", 10_000, 50_000, reasoning=40_000), O3),
            (Req(at, "claude-3-5-sonnet-20241022", "anthropic", 100_000, 4_000, cached=60_000, cache_write=30_000),
             CLAUDE),
            # parts larger than the whole are clamped: nothing billed twice
            (Req(at, "claude-3-5-sonnet-20241022", "anthropic", 1_000, 10, cached=800, cache_write=900, reasoning=50),
             CLAUDE)]
    insert(store, [r for r, _ in reqs])
    rows = cost_by_model(store, settings, NOW - timedelta(hours=6))
    clamp = reqs[-1][0]
    expected = {
        "gpt-4o-2024-08-06": by_hand(reqs[0][0], GPT4O), "openai/gpt-4o": by_hand(reqs[1][0], GPT4O),
        "o3": by_hand(reqs[2][0], O3),
        "claude-3-5-sonnet-20241022": by_hand(reqs[3][0], CLAUDE) + by_hand(
            Req(at, clamp.model, input_tokens=1_000, output_tokens=10, cached=800, cache_write=200, reasoning=10),
            CLAUDE),
    }
    # reasoning at its own price, the rest of the output at the output price
    assert expected["o3"] == pytest.approx((10_000 * 2.0 + 10_000 * 8.0 + 40_000 * 5.0) / 1e6)
    for model, usd in expected.items():
        assert rows[model]["cost_usd"] == pytest.approx(usd, rel=1e-12), model
        assert rows[model]["price_source"] == SOURCE_CONFIG, model
    assert rows["gpt-4o-2024-08-06"]["price_updated"].startswith("2025-01-01")
    assert rows["o3"]["price_updated"] is None  # no effective_from: in force from the start

    # by tenant, one row carries both sources; turning the catalog off leaves only the config
    insert(store, [Req(at, "gpt-4o-mini", "openai", 10_000, 1_000)])
    (row,) = run("cost", store, settings, {"since": (NOW - timedelta(hours=6)).isoformat(), "by": "tenant"})["rows"]
    assert row["price_source"] == "config, genai-prices" and row["unpriced_requests"] == 0


@pytest.mark.parametrize("settings", [{"models": [O3], "catalog": "none"}], indirect=True)
def test_catalog_none_leaves_unconfigured_models_unpriced(store, settings) -> None:
    at = NOW - timedelta(hours=2)
    insert(store, [Req(at, "gpt-4o", "openai", 1_000, 100), Req(at, "o3", "openai", 1_000, 100)])
    rows = cost_by_model(store, settings, NOW - timedelta(hours=6))
    assert rows["gpt-4o"]["cost_usd"] is None and rows["gpt-4o"]["unpriced_requests"] == 1
    assert rows["o3"]["cost_usd"] == pytest.approx((1_000 * 2.0 + 100 * 8.0) / 1e6)


# --- servelens prices --------------------------------------------------------------------------

def test_prices_command(tmp_path, capsys) -> None:
    config = tmp_path / "servelens.yaml"
    config.write_text(json.dumps({"pricing": {"models": [O3]}}))  # JSON is YAML
    assert main(["prices", "--config", str(config), "--models", "o3,gpt-4o-2024-08-06,openai/gpt-4o,mystery-1",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["catalog"].startswith("genai-prices ")
    assert doc["config"] == [{"model": "o3", "match": None, "input_per_mtok": 2.0, "cached_input_per_mtok": 2.0,
                              "cache_write_per_mtok": 2.0, "output_per_mtok": 8.0, "reasoning_per_mtok": 5.0,
                              "effective_from": None}]
    rows = {r["model"]: r for r in doc["models"]}
    assert (rows["o3"]["source"], rows["o3"]["matched"]) == ("config", "o3")
    _, gpt4o = SNAPSHOT.find_provider_model("gpt-4o", None, "openai", None)
    published = gpt4o.get_prices(datetime.now(timezone.utc))
    for name in ("gpt-4o-2024-08-06", "openai/gpt-4o"):
        row = rows[name]
        assert (row["source"], row["matched"]) == ("genai-prices", f"openai:{gpt4o.id}")
        assert row["input_per_mtok"] == float(published.input_mtok)
        assert row["cached_input_per_mtok"] == float(published.cache_read_mtok)
        assert row["output_per_mtok"] == float(published.output_mtok)
        assert row["cache_write_per_mtok"] == float(published.input_mtok)  # no cache-write price: input's
    assert rows["mystery-1"]["source"] is None and rows["mystery-1"]["input_per_mtok"] is None

    assert main(["prices", "--config", str(config), "--models", "claude-3-5-sonnet-20241022",
                 "--provider", "anthropic"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("pricing.models (1 entries), then genai-prices ")
    header = next(line for line in out if line.startswith("model ") and "provider" in line).split()
    assert header[:4] == ["model", "provider", "source", "matched"] and "cache_write_per_mtok" in header
    line = next(line for line in out if line.startswith("claude-3-5-sonnet-20241022"))
    assert "genai-prices" in line and "anthropic:" in line


@pytest.mark.integration
def test_spans_through_the_collector_are_priced_by_their_parts(otlp_http, store, settings) -> None:
    """The same rule on the real path: OTLP spans -> collector -> llm_requests -> report."""
    from tests.analytics.test_cost_ledger import LlmRequest, send

    at = NOW - timedelta(hours=1)
    claude = Req(at, "claude-3-5-sonnet-20241022", "anthropic", 100_000, 4_000, cached=60_000, cache_write=30_000)
    o3 = Req(at, "o3", "openai", 10_000, 50_000, reasoning=40_000)
    spans = [LlmRequest(r.at, 1.0, r.model, r.input_tokens, r.output_tokens, r.cached, tenant="acme",
                        extra={"gen_ai.provider.name": r.provider,
                               "gen_ai.usage.cache_creation.input_tokens": r.cache_write,
                               "gen_ai.usage.reasoning.output_tokens": r.reasoning}) for r in (claude, o3)]
    send(otlp_http, spans, senders=1)
    rows = cost_by_model(store, settings, NOW - timedelta(hours=6))
    assert rows[claude.model]["cost_usd"] == pytest.approx(genai_cost(claude, claude.model, "anthropic"), rel=1e-12)
    assert rows[o3.model]["cost_usd"] == pytest.approx(genai_cost(o3, "o3", "openai"), rel=1e-12)
