"""Overview: the six numbers of SPEC 8, the binding constraint, and where time and money go."""

from __future__ import annotations

from typing import Any, Callable

import dash
from dash import html

from servelens.analytics.reports import overview
from servelens.collector.pipeline.spool import quarantine_summary
from servelens.dashboard import data, timecharts
from servelens.dashboard.components import (LOADING, NO_REQUESTS, card, integer, ms, page, panel, pct,
                                            quarantine_note, register_refresh, search_box, show, top_table,
                                            updated_line, usd)
from servelens.dashboard.timecharts import Chart, Line

dash.register_page(__name__, path="/", name="Overview", title="Overview · servelens")

# (report field, label, formatter, hint) for the six headline cards, in SPEC 8's order.
CARDS = (
    ("ttft_p99_ms", "TTFT p99", ms, "time to first token"),
    ("latency_p99_ms", "Latency p99", ms, "end to end"),
    ("error_rate", "Error rate", pct, "of requests"),
    ("retry_rate", "Retry rate", pct, "of requests are retries"),
    ("cost_per_request_usd", "Cost / request", usd, "priced requests"),
    ("gpu_utilization", "GPU utilization", pct, "mean over GPUs"),
)
LATENCY_COLUMNS = (
    ("model", "Model", str), ("requests", "Requests", integer),
    ("ttft_p50_ms", "TTFT p50", ms), ("ttft_p99_ms", "TTFT p99", ms),
    ("latency_p50_ms", "Latency p50", ms), ("latency_p95_ms", "p95", ms), ("latency_p99_ms", "p99", ms),
    ("tpot_p50_ms", "TPOT p50", ms),
)
COST_COLUMNS = (
    ("tenant", "Tenant", str), ("requests", "Requests", integer),
    ("input_tokens", "Input tok", integer), ("output_tokens", "Output tok", integer),
    ("cost_usd", "Cost", usd), ("cost_per_request_usd", "Per request", usd),
    ("retry_cost_usd", "Retries", usd), ("error_cost_usd", "Errors", usd),
    ("unpriced_requests", "Unpriced", integer),
)


CHARTS = (
    Chart("requests", "Requests", (Line("requests", "requests"),)),
    Chart("rates", "Error and retry rate", (Line("error_rate", "errors"), Line("retry_rate", "retries", dash="dot")),
          unit="%"),
    Chart("latency", "TTFT and latency", (Line("ttft_p50_ms", "TTFT p50", dash="dot"), Line("ttft_p99_ms", "TTFT p99"),
                                          Line("latency_p50_ms", "latency p50", dash="dot"),
                                          Line("latency_p95_ms", "latency p95", dash="dash"),
                                          Line("latency_p99_ms", "latency p99")), unit="ms"),
    Chart("cost", "Spend", (Line("cost_usd", "spend"),), unit="$"),
    Chart("gpu", "GPU utilization", (Line("gpu_utilization", "utilization"),), unit="%"),
)


def _card(key: str, label: str, value: str, hint: str, extra_class: str = "") -> html.Div:
    return card(f"ov-{key}", label, value, hint, extra_class, card_id=f"ov-card-{key}")


def cards(row: dict[str, Any] | None) -> list[html.Div]:
    """The headline cards for an overview row (None: not loaded yet)."""
    def text(key: str, fmt: Callable[[Any], str]) -> str:
        return LOADING if row is None else show(row.get(key), fmt)

    return [
        *(_card(key, label, text(key, fmt), hint) for key, label, fmt, hint in CARDS),
        _card("requests", "Requests", text("requests", integer), "in the window", "card-secondary"),
    ]


def binding_card(value: str | None, loaded: bool = True, as_of: Any = None) -> html.Div:
    """Its own refresh: per trace, the costliest number of the page at scale."""
    hint = "stage nearest its p99 budget" + (f" (as of {as_of:%H:%M} UTC)" if as_of else "")
    return _card("binding_constraint", "Binding constraint", show(value, str) if loaded else LOADING,
                 hint, "card-secondary")


def layout(**_query: str) -> html.Div:
    return page(
        "overview", "Overview",
        html.Div(className="cards", children=[
            html.Div(cards(None), id="overview-cards", className="cards-part"),
            html.Div(binding_card(None, loaded=False), id="overview-binding", className="cards-part"),
        ]),
        timecharts.charts_row("overview", CHARTS),
        html.Div(id="overview-binding-alert"),
        html.Div(className="panels", children=[
            panel("Latency by model", search_box("overview-latency-search", "models"),
                  html.Div(id="overview-latency-alert"), html.Div(id="overview-latency", children=LOADING)),
            panel("Cost by tenant", search_box("overview-cost-search", "tenants"),
                  html.Div(id="overview-cost-alert"), html.Div(id="overview-cost", children=LOADING)),
        ]),
    )


def fetch_cards(source: data.DataSource, filters: data.Filters) -> tuple[list[dict[str, Any]], dict[str, int]]:
    # the quarantine is the fleet's ingest health: not a tenant viewer's
    quarantine = {"quarantined_batches": 0} if source.restricted else quarantine_summary(source.settings.spool_dir)
    return source.computed(overview.headline, filters), quarantine


def fetch_binding(source: data.DataSource, filters: data.Filters) -> tuple[str | None, Any]:
    """The scheduler's answer for the last 24 h when it is fresh (it computes that window
    every analytics.interval) and saw requests, else computed now: a run over a store that
    was still empty (the first one after a start, before any traffic landed) answers
    nothing for two intervals otherwise."""
    stored = source.scheduled_rows("overview", filters)
    if stored and stored[0] and stored[0][0].get("requests"):
        return stored[0][0].get("binding_constraint"), stored[1]
    return source.value(overview.binding, filters), None


def render_cards(fetched: tuple[list[dict[str, Any]], dict[str, int]], filters: data.Filters) -> tuple:
    rows, quarantine = fetched
    return cards(rows[0] if rows else {}), [updated_line(filters), quarantine_note(quarantine)]


# The Overview summarises: its tables list the first 10 groups (the Latency and Cost pages
# list data.TOP_N); each table's cells are drawn on every load (BENCHMARKS.md, "Dashboard
# load in the browser").
TOP_N = 10


def fetch_latency(source: data.DataSource, filters: data.Filters, search: str | None) -> data.Top:
    return source.top("latency", filters, "model", "requests", search, n=TOP_N)


def fetch_cost(source: data.DataSource, filters: data.Filters, search: str | None) -> data.Top:
    return source.top("cost", filters, "tenant", "cost_usd", search, n=TOP_N)


def register_callbacks(app: dash.Dash) -> None:
    # Three refreshes, not one: they run side by side, and each part shows when it is ready.
    register_refresh(app, "overview", ("cards", "updated"), fetch_cards, render_cards)
    register_refresh(app, "overview", ("binding",), fetch_binding, lambda found, _f: ([binding_card(found[0], as_of=found[1])],),
                     alert_name="binding-alert")
    timecharts.register(app, "overview", CHARTS)
    register_refresh(app, "overview", ("latency",), fetch_latency,
                     lambda top, _f: (top_table(top, LATENCY_COLUMNS, NO_REQUESTS, "models", "requests"),),
                     controls=("latency-search",), alert_name="latency-alert")
    register_refresh(app, "overview", ("cost",), fetch_cost,
                     lambda top, _f: (top_table(top, COST_COLUMNS, NO_REQUESTS, "tenants", "cost"),),
                     controls=("cost-search",), alert_name="cost-alert")
