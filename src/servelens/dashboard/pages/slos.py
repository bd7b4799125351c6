"""SLOs: each configured SLO (`slos:`) judged over its own period (attainment, error budget
left) with the burn rates the slo_burn trigger watches, and its error budget remaining
over the selected range (analytics.slo). Without SLOs configured, how to configure one."""

from __future__ import annotations

from typing import Any

import dash
from dash import dcc, html

from servelens.analytics.query import ReportQuery
from servelens.analytics.reports import series, slo
from servelens.dashboard import data, timecharts, traces_links
from servelens.dashboard.components import (LOADING, empty, integer, page, panel, pct, plain, register_refresh, table,
                                            updated_line)
from servelens.dashboard.timecharts import Chart, Line

dash.register_page(__name__, path="/slos", name="SLOs", title="SLOs · servelens")

NO_SLOS = "No SLO is configured. Add them under slos: in servelens.yaml, for example:"
EXAMPLE = """slos:
  - {name: chat-availability, service: chat-api, objective: 0.999, period: 30d}
  - {name: chat-latency, service: chat-api, objective: 0.995, latency_under: 4s, period: 30d}"""
EXPLAIN = ("A request is good when it is not an error and, with latency_under, finishes within it; every "
           "attempt of the service counts, retries included. The slo_burn trigger alerts when the error "
           "budget burns too fast.")
NO_REQUESTS = "No request of these SLOs' services in this range."
CHART = Chart("budget", "Error budget remaining (over each SLO's period)",
              (Line(slo.METRIC, "budget remaining", by="slo"),), unit="%", height=260)
BUDGET_SPENT = [{"y": 0, "text": "budget spent"}]


def _objective(row: dict[str, Any]) -> str:
    text = f"{row['objective'] * 100:g} %"
    if row.get("latency_under_ms") is not None:
        text += f" under {row['latency_under_ms']:,.0f} ms"
    return text


def _attainment(value: float) -> str:
    return f"{value * 100:.2f} %"  # next to objectives of 99.9 %, one decimal hides the miss


def _burn(value: float) -> str:
    return f"{value:,.2f}×"


def _scope(row: dict[str, Any]) -> str:
    parts = [f"{k}={row[k]}" for k in ("service", "deployment") if row.get(k)]
    return ", ".join(parts) or "all requests"


COLUMNS = (
    ("name_link", "SLO", str), ("scope", "Scope", plain), ("objective_text", "Objective", plain),
    ("period", "Period", plain), ("total", "Requests", integer), ("bad", "Bad", integer),
    ("attainment", "Attainment", _attainment), ("error_budget_remaining", "Budget left", pct),
    ("burn_rate_1h", "Burn 1 h", _burn), ("burn_rate_6h", "Burn 6 h", _burn),
)


def _bad_requests(row: dict[str, Any], since: Any, until: Any) -> str:
    """The requests that spend an SLO's budget: its errors, or its slowest for a latency SLO."""
    scope = {k: row.get(k) for k in ("service", "deployment")}
    if row.get("latency_under_ms") is not None:
        return traces_links.href(None, since=since, until=until, **scope, sort="latency",
                                 min_latency_ms=int(row["latency_under_ms"]))
    return traces_links.href(None, since=since, until=until, **scope, error="true")


def shown_rows(rows: list[dict[str, Any]], filters: data.Filters) -> list[dict[str, Any]]:
    """Table rows; an SLO's name links to the requests that spent its budget this period."""
    until = filters.params()["until"]
    return [{**r, "scope": _scope(r), "objective_text": _objective(r),
             "name_link": dcc.Link(r["name"], href=_bad_requests(r, r["period_start"], until))}
            for r in rows]


def layout(**_query: str) -> html.Div:
    return page(
        "slo", "SLOs",
        panel("Objectives, each over its period", html.Div(id="slo-table", children=LOADING), extra_class="gap-below"),
        panel(CHART.title, html.Div(id="slo-chart", children=LOADING, className="timechart"),
              extra_class="panel-chart"),
    )


def fetch(source: data.DataSource, filters: data.Filters) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    if not source.settings.slos:
        return None
    q = ReportQuery.from_params(filters.params())
    rows = source.rows("slo", filters)
    return rows, slo.budget_series(source.store, source.settings, q, series.bucket_seconds(None, q))


def not_configured() -> html.Div:
    return html.Div([html.Div(NO_SLOS, className="empty"), html.Pre(EXAMPLE, className="config-example"),
                     html.Div(EXPLAIN, className="muted")], id="slo-empty")


def _links(figure: Any, rows: list[dict[str, Any]], doc: dict[str, Any]) -> None:
    """A click on a point lists the budget-spending requests of that SLO in that bucket
    (the trace's link, as timecharts._link: the browser adds the bucket's since/until)."""
    by_name = {r["name"]: r for r in rows}
    for trace, s in zip(figure["data"], doc["series"]):
        row = by_name.get(s["key"]["slo"])
        if row is not None:
            trace["meta"] = {"href": _bad_requests(row, None, None), "step_s": series.BUCKETS[doc["bucket"]]}


def render(fetched: tuple[list[dict[str, Any]], dict[str, Any]] | None, filters: data.Filters) -> tuple:
    if fetched is None:
        return not_configured(), empty("Configure an SLO to chart its error budget."), updated_line(filters)
    rows, doc = fetched
    listing = table(shown_rows(rows, filters), COLUMNS, "No SLO applies to the selected service or deployment.")
    if not any(v is not None for s in doc["series"] for _, v in s["points"]):
        chart: Any = empty(NO_REQUESTS)
    else:
        graph = timecharts.graph_of("slo", CHART, [(CHART.lines[0], doc)], BUDGET_SPENT, filters)
        _links(graph.figure, rows, doc)
        chart = graph
    return listing, chart, updated_line(filters, f"{doc['bucket']} buckets")


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "slo", ("table", "chart", "updated"), fetch, render)
