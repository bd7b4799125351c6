"""Overview: the six numbers of SPEC 8, the binding constraint, and where time and money go."""

from __future__ import annotations

import logging
import math
from datetime import datetime, timezone
from typing import Any, Callable

import dash
from dash import Input, Output, dcc, html

from dashboard import data

dash.register_page(__name__, path="/", name="Overview", title="Overview · servelens")

log = logging.getLogger(__name__)

REFRESH_MS = 10_000
NULL = "—"  # a null number: no data for it in the window, never a zero
LOADING = "…"


def _ms(value: float) -> str:
    return f"{value:,.1f} ms" if value < 10 else f"{value:,.0f} ms"


def _pct(value: float) -> str:
    return f"{value * 100:.1f} %"


def _usd(value: float) -> str:
    # Per-request costs are often fractions of a cent: keep three significant digits.
    if value == 0 or abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.{max(2, 2 - math.floor(math.log10(abs(value))))}f}"


def _int(value: float) -> str:
    return f"{int(value):,}"


def _show(value: Any, fmt: Callable[[Any], str]) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NULL
    return fmt(value)


# (report field, label, formatter, hint) for the six headline cards, in SPEC 8's order.
CARDS = (
    ("ttft_p99_ms", "TTFT p99", _ms, "time to first token"),
    ("latency_p99_ms", "Latency p99", _ms, "end to end"),
    ("error_rate", "Error rate", _pct, "of requests"),
    ("retry_rate", "Retry rate", _pct, "of requests are retries"),
    ("cost_per_request_usd", "Cost / request", _usd, "priced requests"),
    ("gpu_utilization", "GPU utilization", _pct, "mean over GPUs"),
)
LATENCY_COLUMNS = (
    ("model", "Model", str), ("requests", "Requests", _int),
    ("ttft_p50_ms", "TTFT p50", _ms), ("ttft_p99_ms", "TTFT p99", _ms),
    ("latency_p50_ms", "Latency p50", _ms), ("latency_p95_ms", "p95", _ms), ("latency_p99_ms", "p99", _ms),
    ("tpot_p50_ms", "TPOT p50", _ms),
)
COST_COLUMNS = (
    ("tenant", "Tenant", str), ("requests", "Requests", _int),
    ("input_tokens", "Input tok", _int), ("output_tokens", "Output tok", _int),
    ("cost_usd", "Cost", _usd), ("cost_per_request_usd", "Per request", _usd),
    ("retry_cost_usd", "Retries", _usd), ("error_cost_usd", "Errors", _usd),
    ("unpriced_requests", "Unpriced", _int),
)


def _card(key: str, label: str, value: str, hint: str, extra_class: str = "") -> html.Div:
    return html.Div(className=f"card {extra_class}".strip(), id=f"ov-card-{key}", children=[
        html.Div(label, className="card-label"),
        html.Div(value, className="card-value", id=f"ov-{key}"),
        html.Div(hint, className="card-hint"),
    ])


def cards(row: dict[str, Any] | None) -> list[html.Div]:
    """The headline cards for an overview row (None: not loaded yet)."""
    def text(key: str, fmt: Callable[[Any], str]) -> str:
        return LOADING if row is None else _show(row.get(key), fmt)

    return [
        *(_card(key, label, text(key, fmt), hint) for key, label, fmt, hint in CARDS),
        _card("requests", "Requests", text("requests", _int), "in the window", "card-secondary"),
        _card("binding_constraint", "Binding constraint", text("binding_constraint", str),
              "stage nearest its p99 budget", "card-secondary"),
    ]


def table(rows: list[dict[str, Any]], columns: tuple, empty: str) -> html.Div | html.Table:
    if not rows:
        return html.Div(empty, className="empty")
    numeric = {key for key, _, fmt in columns if fmt is not str}
    return html.Table(className="data-table", children=[
        html.Thead(html.Tr([html.Th(label, className="num" if key in numeric else None)
                            for key, label, _ in columns])),
        html.Tbody([
            html.Tr([html.Td(_show(row.get(key), fmt) if fmt is not str else (row.get(key) or "(none)"),
                             className="num" if key in numeric else None)
                     for key, _, fmt in columns])
            for row in rows
        ]),
    ])


def layout(**_query: str) -> html.Div:
    return html.Div(className="page", children=[
        html.Div(className="page-header", children=[
            html.H1("Overview"),
            html.Span(id="overview-updated", className="muted"),
        ]),
        html.Div(id="overview-alert"),
        html.Div(cards(None), id="overview-cards", className="cards"),
        html.Div(className="panels", children=[
            html.Section(className="panel", children=[
                html.H2("Latency by model"), html.Div(id="overview-latency", children=LOADING)]),
            html.Section(className="panel", children=[
                html.H2("Cost by tenant"), html.Div(id="overview-cost", children=LOADING)]),
        ]),
        dcc.Interval(id="overview-refresh", interval=REFRESH_MS),
    ])


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(
        Output("overview-cards", "children"),
        Output("overview-latency", "children"),
        Output("overview-cost", "children"),
        Output("overview-updated", "children"),
        Output("overview-alert", "children"),
        Input(data.FILTERS_ID, "data"),
        Input("overview-refresh", "n_intervals"),
    )
    def refresh(filters_data: dict[str, Any] | None, _tick: int | None) -> tuple:
        filters = data.Filters.from_store(filters_data)
        source = data.current()
        try:
            overview = source.report("overview", filters)["rows"]
            latency = source.report("latency", filters, by="model")["rows"]
            cost = source.report("cost", filters, by="tenant")["rows"]
        except Exception as exc:  # noqa: BLE001 - keep the last numbers, say why they are stale
            log.exception("overview refresh failed")
            alert = html.Div(f"Could not load data: {exc}", className="alert")
            return dash.no_update, dash.no_update, dash.no_update, dash.no_update, alert
        updated = f"Last {data.RANGE_LABELS[filters.range]} · updated {datetime.now(timezone.utc):%H:%M:%S} UTC"
        return (cards(overview[0] if overview else {}),
                table(latency, LATENCY_COLUMNS, "No requests in this window."),
                table(cost, COST_COLUMNS, "No requests in this window."),
                updated, None)
