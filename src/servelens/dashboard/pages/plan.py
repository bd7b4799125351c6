"""Plan: what the next capacity decision costs, from the deployment's measured busiest hour
(analytics/plan/capacity.py, Tier A): the replicas a p99 target needs, p99 and idle cost at
each replica count (over-provisioning for the tail is paid in idle GPUs), what-ifs on traffic,
prompt and output length, and how far the model was off on the measured hour (backtest).

The what-ifs are stepped choices (×0.5 … ×3) rather than free sliders: every value is a
short string the page sends, as every control of the dashboard is (dashboard.data.clean)."""

from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import dcc, html

from servelens.analytics.plan import capacity
from servelens.analytics.query import QueryError
from servelens.dashboard import data
from servelens.dashboard.components import LOADING, empty, integer, ms, page, panel, pct, plain, register_refresh, table, usd
from servelens.dashboard.components import updated_line

dash.register_page(__name__, path="/plan", name="Plan", title="Plan · servelens")

STEPS = ("0.5", "1", "1.5", "2", "3")
TARGETS = {"p99_ttft_ms": "p99 TTFT", "p99_latency_ms": "p99 latency", "p99_queue_ms": "p99 queue wait"}
NO_DEPLOYMENT = ("No self-hosted deployment is configured. Add one under deployments: in servelens.yaml "
                 "(name, gpus, gpu_hourly_usd) to plan its capacity.")
COLUMNS = (
    ("replicas", "Replicas", integer), ("utilization", "Slot use", pct),
    ("p99_queue_ms", "p99 queue", ms), ("p99_ttft_ms", "p99 TTFT", ms), ("p99_latency_ms", "p99 latency", ms),
    ("cost_usd_per_day", "$ / day", usd), ("idle_cost_usd_per_day", "Idle $ / day", usd), ("marks", "", plain),
)


def _steps(name: str, label: str) -> html.Div:
    return html.Div(className="control", children=[
        html.Label(label, htmlFor=f"plan-{name}"),
        dcc.RadioItems(id=f"plan-{name}", options=[{"label": f"×{s}", "value": s} for s in STEPS], value="1",
                       inline=True, className="steps"),
    ])


def layout(**_query: str) -> html.Div:
    deployments = [d.name for d in data.current().settings.deployments]
    controls = html.Div(className="controls", children=[
        html.Div(className="control", children=[
            html.Label("Deployment", htmlFor="plan-deployment"),
            dcc.Dropdown(id="plan-deployment", options=deployments, value=deployments[0] if deployments else None,
                         clearable=False)]),
        html.Div(className="control", children=[
            html.Label("Target", htmlFor="plan-metric"),
            dcc.Dropdown(id="plan-metric", options=[{"label": v, "value": k} for k, v in TARGETS.items()],
                         value="p99_ttft_ms", clearable=False),
            dcc.Input(id="plan-target", type="text", value="2000", debounce=True, size="6"),
            html.Span(" ms", className="muted")]),
        _steps("traffic", "Traffic"), _steps("input", "Prompt length"), _steps("output", "Output length"),
    ])
    return page(
        "plan", "Plan",
        panel("What if", controls, html.Div(id="plan-answer", children=LOADING), extra_class="gap-below"),
        panel("p99 and idle cost by replicas", html.Div(id="plan-table", children=LOADING),
              html.Div(id="plan-chart", className="timechart"), extra_class="gap-below"),
        panel("Measured workload (busiest hour) and backtest", html.Div(id="plan-measured", children=LOADING)),
    )


def fetch(source: data.DataSource, filters: data.Filters, deployment: str | None, metric: str | None,
          target: str | None, traffic: str | None, input_x: str | None, output_x: str | None) -> Any:
    if not source.settings.deployments:
        return None
    params = {**filters.params(), "deployment": deployment or source.settings.deployments[0].name,
              "traffic_x": traffic, "input_x": input_x, "output_x": output_x}
    if target:
        params["target"] = f"{metric or 'p99_ttft_ms'}:{target}"
    try:
        return capacity.plan(source.store, source.settings, params)
    except QueryError as exc:  # no traffic in range, a target that is not a number: said on the page
        return {"error": str(exc)}


