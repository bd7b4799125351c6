"""Latency & stages: percentiles by model/service/deployment, and each deployment's stage
p99s against their ceilings with the binding stage marked."""

from __future__ import annotations

from typing import Any

import dash
from dash import dcc, html

from servelens.dashboard import data, timecharts, traces_links
from servelens.dashboard.components import (BADGES, CHART_GROUPS, LOADING, NO_REQUESTS, DataBar, empty, integer, ms,
                                            page, panel, plain, register_refresh, search_box, show, table, top_table,
                                            updated_line)
from servelens.dashboard.timecharts import CONTROL, Chart, Line

dash.register_page(__name__, path="/latency", name="Latency & stages", title="Latency & stages · servelens")

BY_OPTIONS = {"model": "Model", "service": "Service", "deployment": "Deployment"}
# Pipeline order; unknown stages follow alphabetically, the end-to-end total last.
STAGE_ORDER = ("queue", "retrieval", "embedding", "tool", "prefill", "decode", "network", "postprocess", "other")
PERCENTILE_COLORS = (("latency_p50_ms", "p50", "#a9c1f5"), ("latency_p95_ms", "p95", "#6d97f0"),
                     ("latency_p99_ms", "p99", "#2f6fed"))


def _headroom(value: float) -> str:
    return ms(value) if value >= 0 else f"{ms(-value)} over"


def _flags(row: dict[str, Any]) -> str:
    """As text, so that the stage table is one component ("over budget" shows in red)."""
    return " · ".join(BADGES[kind] for kind, field in (("binding", "binding"), ("over", "over_budget"))
                      if row.get(field))


def _latency_columns(by: str) -> tuple:
    return (
        (by, BY_OPTIONS[by], str), ("requests", "Requests", integer),
        ("ttft_p50_ms", "TTFT p50", ms), ("ttft_p95_ms", "TTFT p95", ms), ("ttft_p99_ms", "TTFT p99", ms),
        ("latency_p50_ms", "Latency p50", ms), ("latency_p95_ms", "p95", ms), ("latency_p99_ms", "p99", ms),
        ("tpot_p50_ms", "TPOT p50", ms),
    )


STAGE_COLUMNS = (
    ("deployment", "Deployment", str), ("stage", "Stage", str), ("p50_ms", "p50", ms), ("p99_ms", "p99", ms),
    ("ceiling_ms", "Ceiling", ms), ("headroom_ms", "Headroom", _headroom), ("flags", "", plain),
)


# The table's percentile cells carry bars on one scale: the groups' spread at a glance.
LATENCY_BARS = tuple(DataBar(key, lambda row, key=key, color=color: ((row.get(key), color),))
                     for key, _, color in PERCENTILE_COLORS)


def _stage_key(stage: str) -> tuple[int, str]:
    if stage == "total":
        return (len(STAGE_ORDER) + 1, stage)
    return (STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER), stage)


def stage_bars(rows: list[dict[str, Any]]) -> html.Div:
    """Each stage's p99 as a horizontal bar (binding in the accent, over budget in red),
    the headroom up to its ceiling as a pale segment, the ceiling as a tick: a bullet chart
    drawn with a few elements per stage, where a plotly figure per deployment cost the
    browser a chart's drawing each (BENCHMARKS.md, "Dashboard load in the browser"); the
    numbers are in the table beside it."""
    scale = max((max(r.get("p99_ms") or 0.0, r.get("ceiling_ms") or 0.0) for r in rows), default=0.0) or 1.0

    def share(value: float | None) -> str:
        return f"{100 * max(value or 0.0, 0.0) / scale:.2f}%"

    bars = []
    for row in rows:
        status = "over" if row.get("over_budget") else "binding" if row.get("binding") else "within"
        headroom = max(row.get("headroom_ms") or 0.0, 0.0)
        ceiling = row.get("ceiling_ms")
        track = [html.Div(className=f"stage-p99 stage-{status}", style={"width": share(row.get("p99_ms"))})]
        if headroom:
            track.append(html.Div(ms(headroom), className="stage-headroom", style={"width": share(headroom)}))
        if ceiling is not None:
            track.append(html.Div(className="stage-ceiling", style={"left": share(ceiling)}))
        name = row.get("stage") or "(none)"  # an element's text: React shows it as typed
        hint = f"{name} p99 {show(row.get('p99_ms'), ms)}" + (
            f", ceiling {ms(ceiling)}, headroom {_headroom(row.get('headroom_ms') or 0.0)}" if ceiling is not None
            else ", no ceiling configured")
        bars.append(html.Div(className="stage-bar", title=hint, children=[
            html.Div(name, className="stage-name"), html.Div(track, className="stage-track")]))
    return html.Div([*bars, html.Div(f"0 to {ms(scale)}", className="stage-scale muted")], className="stage-bars")


