"""What the dashboard's pages share: number formatters, the table, headline cards, badges,
chart helpers, and the one refresh callback every page registers.

A plain module: unlike a page (which registers itself with Dash Pages on import), it can be
imported without an app, so tests take the formatters from here.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from dashboard import data

log = logging.getLogger(__name__)

REFRESH_MS = 10_000  # every page re-reads its reports this often
NULL = "—"  # a null number: no data for it in the window, never a zero
LOADING = "…"
NO_REQUESTS = "No requests in this window."

# --- Formatters ----------------------------------------------------------------------------


def ms(value: float) -> str:
    return f"{value:,.1f} ms" if value < 10 else f"{value:,.0f} ms"


def pct(value: float) -> str:
    return f"{value * 100:.1f} %"


def usd(value: float) -> str:
    # Per-request costs are often fractions of a cent: keep three significant digits.
    if value == 0 or abs(value) >= 1:
        return f"${value:,.2f}"
    return f"${value:.{max(2, 2 - math.floor(math.log10(abs(value))))}f}"


def integer(value: float) -> str:
    return f"{int(value):,}"


def show(value: Any, fmt: Callable[[Any], str]) -> str:
    """fmt(value), or NULL for a missing number (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NULL
    return fmt(value)


# --- Page building blocks ------------------------------------------------------------------


def empty(text: str) -> html.Div:
    """What a panel shows when the window holds nothing for it."""
    return html.Div(text, className="empty")


def table(rows: list[dict[str, Any]], columns: tuple, empty_text: str) -> html.Div | html.Table:
    """rows as a table of (field, header, formatter) columns; a formatter `str` marks a text
    column (left-aligned, "(none)" for a missing value), any other a number (right-aligned,
    NULL for a missing value)."""
    if not rows:
        return empty(empty_text)
    numeric = {key for key, _, fmt in columns if fmt is not str}
    return html.Table(className="data-table", children=[
        html.Thead(html.Tr([html.Th(label, className="num" if key in numeric else None)
                            for key, label, _ in columns])),
        html.Tbody([
            html.Tr([html.Td(show(row.get(key), fmt) if fmt is not str else (row.get(key) or "(none)"),
                             className="num" if key in numeric else None)
                     for key, _, fmt in columns])
            for row in rows
        ]),
    ])


def card(value_id: str, label: str, value: str, hint: str, extra_class: str = "",
         card_id: str | None = None) -> html.Div:
    """A headline number; the value's element id is `value_id`, the card's `card_id`
    (default `{value_id}-card`). extra_class: e.g. card-secondary, card-idle."""
    return html.Div(className=f"card {extra_class}".strip(), id=card_id or f"{value_id}-card", children=[
        html.Div(label, className="card-label"),
        html.Div(value, className="card-value", id=value_id),
        html.Div(hint, className="card-hint"),
    ])


def page(prefix: str, title: str, *children: Any) -> html.Div:
    """A page as register_refresh expects it: the title with `{prefix}-updated` beside it,
    `{prefix}-alert`, the children, and the `{prefix}-refresh` interval."""
    return html.Div(className="page", children=[
        html.Div(className="page-header", children=[
            html.H1(title),
            html.Span(id=f"{prefix}-updated", className="muted"),
        ]),
        html.Div(id=f"{prefix}-alert"),
        *children,
        dcc.Interval(id=f"{prefix}-refresh", interval=REFRESH_MS),
    ])


def panel(title: Any, *children: Any, extra_class: str = "") -> html.Section:
    """A titled white panel (title: text or components for its h2)."""
    return html.Section(className=f"panel {extra_class}".strip(), children=[html.H2(title), *children])


# kind: text; styled by .badge-<kind>. Trigger states and severities are their own text.
BADGES = {"binding": "binding", "over": "over budget", "regressed": "regressed",
          **{kind: kind for kind in ("active", "resolved", "warning", "critical")}}


def badge(kind: str) -> html.Span:
    return html.Span(BADGES[kind], className=f"badge badge-{kind}")


def updated_line(filters: data.Filters, *details: str) -> str:
    """The page header's note: the window, any details, and when the numbers were read."""
    return " · ".join((f"Last {data.RANGE_LABELS[filters.range]}", *details,
                       f"updated {datetime.now(timezone.utc):%H:%M:%S} UTC"))


# --- Charts --------------------------------------------------------------------------------

FONT = dict(family="-apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, Arial, sans-serif", size=12,
            color="#1d2330")
SERIES_COLORS = ("#2f6fed", "#e08a1e", "#2d9a5b", "#8e6fd8", "#c0392b", "#17a2b8", "#6b7385", "#d35fa0")


def chart_layout(height: int, **extra: Any) -> dict[str, Any]:
    return dict(template="plotly_white", height=height, font=FONT, margin=dict(l=8, r=16, t=28, b=8),
                legend=dict(orientation="h", x=0, y=1.02, yanchor="bottom", traceorder="normal"), **extra)


def graph(figure: go.Figure) -> dcc.Graph:
    return dcc.Graph(figure=figure, config={"displayModeBar": False})


def metric_bars(rows: list[dict[str, Any]], key: str, metrics: tuple[tuple[str, str], ...], text: Any,
                **xaxis: Any) -> go.Figure:
    """Horizontal bars, one group per metric and one colour per `key` value: reads well with
    a few services (the first eight; the tables list all). `text` formats each bar's label;
    xaxis: e.g. type="log"."""
    labels = [label for _, label in metrics]
    fig = go.Figure([
        go.Bar(name=row.get(key) or "(none)", y=labels, x=[row.get(field) for field, _ in metrics], orientation="h",
               marker_color=color, cliponaxis=False, textposition="outside",
               text=[text(row.get(field)) if row.get(field) is not None else "" for field, _ in metrics],
               hovertemplate=f"{row.get(key) or '(none)'} · %{{y}}: %{{text}}<extra></extra>")
        for row, color in zip(rows, SERIES_COLORS)
    ])
    fig.update_layout(**chart_layout(60 + len(metrics) * (18 + 22 * min(len(rows), len(SERIES_COLORS))),
                                     barmode="group", bargap=0.3, showlegend=len(rows) > 1))
    fig.update_layout(margin=dict(r=48))  # room for the labels outside the longest bar
    fig.update_yaxes(autorange="reversed", ticklabelstandoff=6)
    fig.update_xaxes(**xaxis)
    return fig


# --- The refresh callback ------------------------------------------------------------------


def register_refresh(app: dash.Dash, prefix: str, outputs: Sequence[str], fetch: Callable[..., Any],
                     render: Callable[[Any, data.Filters], Sequence[Any]], controls: Sequence[str] = ()) -> None:
    """Register a page's refresh: on the global filters, the page's dcc.Interval
    `{prefix}-refresh` and the value of `{prefix}-{name}` for each name in controls,
    fetch(source, filters, *control values) reads reports through dashboard.data and
    render(fetched, filters) returns the children of `{prefix}-{name}` for each name in
    outputs, in order. When fetch raises, those keep their last children and
    `{prefix}-alert` says why; otherwise the alert is cleared."""
    @app.callback(
        *(Output(f"{prefix}-{name}", "children") for name in outputs),
        Output(f"{prefix}-alert", "children"),
        Input(data.FILTERS_ID, "data"),
        Input(f"{prefix}-refresh", "n_intervals"),
        *(Input(f"{prefix}-{name}", "value") for name in controls),
    )
    def refresh(filters_data: dict[str, Any] | None, _tick: int | None, *values: Any) -> tuple:
        filters = data.Filters.from_store(filters_data)
        try:
            fetched = fetch(data.current(), filters, *values)
        except Exception as exc:  # noqa: BLE001 - keep the last numbers, say why they are stale
            log.exception("refresh of the %s page failed", prefix)
            return (*(dash.no_update,) * len(outputs), html.Div(f"Could not load data: {exc}", className="alert"))
        return (*render(fetched, filters), None)