def _answer(doc: dict[str, Any]) -> html.Div:
    m = doc["measured"]
    lines = []
    if doc["target"] is not None:
        t = doc["target"]
        needed = doc["replicas_needed"]
        lines.append(html.P(id="plan-needed", children=[
            html.Strong(f"{needed} replicas" if needed is not None else "No replica count"),
            f" meet {TARGETS[t['metric']]} ≤ {t['ms']:,.0f} ms "
            f"(now {m['replicas']} × {m['concurrency_per_replica']} sequences)."]))
    current = next((p for p in doc["at"] if p["replicas"] == m["replicas"]), None)
    if current is not None and current["idle_cost_usd_per_day"] is not None:
        lines.append(html.P(f"At the current {m['replicas']} replicas the idle GPU time costs "
                            f"{usd(current['idle_cost_usd_per_day'])} a day."))
    return html.Div(lines)


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    current, needed = doc["measured"]["replicas"], doc["replicas_needed"]
    out = []
    for p in doc["at"]:
        marks = [name for name, n in (("now", current), ("needed", needed)) if n == p["replicas"]]
        out.append({**p, "marks": ", ".join(marks)})
    return out


def _chart(doc: dict[str, Any]) -> Any:
    points = [p for p in doc["at"] if p["p99_latency_ms"] is not None]
    if not points:
        return empty("No replica count in this range gives a stable queue.")
    x = [p["replicas"] for p in points]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=[p["p99_ttft_ms"] for p in points], name="p99 TTFT (ms)", mode="lines+markers"))
    if all(p["idle_cost_usd_per_day"] is not None for p in points):
        fig.add_trace(go.Bar(x=x, y=[p["idle_cost_usd_per_day"] for p in points], name="idle $ / day", yaxis="y2",
                             opacity=0.35))
    fig.update_layout(height=260, margin={"l": 50, "r": 50, "t": 10, "b": 30}, xaxis={"title": "replicas"},
                      yaxis={"title": "ms"}, yaxis2={"title": "$ / day", "overlaying": "y", "side": "right"},
                      legend={"orientation": "h"})
    return dcc.Graph(figure=fig, config={"displayModeBar": False})


def _measured(doc: dict[str, Any]) -> html.Div:
    m, b = doc["measured"], doc["backtest"]
    facts = [("Busiest hour", m["peak_hour"]), ("Arrivals", f"{m['arrival_rps']:.2f} req/s"),
             ("Burstiness (cv² of gaps)", _num(m["burstiness"])),
             ("Service time", ms(m["service_s_mean"] * 1000) if m["service_s_mean"] else None),
             ("Service cv²", _num(m["service_s_cv2"])),
             ("Replicas × sequences", f"{m['replicas']} × {m['concurrency_per_replica']}"
              + (" (calibrated)" if m["concurrency_calibrated"] else "")),
             ("GPUs, utilization", f"{m['gpus'] or '—'}, " + (pct(m["gpu_utilization"]) if m["gpu_utilization"]
                                                             is not None else "—"))]
    error = b["p99_error"]
    backtest = ("Backtest, p99 queue wait in that hour: model "
                f"{ms(b['p99_queue_ms_model']) if b['p99_queue_ms_model'] is not None else '—'}, observed "
                f"{ms(b['p99_queue_ms_observed']) if b['p99_queue_ms_observed'] is not None else '—'}"
                + (f" ({error:+.0%})" if error is not None else "") + (" — fitted, not a test" if b["fitted"] else ""))
    if error is not None and abs(error) > 0.5:
        backtest += ". The model is far off here: read its answers as rough."
    return html.Div([
        html.Dl(className="facts", children=[c for k, v in facts for c in (html.Dt(k), html.Dd(v or "—"))]),
        html.P(backtest, id="plan-backtest"),
        *(html.P(n, className="muted") for n in doc["notes"]),
    ])


def _num(x: float | None) -> str | None:
    return None if x is None else f"{x:.2f}"


def render(doc: Any, filters: data.Filters) -> tuple:
    if doc is None:
        none = empty(NO_DEPLOYMENT)
        return none, empty(""), None, empty(""), updated_line(filters)
    if "error" in doc:
        return empty(doc["error"]), empty(""), None, empty(""), updated_line(filters)
    return (_answer(doc), table(_rows(doc), COLUMNS, "No replica counts."), _chart(doc), _measured(doc),
            updated_line(filters, "the range's busiest hour"))


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "plan", ("answer", "table", "chart", "measured", "updated"), fetch, render,
                     controls=("deployment", "metric", "target", "traffic", "input", "output"))
