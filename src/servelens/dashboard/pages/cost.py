"""Cost: spend by business unit (busy or fully loaded), what retries and errors waste, cost
per outcome, and what changed since the previous window."""

from __future__ import annotations

import itertools
from typing import Any

import dash
import plotly.graph_objects as go
from dash import dcc, html

from servelens.dashboard import data, timecharts, traces_links
from servelens.dashboard.components import (FONT, LOADING, NO_REQUESTS, NULL, DataBar, card, chart_layout, empty, graph,
                                            integer, label, ms, page, pct, plain, register_refresh, search_box, table,
                                            top_table, updated_line, usd)
from servelens.dashboard.timecharts import CONTROL, Chart, Line

dash.register_page(__name__, path="/cost", name="Cost", title="Cost · servelens")

CHANGE_REPORT = "cost-change"
BY_OPTIONS = {"tenant": "Tenant", "feature": "Feature", "team": "Team", "model": "Model",
              "deployment": "Deployment", "outcome": "Outcome"}
VIEWS = {"busy": "Busy", "fully_loaded": "Fully loaded"}
DRIVER_LABELS = {"volume": "Volume", "retries": "Retries", "model_mix": "Model<br>mix",
                 "input_length": "Input<br>length", "output_length": "Output<br>length", "errors": "Errors",
                 "price": "Price"}
USEFUL_COLOR, WASTED_COLOR, UP_COLOR, DOWN_COLOR, TOTAL_COLOR = "#2f6fed", "#e8a09a", "#c0392b", "#2d9a5b", "#6b7385"
CHART_HEIGHT = 320
PRICES_NOTE = ("Priced by: config (pricing.models) first, then the genai-prices catalog for the models the config "
               "does not name; gpu: a self-hosted deployment's GPU cost. Price since: when the newest price "
               "applied took effect, where known. servelens prices --models … shows how a model resolves.")


def day(value: str) -> str:
    """An ISO timestamp's date (prices change on days; config times are kept in the API)."""
    return value[:10]


def _columns(by: str) -> tuple:
    columns = (
        (by, BY_OPTIONS[by], str), ("requests", "Requests", integer),
        ("input_tokens", "Input tok", integer), ("output_tokens", "Output tok", integer),
        ("cost_usd", "Cost", usd), ("cost_per_request_usd", "Per request", usd),
        ("retry_cost_usd", "Retries", usd), ("error_cost_usd", "Errors", usd),
        ("wasted_share", "Wasted", pct), ("unpriced_requests", "Unpriced", integer),
        ("price_source", "Priced by", plain), ("price_updated", "Price since", day),
    )
    if by == "outcome":
        columns += (("outcomes", "Outcomes", integer), ("cost_per_outcome_usd", "Per outcome", usd))
    return columns


def summary_cards(rows: list[dict[str, Any]], by: str) -> list[html.Div]:
    spend = sum(r.get("cost_usd") or 0.0 for r in rows)
    wasted = sum((r.get("cost_usd") or 0.0) * (r.get("wasted_share") or 0.0) for r in rows)
    requests = sum(r.get("requests") or 0 for r in rows)
    priced = requests - sum(r.get("unpriced_requests") or 0 for r in rows)
    priced_any = any(r.get("cost_usd") is not None for r in rows)
    cards = [
        card("cost-total", "Spend", usd(spend) if priced_any else NULL, "priced requests"),
        card("cost-per-request", "Cost / request", usd(spend / priced) if priced and priced_any else NULL,
             "priced requests"),
        card("cost-wasted", "Wasted share", pct(wasted / spend) if spend else NULL,
             f"{usd(wasted)} on retries and errors" if spend else "retries and errors"),
        card("cost-unpriced", "Unpriced", integer(requests - priced), "requests without a price", "card-secondary"),
    ]
    if by == "outcome":
        outcomes = sum(r.get("outcomes") or 0 for r in rows)
        cards.insert(2, card("cost-per-outcome", "Cost / outcome", usd(spend / outcomes) if outcomes else NULL,
                             f"{integer(outcomes)} completed outcomes"))
    return cards


