"""Latency & stages: percentiles by model/service/deployment, and each deployment's stage
p99s against their ceilings with the binding stage marked."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from dashboard import data
from dashboard.pages.overview import LOADING, REFRESH_MS, _int, _ms, table

dash.register_page(__name__, path="/latency", name="Latency & stages", title="Latency & stages · servelens")

log = logging.getLogger(__name__)

BY_OPTIONS = {"model": "Model", "service": "Service", "deployment": "Deployment"}
# Pipeline order; unknown stages follow alphabetically, the end-to-end total last.
STAGE_ORDER = ("queue", "retrieval", "embedding", "tool", "prefill", "decode", "network", "postprocess", "other")
PERCENTILE_COLORS = (("latency_p50_ms", "p50", "#a9c1f5"), ("latency_p95_ms", "p95", "#6d97f0"),
                     ("latency_p99_ms", "p99", "#2f6fed"))
STAGE_COLOR, BINDING_COLOR, OVER_COLOR, HEADROOM_COLOR = "#b8c4da", "#2f6fed", "#c0392b", "#dcefe3"

# --- Chart and card helpers the other pages share (cost, gpus, workload, reliability) ----
FONT = dict(family="-apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, Arial, sans-serif", size=12,
            color="#1d2330")
SERIES_COLORS = ("#2f6fed", "#e08a1e", "#2d9a5b", "#8e6fd8", "#c0392b", "#17a2b8", "#6b7385", "#d35fa0")
BADGE = {"binding": ("binding", "#e7efff", "#2f6fed"), "over": ("over budget", "#fdecea", "#c0392b")}


def badge(kind: str) -> html.Span:
    text, bg, fg = BADGE[kind]
    return html.Span(text, style={"background": bg, "color": fg, "borderRadius": "10px", "padding": "1px 8px",
                                  "fontSize": "12px", "fontWeight": 500, "marginLeft": "4px"})


def card(value_id: str, label: str, value: str, hint: str, extra_class: str = "",
         style: dict[str, str] | None = None, value_style: dict[str, str] | None = None) -> html.Div:
    """A headline number as the overview shows it; the value's element id is `value_id`."""
    return html.Div(className=f"card {extra_class}".strip(), id=f"{value_id}-card", style=style, children=[
        html.Div(label, className="card-label"),
        html.Div(value, className="card-value", id=value_id, style=value_style),
        html.Div(hint, className="card-hint"),
    ])


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


# --- This page ---------------------------------------------------------------------------

def _headroom(value: float) -> str:
    return _ms(value) if value >= 0 else f"{_ms(-value)} over"


def _flags(row: dict[str, Any]) -> list[html.Span]:
    return [badge(kind) for kind, field in (("binding", "binding"), ("over", "over_budget")) if row.get(field)]


def _latency_columns(by: str) -> tuple:
    return (
        (by, BY_OPTIONS[by], str), ("requests", "Requests", _int),
        ("ttft_p50_ms", "TTFT p50", _ms), ("ttft_p95_ms", "TTFT p95", _ms), ("ttft_p99_ms", "TTFT p99", _ms),
        ("latency_p50_ms", "Latency p50", _ms), ("latency_p95_ms", "p95", _ms), ("latency_p99_ms", "p99", _ms),
        ("tpot_p50_ms", "TPOT p50", _ms),
    )


STAGE_COLUMNS = (
    ("stage", "Stage", str), ("p50_ms", "p50", _ms), ("p99_ms", "p99", _ms), ("ceiling_ms", "Ceiling", _ms),
    ("headroom_ms", "Headroom", _headroom), ("flags", "", lambda flags: flags),
)


def latency_figure(rows: list[dict[str, Any]], by: str) -> go.Figure:
    keys = [row.get(by) or "(none)" for row in rows]
    fig = go.Figure([go.Bar(name=label, x=keys, y=[row.get(key) for row in rows], marker_color=color,
                            hovertemplate=f"%{{x}} {label}: %{{y:,.0f}} ms<extra></extra>")
                     for key, label, color in PERCENTILE_COLORS])
    fig.update_layout(**chart_layout(260, barmode="group", bargap=0.3))
    fig.update_yaxes(title_text="end-to-end latency (ms)", rangemode="tozero")
    return fig


def _stage_key(stage: str) -> tuple[int, str]:
    if stage == "total":
        return (len(STAGE_ORDER) + 1, stage)
    return (STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER), stage)