def _traces(stages: list[dict[str, Any]]) -> int:
    return max((r.get("traces") or 0 for r in stages), default=0)


def stages_panels(rows: list[dict[str, Any]]) -> list[Any] | html.Div:
    """One panel per deployment, the busiest CHART_GROUPS (by traces) and a note for the
    rest; each lists its first data.TOP_N stages in pipeline order (app.stage names are
    free text, so a deployment may have many)."""
    if not rows:
        return empty("No requests with stage timings in this window.")
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get("deployment") or "(none)", []).append(row)
    busiest = sorted(groups.items(), key=lambda item: (-_traces(item[1]), item[0]))
    panels: list[Any] = []
    listed: list[dict[str, Any]] = []
    for deployment, stages in busiest[:CHART_GROUPS]:
        stages = sorted(stages, key=lambda r: _stage_key(r["stage"]))[:data.TOP_N]
        binding = next((r for r in stages if r.get("binding")), None)
        summary = (f"binding: {binding['stage']}" if binding else "no budgets configured: nothing binds")
        panels.append(panel([deployment, html.Span(f" · {summary}", className="muted")], stage_bars(stages)))
        listed += [{**r, "deployment": deployment, "flags": _flags(r)} for r in stages]
    out: list[Any] = [html.Div(panels, className="panels")]
    if len(busiest) > CHART_GROUPS:
        out.append(html.Div(f"{integer(len(busiest) - CHART_GROUPS)} more deployments with fewer traces: "
                            "filter by deployment to see one.", className="muted table-note"))
    # The numbers of every panel in one table: a table per deployment cost the browser
    # ~25 ms each to lay out (BENCHMARKS.md, "Dashboard load in the browser").
    out.append(html.Section(className="panel gap-above", children=[
        html.H2("Stage percentiles"), table(listed, STAGE_COLUMNS, "")]))
    return out


def queue_ceilings(source: data.DataSource, filters: data.Filters) -> list[dict[str, Any]]:
    """The configured queue budgets (p99 ceilings), as lines on the queue chart."""
    return [{"y": d.budgets["queue"].total_seconds() * 1000, "text": f"{d.name} queue ceiling"}
            for d in source.settings.deployments if "queue" in d.budgets
            and filters.deployment in (None, d.name)][:4]


CHARTS = (
    Chart("p99", "Latency p99 over time", (Line("latency_p99_ms", "p99", CONTROL),), unit="ms", control="by"),
    Chart("ttft", "TTFT p99 over time", (Line("ttft_p99_ms", "TTFT p99", CONTROL),), unit="ms", control="by"),
    Chart("drift", "p50 against p99 (all requests)", (Line("latency_p50_ms", "p50", dash="dot"),
                                                      Line("latency_p95_ms", "p95", dash="dash"),
                                                      Line("latency_p99_ms", "p99")), unit="ms"),
    Chart("queue", "Queue wait (vLLM) against its ceiling", (Line("queue_p95_ms", "p95", "deployment", dash="dot"),
                                                            Line("queue_p99_ms", "p99", "deployment")),
          unit="ms", marks=queue_ceilings),
)


def layout(**_query: str) -> html.Div:
    return page(
        "lat", "Latency & stages",
        html.Section(className="panel gap-below", children=[
            html.Div(className="panel-toolbar", children=[
                html.H2("Latency percentiles by"),
                dcc.Dropdown(id="lat-by", className="filter-dropdown", clearable=False, searchable=False,
                             options=[{"label": v, "value": k} for k, v in BY_OPTIONS.items()], value="model",
                             persistence=True, persistence_type="session"),
            ]),
            search_box("lat-search", "groups"),
            html.Div(id="lat-table", children=LOADING),
        ]),
        timecharts.charts_row("lat", CHARTS),
        html.H2("Stages against their p99 ceilings, per deployment", className="section-title"),
        html.Div(id="lat-stages", children=LOADING),
    )


def fetch(source: data.DataSource, filters: data.Filters, by: str | None, search: str | None) -> tuple:
    by = by if by in BY_OPTIONS else "model"
    return (by, source.top("latency", filters, by, "requests", search),
            source.rows("stages", filters, by="deployment"))


def render(fetched: tuple, filters: data.Filters) -> tuple:
    by, latency, stages = fetched
    what = f"{BY_OPTIONS[by].lower()}s"
    listed = traces_links.link_keys(  # each group's key: its requests at or above its p99
        top_table(latency, _latency_columns(by), NO_REQUESTS, what, "requests", LATENCY_BARS),
        latency.with_other(), by, lambda row: traces_links.slowest(filters, by, row[by], row.get("latency_p99_ms")))
    return listed, stages_panels(stages), updated_line(filters)


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "lat", ("table", "stages", "updated"), fetch, render, controls=("by", "search"))
    timecharts.register(app, "lat", CHARTS)
