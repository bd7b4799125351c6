"""Workload: how traffic arrives and what it asks for, per service."""

from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import html

from servelens.dashboard import data, timecharts
from servelens.dashboard.components import (LOADING, NO_REQUESTS, empty, graph, integer, metric_bars, page, panel, pct,
                                            register_refresh, search_box, top_table, updated_line)
from servelens.dashboard.timecharts import Chart, Line

dash.register_page(__name__, path="/workload", name="Workload", title="Workload · servelens")

TOKEN_SERIES = (("input_tokens_p50", "Input p50"), ("input_tokens_p99", "Input p99"),
                ("output_tokens_p50", "Output p50"), ("output_tokens_p99", "Output p99"))
ARRIVAL_SERIES = (("arrival_rps_mean", "Mean"), ("arrival_rps_peak", "Peak second"))


def _rps(value: float) -> str:
    """A rate in the largest unit that keeps it at 1 or above (sparse traffic: per hour)."""
    if value >= 1:
        return f"{value:,.1f}/s"
    if value * 60 >= 1:
        return f"{value * 60:,.1f}/min"
    return f"{value * 3600:,.2f}/h"


def _ratio(value: float) -> str:
    return f"{value:,.1f}×"


def _tokens(value: float) -> str:
    return f"{value:,.0f}"  # interpolated quantiles: round, don't truncate


def _prompt_output(value: float) -> str:
    return f"{value:,.1f} : 1"


COLUMNS = (
    ("service", "Service", str), ("requests", "Requests", integer),
    ("arrival_rps_mean", "Arrivals mean", _rps), ("arrival_rps_peak", "Peak", lambda v: f"{v:,}/s"),
    ("peak_to_average", "Peak/avg (1 min)", _ratio), ("burstiness", "Burstiness", lambda v: f"{v:,.2f}"),
    ("input_tokens_p50", "Input p50", _tokens), ("input_tokens_p99", "Input p99", _tokens),
    ("output_tokens_p50", "Output p50", _tokens), ("output_tokens_p99", "Output p99", _tokens),
    ("prompt_to_output_ratio", "Prompt:output", _prompt_output),
    ("prefix_reuse_rate", "Prefix reuse", pct), ("batch_share", "Batch", pct),
)


def tokens_figure(rows: list[dict[str, Any]]) -> go.Figure:
    return metric_bars(rows, "service", TOKEN_SERIES, _tokens, rangemode="tozero", title_text="tokens per request")


def arrivals_figure(rows: list[dict[str, Any]]) -> go.Figure:
    # log: the mean and the peak second are often orders of magnitude apart
    return metric_bars(rows, "service", ARRIVAL_SERIES, _rps, type="log", dtick=1,
                       title_text="requests per second (log)")


CHARTS = (
    Chart("arrivals", "Arrival rate over time (requests/s)", (Line("arrival_rps", "arrivals", "service"),)),
    Chart("tokens", "Tokens over time", (Line("input_tokens", "input"), Line("output_tokens", "output", dash="dot"))),
)


def layout(**_query: str) -> html.Div:
    return page(
        "wl", "Workload shape",
        timecharts.charts_row("wl", CHARTS),
        panel("By service", search_box("wl-search", "services"), html.Div(id="wl-table", children=LOADING),
              extra_class="gap-below"),
        html.Div(className="panels", children=[
            panel("Arrivals", html.Div(id="wl-arrivals")),
            panel("Tokens per request", html.Div(id="wl-tokens")),
        ]),
    )


def fetch(source: data.DataSource, filters: data.Filters, search: str | None) -> data.Top:
    return source.top("workload", filters, "service", "requests", search)


def render(top: data.Top, filters: data.Filters) -> tuple:
    # The charts draw the busiest services only: peaks and percentiles do not add up.
    rows = top.rows
    return (top_table(top, COLUMNS, NO_REQUESTS, "services", "requests"),
            graph(arrivals_figure(rows)) if rows else empty(NO_REQUESTS),
            graph(tokens_figure(rows)) if rows else empty(NO_REQUESTS), updated_line(filters))


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "wl", ("table", "arrivals", "tokens", "updated"), fetch, render, controls=("search",))
    timecharts.register(app, "wl", CHARTS)
