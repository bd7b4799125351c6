"""Reliability: errors, retries and the load they add, fallbacks against the primary's
latency budget, and rate limiting, per service."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from dashboard import data
from dashboard.pages.latency import badge, graph, metric_bars
from dashboard.pages.overview import LOADING, NULL, REFRESH_MS, _int, _ms, _pct, table

dash.register_page(__name__, path="/reliability", name="Reliability", title="Reliability · servelens")

log = logging.getLogger(__name__)

RATE_SERIES = (("error_rate", "Errors"), ("retry_rate", "Retries"), ("fallback_rate", "Fallbacks"),
               ("rate_limited", "Rate limited"))


def _amplification(value: float) -> str:
    return f"{value:,.2f}×"


def _budget_check(row: dict[str, Any]) -> Any:
    """Fallback p99 against the primary's budget: over, within, or unknown (—)."""
    over = row.get("fallback_over_budget")
    if over is None:
        return NULL
    return badge("over") if over else html.Span("within", className="muted")


COLUMNS = (
    ("service", "Service", str), ("requests", "Attempts", _int),
    ("error_rate", "Errors", _pct), ("retry_rate", "Retries", _pct), ("amplification", "Amplification", _amplification),
    ("fallback_rate", "Fallbacks", _pct), ("fallback_latency_p99_ms", "Fallback p99", _ms),
    ("primary_budget_ms", "Primary budget", _ms), ("budget_check", "Fallback vs budget", lambda v: v),
    ("rate_limited", "Rate limited", _pct),
)


def rates_figure(rows: list[dict[str, Any]]) -> go.Figure:
    return metric_bars(rows, "service", RATE_SERIES, _pct, tickformat=".0%", rangemode="tozero",
                       title_text="share of attempts")


def over_budget_note(rows: list[dict[str, Any]]) -> html.Div | None:
    over = [r.get("service") or "(none)" for r in rows if r.get("fallback_over_budget")]
    if not over:
        return None
    return html.Div(f"Fallback p99 exceeds the primary's latency budget: {', '.join(over)}", className="alert")


def layout(**_query: str) -> html.Div:
    return html.Div(className="page", children=[
        html.Div(className="page-header", children=[
            html.H1("Reliability"),
            html.Span(id="rel-updated", className="muted"),
        ]),
        html.Div(id="rel-alert"),
        html.Div(id="rel-over-budget"),
        html.Section(className="panel", style={"marginBottom": "12px"}, children=[
            html.H2("By service"), html.Div(id="rel-table", children=LOADING)]),
        html.Section(className="panel", children=[
            html.H2("Error, retry, fallback and rate-limit rates"), html.Div(id="rel-chart")]),
        dcc.Interval(id="rel-refresh", interval=REFRESH_MS),
    ])


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(
        Output("rel-table", "children"),
        Output("rel-chart", "children"),
        Output("rel-over-budget", "children"),
        Output("rel-updated", "children"),
        Output("rel-alert", "children"),
        Input(data.FILTERS_ID, "data"),
        Input("rel-refresh", "n_intervals"),
    )
    def refresh(filters_data: dict[str, Any] | None, _tick: int | None) -> tuple:
        filters = data.Filters.from_store(filters_data)
        try:
            rows = data.current().rows("reliability", filters, by="service")
        except Exception as exc:  # noqa: BLE001 - keep the last numbers, say why they are stale
            log.exception("reliability refresh failed")
            alert = html.Div(f"Could not load data: {exc}", className="alert")
            return dash.no_update, dash.no_update, dash.no_update, dash.no_update, alert
        updated = f"Last {data.RANGE_LABELS[filters.range]} · updated {datetime.now(timezone.utc):%H:%M:%S} UTC"
        chart = graph(rates_figure(rows)) if rows else html.Div("No requests in this window.", className="empty")
        return (table([{**r, "budget_check": _budget_check(r)} for r in rows], COLUMNS, "No requests in this window."),
                chart, over_budget_note(rows), updated, None)
