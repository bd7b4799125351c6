"""Quality slices: per slice, the evaluations' pass rate and mean score against the baseline
before the window, regressed slices first and flagged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import dash
import plotly.graph_objects as go
from dash import dcc, html

from servelens.dashboard import data, timecharts
from servelens.dashboard.components import (BADGES, LOADING, SERIES_COLORS, chart_layout, empty, graph, integer, label,
                                            page, panel, pct, plain, register_refresh, search_box, top_table,
                                            updated_line)
from servelens.dashboard.timecharts import CONTROL, Chart, Line

dash.register_page(__name__, path="/quality", name="Quality", title="Quality · servelens")

# analytics.quality.SLICE_KEYS, labelled.
BY_OPTIONS = {"task_type": "Task type", "language": "Language", "length_class": "Length class", "model": "Model",
              "deployment": "Deployment", "tenant": "Tenant"}
DEFAULT_BY = "task_type"
CHART_SLICES = 12  # bars beyond a dozen slices stop being readable; the table lists all
WINDOW_COLOR, BASELINE_COLOR, REGRESSED_COLOR = SERIES_COLORS[0], "#c9ced8", "#c0392b"
NO_EVALUATIONS = ("No evaluation results in this window. Send them as gen_ai.evaluation.result span events on the "
                  "LLM request's span, or POST them to /api/v1/evaluations.")


def _points(value: float) -> str:
    return f"{value * 100:+.1f} pts".replace("-", "−")  # a minus sign, as the cost page's changes


def _score(value: float) -> str:
    return f"{value:.3f}"


def _p_value(value: float) -> str:
    return f"{value:.2g}" if value >= 1e-4 else "< 0.0001"


COLUMNS = (
    ("label", "Slice", str), ("evaluations", "Evaluations", integer), ("pass_rate", "Pass rate", pct),
    ("mean_score", "Mean score", _score), ("baseline_evaluations", "Baseline evals", integer),
    ("baseline_pass_rate", "Baseline", pct), ("delta", "Change", _points), ("p_value", "p-value", _p_value),
    ("status", "Status", plain),
)


def slice_label(row: dict[str, Any]) -> str:
    """'summarize', or 'summarize · de' for a pair; '(none)' for requests without the key."""
    return " · ".join(str(v) if v else "(none)" for v in (row.get("slice") or {}).values()) or "(all)"


def _status(row: dict[str, Any]) -> str:
    if row.get("regressed"):
        return BADGES["regressed"]  # shown as a flag by top_table
    return "no baseline" if row.get("baseline_pass_rate") is None else ""


def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Regressed slices first; within each group the report's order (most evaluations first)."""
    return sorted(rows, key=lambda r: not r.get("regressed"))


def regressed_note(rows: list[dict[str, Any]]) -> html.Div | None:
    regressed = [f"{slice_label(r)} ({pct(r['baseline_pass_rate'])} → {pct(r['pass_rate'])})"
                 for r in rows if r.get("regressed")]
    if not regressed:
        return None
    return html.Div(f"Pass rate regressed against the baseline: {', '.join(regressed)}", className="alert")


def totals(top: data.Top) -> str:
    """Over every slice, not only the ones the table shows."""
    if not top.rows:
        return ""
    total = top.total or {}
    return (f"{integer(total.get('evaluations') or 0)} evaluations in {integer(top.groups)} slices, "
            f"{integer(total.get('regressed') or 0)} regressed")


def pass_rate_figure(rows: list[dict[str, Any]], range_label: str) -> go.Figure:
    """Each slice's pass rate beside its baseline's. A regressed slice's bar is red: a trace
    of its own in the window's slot (one offsetgroup), so the legend names both colours."""
    rows = rows[:CHART_SLICES]
    labels = [label(slice_label(r)) for r in rows]

    def window_bar(name: str, color: str, regressed: bool) -> go.Bar:
        return go.Bar(name=name, y=labels, x=[r["pass_rate"] if bool(r.get("regressed")) == regressed else None
                                               for r in rows],
                      orientation="h", marker_color=color, offsetgroup="window",
                      hovertemplate=f"%{{y}} {name}: %{{x:.1%}}<extra></extra>")

    fig = go.Figure([
        window_bar(f"last {range_label}", WINDOW_COLOR, False),
        window_bar("regressed", REGRESSED_COLOR, True),
        go.Bar(name="baseline", y=labels, x=[r.get("baseline_pass_rate") for r in rows], orientation="h",
               marker_color=BASELINE_COLOR, offsetgroup="baseline",
               hovertemplate="%{y} baseline: %{x:.1%}<extra></extra>"),
    ])
    fig.update_layout(**chart_layout(80 + 44 * len(rows), barmode="group", bargap=0.3))
    fig.update_yaxes(autorange="reversed", ticklabelstandoff=6)
    fig.update_xaxes(tickformat=".0%", range=[0, 1], title_text="pass rate")
    return fig


CHARTS = (
    Chart("pass", "Pass rate over time", (Line("pass_rate", "pass rate", CONTROL),), unit="%", control="by"),
)


def layout(**_query: str) -> html.Div:
    return page(
        "qual", "Quality slices",
        html.Div(className="toolbar", children=[
            html.Span("Slice by", className="muted"),
            dcc.Dropdown(id="qual-by", className="filter-dropdown", clearable=False, searchable=False,
                         value=DEFAULT_BY, options=[{"label": v, "value": k} for k, v in BY_OPTIONS.items()],
                         persistence=True, persistence_type="session"),
        ]),
        html.Div(id="qual-regressed"),
        html.Div(id="qual-total", className="page-summary"),
        timecharts.charts_row("qual", CHARTS),
        panel("Slices", search_box("qual-search", "slices"), html.Div(id="qual-table", children=LOADING),
              extra_class="gap-below"),
        panel("Pass rate against the baseline", html.Div(id="qual-chart")),
    )


def fetch(source: data.DataSource, filters: data.Filters, by: str | None, search: str | None) -> tuple[str, data.Top]:
    by = by if by in BY_OPTIONS else DEFAULT_BY
    # regressed slices first (as ordered() puts them), then the most evaluated
    return by, source.top("quality", filters, by, ("regressed", "evaluations"), search)


def _shown(row: dict[str, Any], by: str) -> dict[str, Any]:
    if row.get("_other"):
        return {**row, "label": row[by], "status": ""}
    return {**row, "label": slice_label(row), "status": _status(row)}


def render(fetched: tuple[str, data.Top], filters: data.Filters) -> tuple:
    by, top = fetched
    rows = top.rows
    chart = graph(pass_rate_figure(rows, filters.range_label)) if rows else empty(NO_EVALUATIONS)
    shown = replace(top, rows=[_shown(r, by) for r in rows], other=top.other and _shown(top.other, by))
    return (regressed_note(rows), totals(top),
            top_table(shown, COLUMNS, NO_EVALUATIONS, "slices", "regression, then evaluations"), chart,
            updated_line(filters, f"by {BY_OPTIONS[by].lower()}"))


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "qual", ("regressed", "total", "table", "chart", "updated"), fetch, render,
                     controls=("by", "search"))
    timecharts.register(app, "qual", CHARTS)
