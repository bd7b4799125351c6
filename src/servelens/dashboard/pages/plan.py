"""Plan: what the next capacity decision costs, from the deployment's measured busiest hour
(analytics/plan/capacity.py, Tier A): the replicas a p99 target needs, p99 and idle cost at
each replica count (over-provisioning for the tail is paid in idle GPUs), what-ifs on traffic,
prompt and output length, and how far the model was off on the measured hour (backtest).
Below it, Tier B on demand (analytics/plan/replay.py): the range's stored trace replayed through
a batching model fitted from it, at the measured capacity (its backtest) and, if asked, under an
autoscaling policy; it runs as a job with a progress bar, one at a time per process.

The what-ifs are stepped choices (×0.5 … ×3) rather than free sliders: every value is a
short string the page sends, as every control of the dashboard is (dashboard.data.clean)."""

from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html

from servelens.analytics.plan import capacity, jobs, replay
from servelens.analytics.query import QueryError
from servelens.dashboard import data
from servelens.dashboard.components import (LOADING, empty, integer, ms, page, panel, pct, plain, register_refresh,
                                            table, updated_line, usd)

dash.register_page(__name__, path="/plan", name="Plan", title="Plan · servelens")

STEPS = ("0.5", "1", "1.5", "2", "3")
AUTOSCALE_ON = "metric=busy,min_replicas=1,max_replicas=16"
REPLAY_COLUMNS = (("p99", "p99", plain), ("observed_ms", "Observed", ms), ("replayed_ms", "Replayed", ms),
                  ("error", "Error", plain))
TARGETS = {"p99_ttft_ms": "p99 TTFT", "p99_latency_ms": "p99 latency", "p99_queue_ms": "p99 queue wait"}
NO_DEPLOYMENT = ("No self-hosted deployment is configured. Add one under deployments: in servelens.yaml "
                 "(name, gpus, gpu_hourly_usd) to plan its capacity.")
NOTHING_TO_DRAW = "Nothing to draw: no plan for this range."
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
        panel("Measured workload (busiest hour) and backtest", html.Div(id="plan-measured", children=LOADING),
              extra_class="gap-below"),
        panel("Replay the range (Tier B)", html.Div(className="controls", children=[
            html.Div(className="control", children=[
                html.Label("Autoscaling", htmlFor="plan-replay-autoscaling"),
                dcc.RadioItems(id="plan-replay-autoscaling", inline=True, className="steps", value="off",
                               options=[{"label": "off (measured replicas)", "value": "off"},
                                        {"label": "on (HPA on busy share)", "value": AUTOSCALE_ON}])]),
            html.Button("Replay", id="plan-replay-start", n_clicks=0, className="button")]),
            html.Progress(id="plan-replay-progress", max="1", value="0", className="progress"),
            html.Div(id="plan-replay-result", children=html.P(
                "Replays every stored request of the range; a week of busy traffic takes minutes.", className="muted")),
            dcc.Store(id="plan-replay-job"),
            dcc.Interval(id="plan-replay-poll", interval=1000, disabled=True)),
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
    # no plan, no chart: its panel says so (a chart left blank reads as still loading)
    if doc is None:
        none = empty(NO_DEPLOYMENT)
        return none, empty(""), empty(NOTHING_TO_DRAW), empty(""), updated_line(filters)
    if "error" in doc:
        return empty(doc["error"]), empty(""), empty(NOTHING_TO_DRAW), empty(""), updated_line(filters)
    return (_answer(doc), table(_rows(doc), COLUMNS, "No replica counts."), _chart(doc), _measured(doc),
            updated_line(filters, "the range's busiest hour"))


