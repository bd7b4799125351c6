"""GPUs: utilization per deployment and what its idle part costs, then every GPU."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import dash
from dash import Input, Output, dcc, html

from dashboard import data
from dashboard.pages.latency import card
from dashboard.pages.overview import LOADING, NULL, REFRESH_MS, _int, _pct, _show, _usd, table

dash.register_page(__name__, path="/gpus", name="GPUs", title="GPUs · servelens")

log = logging.getLogger(__name__)

IDLE_STYLE = {"color": "#c0392b"}
IDLE_CARD_STYLE = {"background": "#fdf3f2", "borderColor": "#f5c6c0"}


def _ratio(value: float) -> str:
    return f"{value:.2f}×"


GPU_COLUMNS = (
    ("deployment", "Deployment", str), ("host", "Host", str), ("gpu", "GPU", str), ("model_name", "Model", str),
    ("gpu_util_mean", "Util mean", _pct), ("gpu_util_p95", "Util p95", _pct), ("peak_to_average", "Peak/avg", _ratio),
    ("provisioned_cost_usd", "Provisioned", _usd), ("busy_cost_usd", "Busy", _usd), ("idle_cost_usd", "Idle", _usd),
)


def deployment_panel(index: int, row: dict[str, Any]) -> html.Section:
    """One deployment: its GPUs, utilization and cost split, idle cost in red."""
    name = row.get("deployment") or "(none)"
    provisioned, idle = row.get("provisioned_cost_usd"), row.get("idle_cost_usd")
    idle_hint = f"{idle / provisioned:.0%} of provisioned" if idle is not None and provisioned else "not utilized"
    key = f"gpus-d{index}"  # by position: deployment names may hold characters ids cannot
    return html.Section(className="panel", style={"marginBottom": "12px"}, children=[
        html.H2(name, id=f"{key}-name"),
        html.Div(className="cards", style={"marginBottom": "0"}, children=[
            card(f"{key}-gpus", "GPUs", _show(row.get("gpus"), _int), "seen or configured"),
            card(f"{key}-util-mean", "Utilization", _show(row.get("gpu_util_mean"), _pct), "mean over samples"),
            card(f"{key}-util-p95", "Utilization p95", _show(row.get("gpu_util_p95"), _pct),
                 f"peak/avg {_show(row.get('peak_to_average'), _ratio)}"),
            card(f"{key}-provisioned", "Provisioned", _show(provisioned, _usd), "GPU-hours × hourly rate"),
            card(f"{key}-busy", "Busy cost", _show(row.get("busy_cost_usd"), _usd), "provisioned × utilization"),
            card(f"{key}-idle", "Idle cost", _show(idle, _usd), idle_hint,
                 style=IDLE_CARD_STYLE if idle else None, value_style=IDLE_STYLE if idle else None),
        ]),
    ])


def deployment_panels(rows: list[dict[str, Any]]) -> list[html.Section] | html.Div:
    if not rows:
        return html.Div("No deployments configured: add them under `deployments:` to see GPU cost.",
                        className="empty")
    return [deployment_panel(i, row) for i, row in enumerate(rows)]


def totals(rows: list[dict[str, Any]]) -> str:
    idle = [r["idle_cost_usd"] for r in rows if r.get("idle_cost_usd") is not None]
    provisioned = [r["provisioned_cost_usd"] for r in rows if r.get("provisioned_cost_usd") is not None]
    if not provisioned:
        return ""
    return f"Idle GPU cost {_usd(sum(idle)) if idle else NULL} of {_usd(sum(provisioned))} provisioned"


def layout(**_query: str) -> html.Div:
    return html.Div(className="page", children=[
        html.Div(className="page-header", children=[
            html.H1("GPUs"),
            html.Span(id="gpus-updated", className="muted"),
        ]),
        html.Div(id="gpus-alert"),
        html.Div(id="gpus-total", style={"fontWeight": 500, "marginBottom": "10px"}),
        html.Div(id="gpus-deployments", children=LOADING),
        html.Section(className="panel", children=[
            html.H2("Per GPU"), html.Div(id="gpus-table", children=LOADING)]),
        dcc.Interval(id="gpus-refresh", interval=REFRESH_MS),
    ])


def register_callbacks(app: dash.Dash) -> None:
    @app.callback(
        Output("gpus-deployments", "children"),
        Output("gpus-table", "children"),
        Output("gpus-total", "children"),
        Output("gpus-updated", "children"),
        Output("gpus-alert", "children"),
        Input(data.FILTERS_ID, "data"),
        Input("gpus-refresh", "n_intervals"),
    )
    def refresh(filters_data: dict[str, Any] | None, _tick: int | None) -> tuple:
        filters = data.Filters.from_store(filters_data)
        source = data.current()
        try:
            deployments = source.rows("utilization", filters, by="deployment")
            gpus = source.rows("utilization", filters, by="gpu")
        except Exception as exc:  # noqa: BLE001 - keep the last numbers, say why they are stale
            log.exception("gpus refresh failed")
            alert = html.Div(f"Could not load data: {exc}", className="alert")
            return dash.no_update, dash.no_update, dash.no_update, dash.no_update, alert
        updated = f"Last {data.RANGE_LABELS[filters.range]} · updated {datetime.now(timezone.utc):%H:%M:%S} UTC"
        return (deployment_panels(deployments), table(gpus, GPU_COLUMNS, "No GPU samples in this window."),
                totals(deployments), updated, None)
