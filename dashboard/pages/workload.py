"""Workload: how traffic arrives and what it asks for, per service."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from dashboard import data
from dashboard.pages.latency import graph, metric_bars
from dashboard.pages.overview import LOADING, REFRESH_MS, _int, _pct, table

dash.register_page(__name__, path="/workload", name="Workload", title="Workload · servelens")

log = logging.getLogger(__name__)

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
    ("service", "Service", str), ("requests", "Requests", _int),
    ("arrival_rps_mean", "Arrivals mean", _rps), ("arrival_rps_peak", "Peak", lambda v: f"{v:,}/s"),
    ("peak_to_average", "Peak/avg", _ratio), ("burstiness", "Burstiness", lambda v: f"{v:,.2f}"),
    ("input_tokens_p50", "Input p50", _tokens), ("input_tokens_p99", "Input p99", _tokens),
    ("output_tokens_p50", "Output p50", _tokens), ("output_tokens_p99", "Output p99", _tokens),
    ("prompt_to_output_ratio", "Prompt:output", _prompt_output),
    ("prefix_reuse_rate", "Prefix reuse", _pct), ("batch_share", "Batch", _pct),
)


def tokens_figure(rows: list[dict[str, Any]]) -> go.Figure:
    return metric_bars(rows, "service", TOKEN_SERIES, _tokens, rangemode="tozero", title_text="tokens per request")


def arrivals_figure(rows: list[dict[str, Any]]) -> go.Figure:
    # log: the mean and the peak second are often orders of magnitude apart
    return metric_bars(rows, "service", ARRIVAL_SERIES, _rps, type="log", dtick=1,
                       title_text="requests per second (log)")


def layout(**_query: str) -> html.Div:
    return html.Div(className="page", children=[
        html.Div(className="page-header", children=[
            html.H1("Workload shape"),
            html.Span(id="wl-updated", className="muted"),
        ]),
        html.Div(id="wl-alert"),
        html.Section(className="panel", style={"marginBottom": "12px"}, children=[
            html.H2("By service"), html.Div(id="wl-table", children=LOADING)]),
        html.Div(className="panels", children=[
            html.Section(className="panel", children=[html.H2("Arrivals"), html.Div(id="wl-arrivals")]),
            html.Section(className="panel", children=[html.H2("Tokens per request"), html.Div(id="wl-tokens")]),
        ]),
        dcc.Interval(id="wl-refresh", interval=REFRESH_MS),
    ])


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(
        Output("wl-table", "children"),
        Output("wl-arrivals", "children"),
        Output("wl-tokens", "children"),
        Output("wl-updated", "children"),
        Output("wl-alert", "children"),
        Input(data.FILTERS_ID, "data"),
        Input("wl-refresh", "n_intervals"),
    )
    def refresh(filters_data: dict[str, Any] | None, _tick: int | None) -> tuple:
        filters = data.Filters.from_store(filters_data)
        try:
            rows = data.current().rows("workload", filters, by="service")
        except Exception as exc:  # noqa: BLE001 - keep the last numbers, say why they are stale
            log.exception("workload refresh failed")
            alert = html.Div(f"Could not load data: {exc}", className="alert")
            return dash.no_update, dash.no_update, dash.no_update, dash.no_update, alert
        updated = f"Last {data.RANGE_LABELS[filters.range]} · updated {datetime.now(timezone.utc):%H:%M:%S} UTC"
        empty = html.Div("No requests in this window.", className="empty")
        return (table(rows, COLUMNS, "No requests in this window."),
                graph(arrivals_figure(rows)) if rows else empty,
                graph(tokens_figure(rows)) if rows else empty, updated, None)