def _ms_or_none(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _ms_text(seconds: float | None) -> str:
    return "—" if seconds is None else ms(seconds * 1000)


def replay_result(doc: dict[str, Any]) -> html.Div:
    b = doc["backtest"]
    rows = [{"p99": name.removesuffix("_p99_s").replace("_", " "), "observed_ms": _ms_or_none(b["observed"][name]),
             "replayed_ms": _ms_or_none(b["simulated"][name]),
             "error": "—" if b["errors"][name] is None else f"{b['errors'][name]:+.0%}"} for name in b["observed"]]
    fit = doc["server"]
    parts = [html.P(f"{doc['requests']:,} requests replayed at {doc['measured']['replicas']} replicas; step time "
                    f"{_num(fit['a_s'] * 1000)} ms + {_num((fit['b_s_per_token'] or 0) * 1e6)} µs per prompt token + "
                    f"{_num((fit['c_s_per_sequence'] or 0) * 1000)} ms per decode sequence"
                    + ("" if fit["c_s_per_sequence"] is not None else " (not identified)") + "."),
             table(rows, REPLAY_COLUMNS, "No timings."),
             html.P(f"Backtest: {b['verdict']}.", id="plan-replay-verdict")]
    if "result" in doc:
        r, m = doc["result"], doc["at_measured"]
        peak = max((x["provisioned"] for x in r["replicas"]), default=None)
        parts.append(html.P(
            id="plan-replay-whatif",
            children=f"With autoscaling: p99 queue {_ms_text(r['queue_wait_p99_s'])} (measured "
                     f"{_ms_text(m['queue_wait_p99_s'])}), up to {peak} replicas, "
                     f"{_num(r['gpu_hours_provisioned'])} GPU-hours (measured {_num(m['gpu_hours_provisioned'])})"
                     + (f", idle {usd(r['idle_cost_usd'])} (measured {usd(m['idle_cost_usd'])})"
                        if r["idle_cost_usd"] is not None else "") + "."))
    parts += [html.P(n, className="muted") for n in doc["notes"]]
    return html.Div(parts)


def start_replay(source: data.DataSource, filters: data.Filters, deployment: str | None,
                 autoscaling: str | None) -> tuple[str | None, Any]:
    """(job id, what to show): the replay started, or why not."""
    if not source.settings.deployments:
        return None, empty(NO_DEPLOYMENT)
    params = {**filters.params(), "deployment": deployment or source.settings.deployments[0].name}
    if autoscaling and autoscaling != "off":
        params["autoscaling"] = AUTOSCALE_ON
    try:
        replay.check(params, source.settings)
        job = source.jobs.start("replay", params, lambda progress: replay.replay(source.store, source.settings, params,
                                                                                 progress=progress))
    except (QueryError, jobs.Busy) as exc:
        return None, empty(str(exc))
    return job.id, html.P("Replaying…", className="muted")


def poll_replay(source: data.DataSource, job_id: str | None) -> tuple[str, Any, bool]:
    """(progress 0..1, what to show, whether polling stops)."""
    job = source.jobs.get(job_id) if job_id else None
    if job is None:
        return "0", empty("The replay is no longer known (the server restarted): start it again."), True
    if job.state == "running":
        return f"{job.progress:.3f}", html.P(f"Replaying… {job.progress:.0%}", className="muted"), False
    if job.state == "failed":
        return "0", empty(job.error or "the replay failed"), True
    return "1", replay_result(job.result), True


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "plan", ("answer", "table", "chart", "measured", "updated"), fetch, render,
                     controls=("deployment", "metric", "target", "traffic", "input", "output"))

    @app.callback(Output("plan-replay-job", "data"), Output("plan-replay-result", "children"),
                  Output("plan-replay-poll", "disabled"), Output("plan-replay-progress", "value"),
                  Input("plan-replay-start", "n_clicks"), State(data.FILTERS_ID, "data"),
                  State("plan-deployment", "value"), State("plan-replay-autoscaling", "value"),
                  prevent_initial_call=True)
    def start(_clicks: Any, filters_data: Any, deployment: Any, autoscaling: Any) -> tuple:
        job, shown = start_replay(data.current(), data.Filters.from_store(filters_data), data.clean(deployment),
                                  data.clean(autoscaling))
        return job, shown, job is None, "0"

    @app.callback(Output("plan-replay-progress", "value", allow_duplicate=True),
                  Output("plan-replay-result", "children", allow_duplicate=True),
                  Output("plan-replay-poll", "disabled", allow_duplicate=True),
                  Input("plan-replay-poll", "n_intervals"), State("plan-replay-job", "data"),
                  prevent_initial_call=True)
    def poll(_tick: Any, job_id: Any) -> tuple:
        return poll_replay(data.current(), data.clean(job_id))
