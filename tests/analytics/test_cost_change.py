"""The `cost-change` report: the Shapley split on constructed inputs, then end to end.

End to end, two windows of traffic go through the real OpenTelemetry SDK (OTLP/HTTP,
SimpleSpanProcessor, explicit start/end times) into the collector and chDB. Each
single-factor scenario changes exactly one factor of the cost identity, so the whole
change must land on that driver and every other driver must be 0; the mixed scenario
changes everything and is checked against spend priced span by span in this file.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import polars as pl
import pytest
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from polars.testing import assert_frame_equal

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports import cost_change
from servelens.analytics.reports.cost_change import DRIVERS, CellTotals
from servelens.analytics.reports.registry import to_records

S = 10**9
HOUR = 3600 * S
# Two whole hours ending an hour ago: recent (inside any retention), and the current
# window's start doubles as a price's effective_from.
PREV_START = (time.time_ns() // HOUR - 3) * HOUR
CUR_START = PREV_START + HOUR
CUR_END = CUR_START + HOUR
ZERO = 1e-9


def utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / S, tz=timezone.utc)


Q = ReportQuery(utc(CUR_START), utc(CUR_END))

GPT4O = {"model": "gpt-4o", "input_per_mtok": 2.5, "output_per_mtok": 10.0, "cached_input_per_mtok": 1.25}
MINI = {"model": "gpt-4o-mini", "input_per_mtok": 0.15, "output_per_mtok": 0.6}
SONNET = {"model": "claude-sonnet-4", "input_per_mtok": 3.0, "output_per_mtok": 15.0, "cached_input_per_mtok": 0.3}
# gpt-4o gets dearer exactly where the current window starts.
GPT4O_STEP = {**GPT4O, "input_per_mtok": 3.0, "output_per_mtok": 12.0, "cached_input_per_mtok": 1.5,
              "effective_from": utc(CUR_START).isoformat()}
CATALOG = [GPT4O, MINI, SONNET]


# --- Unit: the Shapley value and the decomposition, no store -------------------------------

def test_shapley_additive_game_gives_each_player_its_own_term() -> None:
    terms = {"a": 1.0, "b": -2.5, "c": 4.0}
    phi = cost_change.shapley(lambda s: sum(terms[p] for p in s), list(terms))
    assert phi == pytest.approx(terms, abs=1e-12)


def test_shapley_splits_a_product_symmetrically_and_sums_to_the_change() -> None:
    # v(S) = Π (2 if switched else 1) over three players: the change 8 - 1 is shared equally.
    phi = cost_change.shapley(lambda s: 2.0 ** len(s), ["x", "y", "z"])
    assert phi == pytest.approx({"x": 7 / 3, "y": 7 / 3, "z": 7 / 3}, abs=1e-12)


def test_shapley_null_player_gets_exactly_zero() -> None:
    def value(s: frozenset[str]) -> float:
        return (3.0 if "a" in s else 1.0) * (0.5 if "b" in s else 1.0)
    phi = cost_change.shapley(value, ["a", "b", "idle"])
    assert phi["idle"] == 0.0
    assert sum(phi.values()) == pytest.approx(1.5 - 1.0, abs=1e-12)


def test_shapley_two_player_interaction_is_halved() -> None:
    # v = a·b going 1·1 -> 2·3: a alone +1, b alone +2, the interaction (+2) split evenly.
    phi = cost_change.shapley(lambda s: (2.0 if "a" in s else 1.0) * (3.0 if "b" in s else 1.0), ["a", "b"])
    assert phi == pytest.approx({"a": 2.0, "b": 3.0}, abs=1e-12)


def cell(attempts: int, in_tok: int, out_tok: int, in_price: float, out_price: float,
         originals: int | None = None) -> CellTotals:
    """Totals of a cell whose every attempt uses in_tok/out_tok at these USD-per-token prices."""
    return CellTotals(attempts, attempts if originals is None else originals, attempts * in_tok,
                      attempts * out_tok, attempts * in_tok * in_price, attempts * out_tok * out_price)


A, B = ("a", "dep", False), ("b", "dep", False)
A_ERR = ("a", "dep", True)


def cost_of(totals: dict) -> float:
    return sum(t.input_cost_usd + t.output_cost_usd for t in totals.values())


def test_model_in_one_window_only_moves_model_mix() -> None:
    previous = {A: cell(10, 100, 10, 1e-6, 2e-6)}
    current = {A: cell(5, 100, 10, 1e-6, 2e-6), B: cell(5, 300, 50, 4e-6, 8e-6)}
    deltas = cost_change.decompose(previous, current)
    assert deltas["model_mix"] == pytest.approx(cost_of(current) - cost_of(previous), abs=1e-15)
    assert all(deltas[d] == 0.0 for d in DRIVERS if d != "model_mix")


def test_traffic_from_nothing_is_all_volume_and_back() -> None:
    current = {A: cell(4, 100, 10, 1e-6, 2e-6), A_ERR: cell(1, 100, 0, 1e-6, 0.0)}
    for previous, now, sign in (({}, current, 1), (current, {}, -1)):
        deltas = cost_change.decompose(previous, now)
        assert deltas["volume"] == pytest.approx(sign * cost_of(current), abs=1e-15)
        assert all(deltas[d] == 0.0 for d in DRIVERS if d != "volume")


def test_first_errors_move_only_errors() -> None:
    previous = {A: cell(10, 100, 10, 1e-6, 2e-6)}
    current = {A: cell(8, 100, 10, 1e-6, 2e-6), A_ERR: cell(2, 100, 0, 1e-6, 0.0)}
    deltas = cost_change.decompose(previous, current)
    assert deltas["errors"] == pytest.approx(cost_of(current) - cost_of(previous), abs=1e-15)
    assert all(deltas[d] == 0.0 for d in DRIVERS if d != "errors")


def test_everything_changing_still_sums_to_the_change() -> None:
    previous = {A: cell(10, 100, 10, 1e-6, 2e-6), A_ERR: cell(2, 80, 0, 1e-6, 0.0)}
    current = {A: cell(12, 150, 30, 1.5e-6, 2e-6, originals=8), A_ERR: cell(5, 90, 1, 1e-6, 3e-6, originals=2),
               B: cell(3, 50, 5, 4e-6, 8e-6)}
    deltas = cost_change.decompose(previous, current)
    assert sum(deltas.values()) == pytest.approx(cost_of(current) - cost_of(previous), abs=1e-15)
    assert all(deltas[d] != 0.0 for d in DRIVERS)


def test_float_noise_in_a_ratio_is_not_a_change() -> None:
    # 0.1 + 0.2 != 0.3: the same per-token price read from different sums must give 0.
    previous = {A: CellTotals(3, 3, 3, 3, 0.3, 0.3)}
    current = {A: CellTotals(6, 6, 6, 6, 0.1 + 0.2 + 0.3, 0.6)}
    assert cost_change.decompose(previous, current)["price"] == 0.0


def test_cell_totals_merge_retries_and_periods_and_drop_unpriced_on_tiny_frames() -> None:
    groups = pl.LazyFrame({
        "key": [""] * 5, "window": [1] * 5,
        "model": ["gpt-4o", "gpt-4o", "gpt-4o", "vllm-llama", "mystery"],
        "deployment": ["chat-api", "chat-api", "chat-api", "llama-prod", "chat-api"],
        "retry": [False, True, False, False, False], "error": [False, False, True, False, False],
        "requests": [2, 1, 1, 4, 5], "input_tokens": [300_000, 100_000, 50_000, 20_000, 9],
        "output_tokens": [40_000, 0, 0, 10_000, 9],
        "input_cost_usd": [0.625, 0.25, 0.125, 0.2, None], "output_cost_usd": [0.4, 0.0, 0.0, 0.1, None],
        "cost_usd": [1.025, 0.25, 0.125, 0.3, None],
    })
    expected = pl.DataFrame({
        "key": [""] * 3, "window": [1] * 3, "model": ["gpt-4o", "gpt-4o", "vllm-llama"],
        "deployment": ["chat-api", "chat-api", "llama-prod"], "error": [False, True, False],
        "attempts": [3, 1, 4], "originals": [2, 1, 4], "input_tokens": [400_000, 50_000, 20_000],
        "output_tokens": [40_000, 0, 10_000], "input_cost_usd": [0.875, 0.125, 0.2],
        "output_cost_usd": [0.4, 0.0, 0.1], "cost_usd": [1.275, 0.125, 0.3],
    })
    assert_frame_equal(cost_change.cell_totals(groups).collect(), expected, check_dtypes=False, abs_tol=1e-12)


def test_previous_window_is_the_same_length_just_before() -> None:
    q = ReportQuery(utc(CUR_START), utc(CUR_END), "tenant", {"model": "gpt-4o"}, view="fully_loaded")
    assert cost_change.previous_window(q) == replace(q, since=utc(PREV_START), until=utc(CUR_START))


# --- End to end through OTel -> collector -> chDB ------------------------------------------

@dataclass(frozen=True)
class Req:
    model: str = "gpt-4o"
    input_tokens: int = 200_000
    output_tokens: int = 40_000
    cached_tokens: int = 0
    error: bool = False
    retry: int = 0
    tenant: str = "acme"
    deployment: str | None = None  # None: the service name

    def attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": self.model,
            "gen_ai.usage.input_tokens": self.input_tokens, "gen_ai.usage.output_tokens": self.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": self.cached_tokens, "app.tenant": self.tenant}
        if self.deployment:
            attrs["app.deployment"] = self.deployment
        if self.retry:
            attrs["http.request.resend_count"] = self.retry
        if self.error:
            attrs["error.type"] = "500"
        return attrs


OK = Req(cached_tokens=50_000)
ERR = replace(OK, output_tokens=0, error=True)
MINI_OK = Req(model="gpt-4o-mini", input_tokens=100_000, output_tokens=10_000)


def price_by_hand(req: Req, at_ns: int, catalog: list[dict]) -> float | None:
    """SPEC 4 straight from the catalog dicts: latest entry in force; cached at its own rate."""
    at = utc(at_ns)
    entries = [e for e in catalog if e["model"] == req.model
               and datetime.fromisoformat(e.get("effective_from", "1970-01-01T00:00:00+00:00")) <= at]
    if not entries:
        return None
    e = max(entries, key=lambda e: e.get("effective_from", ""))
    cached_rate = e.get("cached_input_per_mtok", e["input_per_mtok"])
    return ((req.input_tokens - req.cached_tokens) * e["input_per_mtok"] + req.cached_tokens * cached_rate
            + req.output_tokens * e["output_per_mtok"]) / 1e6


@pytest.fixture
def traffic(otlp_http: str):
    """send(previous, current): export both windows' requests; returns their start times."""
    provider = TracerProvider(resource=Resource.create({"service.name": "chat-api"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_http}/v1/traces")))
    tracer = provider.get_tracer("test.cost_change")

    def send(previous: list[Req], current: list[Req]) -> list[tuple[Req, int]]:
        sent = []
        for window_start, reqs in ((PREV_START, previous), (CUR_START, current)):
            for i, req in enumerate(reqs):
                start = window_start + (i + 1) * 10 * S
                span = tracer.start_span(f"chat {req.model}", context=Context(), kind=SpanKind.CLIENT,
                                         attributes=req.attributes(), start_time=start)
                if req.error:
                    span.set_status(Status(StatusCode.ERROR, "upstream failed"))
                span.end(end_time=start + 2 * S)
                sent.append((req, start))
        return sent

    yield send
    provider.shutdown()


def deltas(rows: list[dict]) -> dict[str, float]:
    assert [r["driver"] for r in rows] == list(DRIVERS)
    return {r["driver"]: r["delta_usd"] for r in rows}


def hand_spend(sent: list[tuple[Req, int]], catalog: list[dict],
               tenant: str | None = None) -> tuple[float, float]:
    """(previous, current) spend over priced requests, priced one by one."""
    spend = [0.0, 0.0]
    for req, start in sent:
        price = price_by_hand(req, start, catalog)
        if price is not None and tenant in (None, req.tenant):
            spend[start >= CUR_START] += price
    return spend[0], spend[1]


# Few spans each: every export is a synchronous insert into chDB.
SINGLE_FACTOR = {
    "volume": ([OK, ERR, replace(OK, retry=1), MINI_OK], [OK, ERR, replace(OK, retry=1), MINI_OK] * 2),
    "output_length": ([OK, ERR, MINI_OK], [replace(OK, output_tokens=60_000), ERR, MINI_OK]),
    "model_mix": ([OK, OK, MINI_OK], [OK, MINI_OK, MINI_OK]),
    "price": ([OK, ERR, MINI_OK], [OK, ERR, MINI_OK]),
    "retries": ([OK, OK, replace(OK, retry=1)], [OK, OK, replace(OK, retry=1), replace(OK, retry=2)]),
    "errors": ([OK, OK, ERR], [OK, ERR, ERR]),
}


@pytest.mark.integration
@pytest.mark.parametrize("driver", SINGLE_FACTOR)
def test_single_factor_change_lands_on_its_driver(driver: str, traffic, store, make_settings) -> None:
    catalog = [GPT4O_STEP, *CATALOG] if driver == "price" else CATALOG
    sent = traffic(*SINGLE_FACTOR[driver])
    rows = to_records(cost_change.report(store, make_settings(pricing={"models": catalog}), Q))

    previous, current = hand_spend(sent, catalog)
    got = deltas(rows)
    assert abs(current - previous) > 0.1  # a change worth splitting
    assert got[driver] == pytest.approx(current - previous, abs=ZERO)  # to the cent, and far finer
    for other in set(DRIVERS) - {driver}:
        assert abs(got[other]) < ZERO, (other, got[other])
    assert rows[0]["previous_cost_usd"] == pytest.approx(previous, abs=ZERO)
    assert rows[0]["current_cost_usd"] == pytest.approx(current, abs=ZERO)


# Everything moves: more originals, longer inputs and more cache hits (a price effect) for
# acme, a price step, more retries and errors, sonnet new in the current window, mini gone
# from globex, shorter globex outputs, and an unpriced model that must not count.
MIXED_PREVIOUS = [OK, OK, ERR, replace(OK, retry=1), MINI_OK, Req(model="mystery-1"),
                  replace(OK, tenant="globex"), replace(MINI_OK, tenant="globex"), replace(MINI_OK, tenant="globex")]
MIXED_CURRENT = [replace(OK, input_tokens=260_000, cached_tokens=120_000)] * 2 + [
    ERR, ERR, replace(OK, retry=1), replace(OK, retry=2), MINI_OK, Req(model="mystery-1"), Req(model="mystery-1"),
    Req(model="claude-sonnet-4", cached_tokens=20_000),
    replace(OK, tenant="globex", output_tokens=10_000), replace(OK, tenant="globex", output_tokens=10_000)]


@pytest.mark.integration
def test_mixed_change_sums_to_the_change_priced_by_hand(traffic, store, make_settings) -> None:
    catalog = [GPT4O_STEP, *CATALOG]
    sent = traffic(MIXED_PREVIOUS, MIXED_CURRENT)
    settings = make_settings(pricing={"models": catalog})

    rows = to_records(cost_change.report(store, settings, Q))
    previous, current = hand_spend(sent, catalog)
    got = deltas(rows)
    assert sum(got.values()) == pytest.approx(current - previous, abs=ZERO)
    for r in rows:
        assert r["previous_cost_usd"] == pytest.approx(previous, abs=ZERO)
        assert r["current_cost_usd"] == pytest.approx(current, abs=ZERO)
        assert r["total_delta_usd"] == pytest.approx(current - previous, abs=ZERO)
    assert all(abs(v) > 1e-6 for v in got.values()), got  # every driver really moved

    by_tenant = to_records(cost_change.report(store, settings, replace(Q, by="tenant")))
    assert {r["tenant"] for r in by_tenant} == {"acme", "globex"}
    for tenant in ("acme", "globex"):
        mine = [r for r in by_tenant if r["tenant"] == tenant]
        previous, current = hand_spend(sent, catalog, tenant)
        assert sum(deltas(mine).values()) == pytest.approx(current - previous, abs=ZERO)
        assert mine[0]["total_delta_usd"] == pytest.approx(current - previous, abs=ZERO)


@pytest.mark.integration
def test_traffic_new_in_this_window_is_all_volume(traffic, store, make_settings) -> None:
    sent = traffic([], [OK, ERR, MINI_OK])
    settings = make_settings(pricing={"models": CATALOG})
    rows = to_records(cost_change.report(store, settings, replace(Q, by="tenant")))
    _, current = hand_spend(sent, CATALOG)
    assert {r["tenant"] for r in rows} == {"acme"}
    assert deltas(rows) == pytest.approx({**dict.fromkeys(DRIVERS, 0.0), "volume": current}, abs=ZERO)


@pytest.mark.integration
def test_self_hosted_traffic_doubling_on_a_fixed_gpu_bill_is_volume_against_price(
        traffic, store, make_settings) -> None:
    # The deployment's GPU bill is the same in both windows (cost.py shares it by tokens),
    # so twice the requests halve the cost per token: volume +3/4 C, price -3/4 C (Shapley).
    llama = Req(model="llama-3-70b", deployment="llama-prod", input_tokens=2_000, output_tokens=500)
    traffic([llama] * 2, [llama] * 4)
    settings = make_settings(pricing={"models": CATALOG}, deployments=[
        {"name": "llama-prod", "gpus": {"count": 2}, "gpu_hourly_usd": 4.0, "cost_weights": {"output": 3.0}}])
    rows = to_records(cost_change.report(store, settings, Q))
    bill = rows[0]["previous_cost_usd"]
    assert bill > 0 and rows[0]["current_cost_usd"] == pytest.approx(bill, abs=ZERO)
    expected = {**dict.fromkeys(DRIVERS, 0.0), "volume": 0.75 * bill, "price": -0.75 * bill}
    assert deltas(rows) == pytest.approx(expected, abs=ZERO)


@pytest.mark.integration
def test_no_traffic_gives_seven_zero_rows(store, make_settings) -> None:
    rows = to_records(cost_change.report(store, make_settings(pricing={"models": CATALOG}), Q))
    assert deltas(rows) == dict.fromkeys(DRIVERS, 0.0)
    assert math.isclose(rows[0]["total_delta_usd"], 0.0, abs_tol=0.0)
