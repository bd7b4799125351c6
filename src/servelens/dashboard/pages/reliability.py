"""Reliability: errors, retries and the load they add, fallbacks against the primary's
latency budget, and rate limiting, per service."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import dash
import plotly.graph_objects as go
from dash import html

from servelens.dashboard import data, timecharts
from servelens.dashboard.components import (BADGES, LOADING, NO_REQUESTS, NULL, SERIES_COLORS, empty, graph, integer,
                                            metric_bars, ms, page, panel, pct, plain, register_refresh, search_box,
                                            top_table, updated_line)
from servelens.dashboard.timecharts import Chart, Line

dash.register_page(__name__, path="/reliability", name="Reliability", title="Reliability · servelens")

RATE_SERIES = (("error_rate", "Errors"), ("retry_rate", "Retries"), ("fallback_rate", "Fallbacks"),
               ("rate_limited", "Rate limited"))


def _amplification(value: float) -> str:
    return f"{value:,.2f}×"


def _budget_check(row: dict[str, Any]) -> str:
    """Fallback p99 against the primary's budget: over (a flag), within, or unknown (—)."""
    over = row.get("fallback_over_budget")
    if over is None:
        return NULL
    return BADGES["over"] if over else "within"


COLUMNS = (
    ("service", "Service", str), ("requests", "Attempts", integer),
    ("error_rate", "Errors", pct), ("retry_rate", "Retries", pct), ("amplification", "Amplification", _amplification),
    ("fallback_rate", "Fallbacks", pct), ("fallback_latency_p99_ms", "Fallback p99", ms),
    ("primary_budget_ms", "Primary budget", ms), ("budget_check", "Fallback vs budget", plain),
    ("rate_limited", "Rate limited", pct),
)


def rates_figure(top: data.Top) -> go.Figure:
    """The busiest services' rates, and the rest's as one (rates add up, weighted)."""
    n = len(SERIES_COLORS) - 1 if top.other else len(SERIES_COLORS)
    rows = top.rows[:n] + ([top.other] if top.other else [])
    return metric_bars(rows, "service", RATE_SERIES, pct, tickformat=".0%", rangemode="tozero",
                       title_text="share of attempts")


def over_budget_note(rows: list[dict[str, Any]]) -> html.Div | None:
    over = [r.get("service") or "(none)" for r in rows if r.get("fallback_over_budget")]
    if not over:
        return None
    return html.Div(f"Fallback p99 exceeds the primary's latency budget: {', '.join(over)}", className="alert")


CHARTS = (
    Chart("rates", "Error, retry and fallback rates over time",
          (Line("error_rate", "errors"), Line("retry_rate", "retries", dash="dot"),
           Line("fallback_rate", "fallbacks", dash="dash")), unit="%"),
    Chart("limited", "Rate-limited (429) requests over time", (Line("rate_limited", "429s", "service"),)),
)


def layout(**_query: str) -> html.Div:
    return page(
        "rel", "Reliability",
        html.Div(id="rel-over-budget"),
        timecharts.charts_row("rel", CHARTS),
        panel("By service", search_box("rel-search", "services"), html.Div(id="rel-table", children=LOADING),
              extra_class="gap-below"),
        panel("Error, retry, fallback and rate-limit rates", html.Div(id="rel-chart")),
    )


def fetch(source: data.DataSource, filters: data.Filters, search: str | None) -> data.Top:
    # over budget first: a small service past its budget is not cut off behind busy ones
    return source.top("reliability", filters, "service", ("fallback_over_budget", "requests"), search)


def render(top: data.Top, filters: data.Filters) -> tuple:
    chart = graph(rates_figure(top)) if top.rows else empty(NO_REQUESTS)
    shown = replace(top, rows=[{**r, "budget_check": _budget_check(r)} for r in top.rows])
    return (top_table(shown, COLUMNS, NO_REQUESTS, "services", "budget check, then attempts"),
            chart, over_budget_note(top.rows), updated_line(filters))


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "rel", ("table", "chart", "over-budget", "updated"), fetch, render, controls=("search",))
    timecharts.register(app, "rel", CHARTS)