def _wasted(row: dict[str, Any]) -> float:
    return (row.get("cost_usd") or 0.0) * (row.get("wasted_share") or 0.0)


# The table's cost cells carry bars on one scale, the part wasted on retries and errors in red.
COST_BARS = (DataBar("cost_usd", lambda row: ((None if row.get("cost_usd") is None else row["cost_usd"] - _wasted(row),
                                                USEFUL_COLOR), (_wasted(row), WASTED_COLOR))),)


def _signed(value: float) -> str:
    return ("+" if value > 0 else "−" if value < 0 else "") + usd(abs(value))


def change_figure(rows: list[dict[str, Any]], range_label: str) -> go.Figure:
    """A waterfall drawn as floating bars (plotly.js' bar with a base): the previous
    total, each driver from the running total, the last total. The pages' plotly.js
    bundle has no waterfall trace (dashboard.plotly_bundle)."""
    previous, current = rows[0]["previous_cost_usd"], rows[0]["current_cost_usd"]
    labels = [f"Previous<br>{range_label}", *(DRIVER_LABELS.get(r["driver"], label(r["driver"])) for r in rows),
              f"Last<br>{range_label}"]
    deltas = [r["delta_usd"] for r in rows]
    bases, running = [], previous
    for delta in deltas:
        bases.append(running)
        running += delta
    fig = go.Figure(go.Bar(
        x=labels, y=[previous, *deltas, current], base=[0, *bases, 0],
        marker_color=[TOTAL_COLOR, *(UP_COLOR if d > 0 else DOWN_COLOR for d in deltas), TOTAL_COLOR],
        text=[usd(previous), *(_signed(d) for d in deltas), usd(current)], textposition="outside",
        textfont=dict(size=11, color=FONT["color"]), cliponaxis=False,
        hovertemplate="%{x}: %{text}<extra></extra>"))
    fig.update_layout(**chart_layout(CHART_HEIGHT, showlegend=False))
    fig.update_yaxes(tickprefix="$", rangemode="tozero")
    fig.update_xaxes(tickangle=0)
    return fig


def change_panel(rows: list[dict[str, Any]], range_label: str) -> html.Div | list:
    if not rows or not (rows[0]["previous_cost_usd"] or rows[0]["current_cost_usd"]):
        return empty("No priced requests in this window or the one before it.")
    total = rows[0]["total_delta_usd"]
    previous = rows[0]["previous_cost_usd"]
    relative = f" ({total / previous:+.1%})" if previous else ""
    return [
        html.Div(className="muted", id="cost-change-total", children=(
            f"Previous {range_label}: {usd(previous)} → last {range_label}: {usd(rows[0]['current_cost_usd'])}, "
            f"{_signed(total)}{relative}. Drivers sum to the change.")),
        graph(change_figure(rows, range_label)),
    ]


# The cache report's rows (analytics/reports/cache.py), one kind of cache each.
CACHE_KINDS = {"provider": "Provider prompt cache", "prefix": "Prefix KV cache (vLLM)",
               "response": "Response cache (app.cache.hit)"}


def _seconds(value: float) -> str:
    return f"{value:,.1f} s"


CACHE_COLUMNS = (
    ("what", "Cache", str), ("key", "Model / deployment / service", str), ("unit", "Counted in", plain),
    ("lookups", "Looked up", integer), ("hits", "Hits", integer), ("writes", "Written", integer),
    ("hit_rate", "Hit rate", pct), ("saved_usd", "Saved", usd), ("saved_prefill_s", "Prefill saved", _seconds),
    ("note", "Note", plain),
)
NO_CACHE = ("No caching measured in this window: no cached input tokens from a provider, no vLLM "
            "prefix-cache counters, no spans with app.cache.hit.")


