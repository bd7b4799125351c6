"""A trigger episode drawn on the chart of the signal it fired on (the Triggers page).

The signal is the series that shows what the detector saw (SIGNALS, by kind), narrowed to
the episode's subject, over a span around the episode (from well before it started to
after it ended), with the episode shaded.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from dash import html

from servelens.analytics.query import FILTER_KEYS
from servelens.dashboard import data, timecharts
from servelens.dashboard.components import empty
from servelens.dashboard.timecharts import Chart, Line

# kind -> (metric, label, unit): what each detector watches (SPEC 6)
SIGNALS = {
    "queue_wait_growth": ("queue_p95_ms", "queue wait p95", "ms"),
    "p99_drift": ("latency_p99_ms", "latency p99", "ms"),
    "quality_regression": ("pass_rate", "pass rate", "%"),
    "quality_under_load": ("pass_rate", "pass rate", "%"),
    "low_utilization": ("gpu_utilization", "GPU utilization", "%"),
    "new_workload_shape": ("requests", "requests", ""),
    "retry_storm": ("retry_rate", "retry rate", "%"),
    "error_rate_spike": ("error_rate", "error rate", "%"),
    "fallback_over_budget": ("fallback_rate", "fallback rate", "%"),
    "cost_anomaly": ("cost_usd", "spend", "$"),
    "budget": ("cost_usd", "spend", "$"),
    "slo_burn": ("error_rate", "error rate", "%"),
    "model_inconsistency": ("requests", "requests", ""),
}
LEAD = timedelta(hours=6)  # at least this much before the episode: what "before" looked like


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def span(trigger: dict[str, Any], now: datetime | None = None) -> tuple[datetime, datetime]:
    now = now or datetime.now(timezone.utc)
    started = _time(trigger["started_at"]) or now
    ended = _time(trigger.get("resolved_at")) or now
    lead = max(LEAD, 2 * (ended - started))
    return started - lead, min(now, ended + lead / 4) if ended < now else now


def fetch(source: data.DataSource, trigger: dict[str, Any] | None) -> tuple | None:
    if trigger is None or trigger["kind"] not in SIGNALS:
        return None
    metric, name, unit = SIGNALS[trigger["kind"]]
    since, until = span(trigger)
    subject = {k: str(v) for k, v in trigger["subject"].items() if k in FILTER_KEYS}
    doc = source.series(metric, {"since": since, "until": until, **subject})
    return trigger, Chart("signal", name, (Line(metric, name),), unit=unit, height=240), doc, (since, until)


def render(fetched: tuple | None) -> Any:
    if fetched is None:
        return None
    trigger, chart, doc, (since, until) = fetched
    if not doc["series"]:
        return empty(f"No {chart.title} recorded around this episode.")
    started = trigger["started_at"]
    ended = trigger.get("resolved_at") or until.isoformat()
    marks = [{"x0": started, "x1": ended, "text": f"{trigger['kind']} ({trigger['state']})"}]
    window = data.Filters(range=data.CUSTOM, since=since.isoformat(), until=until.isoformat())
    return html.Div([
        html.Div(f"{chart.title} of {', '.join(f'{k}={v}' for k, v in trigger['subject'].items()) or 'all traffic'}"
                 f" around the episode", className="muted"),
        timecharts.graph_of("trg", chart, [(chart.lines[0], doc)], marks, window),
    ], id="trg-signal-chart")