def stages_figure(rows: list[dict[str, Any]]) -> go.Figure:
    """Horizontal p99 bars (binding in the accent, over budget in red), the headroom up to
    each ceiling as a pale segment, and the ceiling itself as a tick."""
    stages = [r["stage"] for r in rows]
    colors = [OVER_COLOR if r.get("over_budget") else BINDING_COLOR if r.get("binding") else STAGE_COLOR
              for r in rows]
    headroom = [max(r.get("headroom_ms") or 0.0, 0.0) for r in rows]
    fig = go.Figure([
        go.Bar(name="p99", y=stages, x=[r.get("p99_ms") for r in rows], orientation="h", marker_color=colors,
               hovertemplate="%{y} p99: %{x:,.0f} ms<extra></extra>"),
        go.Bar(name="headroom", y=stages, x=headroom, orientation="h", marker_color=HEADROOM_COLOR,
               text=[_ms(h) if h else "" for h in headroom], textposition="inside", insidetextanchor="middle",
               textfont=dict(color="#2d7a4b", size=11), hovertemplate="%{y} headroom: %{x:,.0f} ms<extra></extra>"),
        go.Scatter(name="ceiling (p99 budget)", y=stages, x=[r.get("ceiling_ms") for r in rows], mode="markers",
                   marker=dict(symbol="line-ns", size=22, line=dict(width=3, color="#1d2330")),
                   hovertemplate="%{y} ceiling: %{x:,.0f} ms<extra></extra>"),
    ])
    fig.update_layout(**chart_layout(70 + 34 * len(rows), barmode="stack", bargap=0.35,
                                     uniformtext=dict(minsize=10, mode="hide")))
    fig.update_yaxes(autorange="reversed", ticklabelstandoff=6)
    fig.update_xaxes(title_text="ms", rangemode="tozero")
    return fig


def stages_panels(rows: list[dict[str, Any]]) -> list[html.Section] | html.Div:
    if not rows:
        return html.Div("No requests with stage timings in this window.", className="empty")
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get("deployment") or "(none)", []).append(row)
    panels = []
    for deployment, stages in groups.items():
        stages = sorted(stages, key=lambda r: _stage_key(r["stage"]))
        binding = next((r for r in stages if r.get("binding")), None)
        summary = (f"binding: {binding['stage']}" if binding else "no budgets configured: nothing binds")
        panels.append(html.Section(className="panel", children=[
            html.H2([deployment, html.Span(f" · {summary}", className="muted")]),
            graph(stages_figure(stages)),
            table([{**r, "flags": _flags(r)} for r in stages], STAGE_COLUMNS, ""),
        ]))
    return panels


def layout(**_query: str) -> html.Div:
    return html.Div(className="page", children=[
        html.Div(className="page-header", children=[
            html.H1("Latency & stages"),
            html.Span(id="lat-updated", className="muted"),
        ]),
        html.Div(id="lat-alert"),
        html.Section(className="panel", style={"marginBottom": "12px"}, children=[
            html.Div(style={"display": "flex", "alignItems": "center", "gap": "12px", "marginBottom": "6px"},
                     children=[
                html.H2("Latency percentiles by", style={"margin": 0}),
                dcc.Dropdown(id="lat-by", className="filter-dropdown", clearable=False, searchable=False,
                             options=[{"label": v, "value": k} for k, v in BY_OPTIONS.items()], value="model",
                             persistence=True, persistence_type="session"),
            ]),
            html.Div(id="lat-chart"),
            html.Div(id="lat-table", children=LOADING),
        ]),
        html.H2("Stages against their p99 ceilings, per deployment",
                style={"fontSize": "15px", "fontWeight": 600, "margin": "18px 0 10px"}),
        html.Div(id="lat-stages", className="panels", children=LOADING),
        dcc.Interval(id="lat-refresh", interval=REFRESH_MS),
    ])


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(
        Output("lat-chart", "children"),
        Output("lat-table", "children"),
        Output("lat-stages", "children"),
        Output("lat-updated", "children"),
        Output("lat-alert", "children"),
        Input(data.FILTERS_ID, "data"),
        Input("lat-refresh", "n_intervals"),
        Input("lat-by", "value"),
    )
    def refresh(filters_data: dict[str, Any] | None, _tick: int | None, by: str | None) -> tuple:
        filters = data.Filters.from_store(filters_data)
        by = by if by in BY_OPTIONS else "model"
        source = data.current()
        try:
            latency = source.rows("latency", filters, by=by)
            stages = source.rows("stages", filters, by="deployment")
        except Exception as exc:  # noqa: BLE001 - keep the last numbers, say why they are stale
            log.exception("latency refresh failed")
            alert = html.Div(f"Could not load data: {exc}", className="alert")
            return dash.no_update, dash.no_update, dash.no_update, dash.no_update, alert
        updated = f"Last {data.RANGE_LABELS[filters.range]} · updated {datetime.now(timezone.utc):%H:%M:%S} UTC"
        chart = graph(latency_figure(latency, by)) if latency else None
        return (chart, table(latency, _latency_columns(by), "No requests in this window."),
                stages_panels(stages), updated, None)