def cache_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cache report's rows as the panel lists them: caches that saw a lookup, the
    largest saving first within each kind (an unpriced saving last, never as 0)."""
    shown = [{**r, "what": CACHE_KINDS.get(r["kind"], r["kind"])} for r in rows if r.get("lookups")]
    order = {kind: i for i, kind in enumerate(CACHE_KINDS)}
    return sorted(shown, key=lambda r: (order.get(r["kind"], len(order)), r.get("saved_usd") is None,
                                        -(r.get("saved_usd") or 0.0), str(r.get("key"))))


def cache_panel(rows: list[dict[str, Any]], n: int = data.TOP_N) -> Any:
    """The first n rows of each kind (thousands of models would be thousands of rows), and
    how many more there are."""
    listed = cache_rows(rows)  # sorted by kind
    shown = [r for _, group in itertools.groupby(listed, key=lambda r: r["kind"]) for r in list(group)[:n]]
    more = len(listed) - len(shown)
    note = html.Div(f"{more:,} more not listed (the cache report has them all: GET /api/v1/reports/cache)",
                    className="muted", id="cost-cache-more") if more else None
    return [table(shown, CACHE_COLUMNS, NO_CACHE), note]


# The context report's rows (analytics/reports/context.py): parts of the prompt per service,
# and latency and quality by context size.
PART_LABELS = {"system": "System prompt", "history": "Conversation history", "tool_results": "Tool results",
               "retrieved": "Retrieved passages", "question": "Question", "other": "Other (not counted by part)"}
CONTEXT_PART_COLUMNS = (
    ("key", "Service", str), ("what", "Part of the prompt", str), ("tokens", "Input tok", integer),
    ("token_share", "Share of input", pct), ("cost_usd", "Cost", usd), ("cost_share", "Share of cost", pct),
    ("basis", "Split", plain), ("note", "Note", plain),
)
CONTEXT_SIZE_COLUMNS = (
    ("key", "Context size (input tok)", str), ("requests", "Requests", integer),
    ("latency_p50_ms", "Latency p50", ms), ("latency_p99_ms", "Latency p99", ms), ("ttft_p50_ms", "TTFT p50", ms),
    ("evaluations", "Evaluated", integer), ("pass_rate", "Pass rate", pct),
    ("retrieved_share", "Retrieved share", pct),
)
NO_CONTEXT = "No successful LLM requests in this window."


def _basis(row: dict[str, Any]) -> str:
    covered, measured = row.get("covered") or 0, row.get("measured") or 0
    if not covered:
        return f"unknown for {integer(row.get('requests'))} requests"
    how = "measured" if measured == covered else "estimated" if not measured else f"{integer(measured)} measured"
    return f"{how}, {integer(covered)} of {integer(row.get('requests'))} requests"


def context_panel(rows: list[dict[str, Any]], n: int = data.TOP_N) -> list:
    """The parts of the first n services (most input tokens first), each service's parts
    largest first; then the size classes."""
    parts = [r for r in rows if r["kind"] == "part"]
    totals: dict[str, float] = {}
    for r in parts:
        totals[r["key"]] = totals.get(r["key"], 0.0) + (r.get("tokens") or 0.0)
    services = sorted(totals, key=lambda k: (-totals[k], k))
    shown = [{**r, "what": PART_LABELS.get(r["part"], r["part"] or "(split unknown)"), "basis": _basis(r)}
             for key in services[:n] for r in parts if r["key"] == key]
    more = len(services) - min(len(services), n)
    note = html.Div(f"{more:,} more services not listed (GET /api/v1/reports/context has them all)",
                    className="muted", id="cost-context-more") if more else None
    return [table(shown, CONTEXT_PART_COLUMNS, NO_CONTEXT), note,
            html.H3("Latency and quality by context size"),
            table([r for r in rows if r["kind"] == "size"], CONTEXT_SIZE_COLUMNS, NO_CONTEXT)]


CHARTS = (
    Chart("spend", "Spend over time", (Line("cost_usd", "spend", CONTROL),), unit="$", stacked=True, control="by"),
    Chart("per-request", "Cost per request over time", (Line("cost_per_request_usd", "per request"),), unit="$"),
)


def layout(**_query: str) -> html.Div:
    return page(
        "cost", "Cost",
        html.Div(className="toolbar", children=[
            html.Span("Group by", className="muted"),
            dcc.Dropdown(id="cost-by", className="filter-dropdown", clearable=False, searchable=False, value="tenant",
                         options=[{"label": v, "value": k} for k, v in BY_OPTIONS.items()],
                         persistence=True, persistence_type="session"),
            html.Span("GPU cost", className="muted toolbar-group"),
            dcc.RadioItems(id="cost-view", inline=True, value="busy",
                           options=[{"label": v, "value": k} for k, v in VIEWS.items()],
                           persistence=True, persistence_type="session"),
            search_box("cost-search", "groups"),
        ]),
        html.Div(id="cost-cards", className="cards"),
        timecharts.charts_row("cost", CHARTS),
        html.Section(className="panel", children=[html.H2("What changed"), html.Div(id="cost-change-alert"),
                                                  html.Div(id="cost-change", children=LOADING)]),
        html.Section(className="panel gap-above", children=[
            html.H2(id="cost-title", children="Spend"),
            html.Div("Bars: each group's spend on one scale, the part wasted on retries and errors in red.",
                     className="muted table-note"),
            html.Div(id="cost-table", children=LOADING),
            html.Div(PRICES_NOTE, className="muted table-note", id="cost-prices-note")]),
        html.Section(className="panel gap-above", children=[
            html.H2("What caching saves"), html.Div(id="cost-cache-alert"),
            html.Div(id="cost-cache", children=LOADING),
            html.Div("Provider: input tokens read from (and written to) the provider's prompt cache, saved against "
                     "the full input price. Prefix KV: vLLM's prefix-cache tokens and the prefill time they did "
                     "not cost (an upper bound). Response: lookups of spans with app.cache.hit, each hit valued "
                     "at its service's mean cost per request.", className="muted table-note"),
        ]),
        html.Section(className="panel gap-above", children=[
            html.H2("Where the prompt's tokens go"), html.Div(id="cost-context-alert"),
            html.Div(id="cost-context", children=LOADING),
            html.Div("Measured: the application's own token counts per part (context.parts in the config). "
                     "Estimated: the captured messages split by role (system, tool results, the last user "
                     "message as the question, the rest history), with passages a retriever returned earlier "
                     "in the trace counted as retrieved. Cost: the part's tokens at the service's mean input "
                     "price; its share of the whole cost of the requests split.", className="muted table-note"),
        ]),
    )


def fetch(source: data.DataSource, filters: data.Filters, by: str | None, view: str | None,
          search: str | None) -> tuple:
    by = by if by in BY_OPTIONS else "tenant"
    view = view if view in VIEWS else "busy"
    return by, view, source.top("cost", filters, by, "cost_usd", search, view=view)


def render(fetched: tuple, filters: data.Filters) -> tuple:
    by, view, top = fetched
    title = f"Spend by {BY_OPTIONS[by].lower()} ({VIEWS[view].lower()})"
    # The cards add up every group, whatever the table's filter shows.
    return (summary_cards([top.total], by), title,
            traces_links.link_keys(top_table(top, _columns(by), NO_REQUESTS, f"{BY_OPTIONS[by].lower()}s", "cost",
                                             COST_BARS),
                                   top.with_other(), by, lambda row: traces_links.costliest(filters, by, row[by])),
            updated_line(filters, VIEWS[view].lower()))


def fetch_cache(source: data.DataSource, filters: data.Filters) -> list[dict[str, Any]]:
    return source.rows("cache", filters)


def fetch_context(source: data.DataSource, filters: data.Filters) -> list[dict[str, Any]]:
    return source.rows("context", filters)


def fetch_change(source: data.DataSource, filters: data.Filters) -> list[dict[str, Any]]:
    return source.rows(CHANGE_REPORT, filters)


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "cost", ("cards", "title", "table", "updated"), fetch, render,
                     controls=("by", "view", "search"))
    timecharts.register(app, "cost", CHARTS)
    register_refresh(app, "cost", ("cache",), fetch_cache, lambda rows, _filters: (cache_panel(rows),),
                     alert_name="cache-alert")
    register_refresh(app, "cost", ("context",), fetch_context, lambda rows, _filters: (context_panel(rows),),
                     alert_name="context-alert")
    # Its own refresh: the change's decomposition can take far longer than the spend itself.
    register_refresh(app, "cost", ("change",), fetch_change,
                     lambda rows, filters: (change_panel(rows, filters.range_label),),
                     alert_name="change-alert")
