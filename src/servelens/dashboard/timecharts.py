"""Charts over time, one module for every page: a panel, its refresh, and its figure.

A chart is a list of series (analytics/reports/series.py, the same documents as
`GET /api/v1/series/<metric>`) drawn as lines sharing the time axis of the global range.
Every chart's graph carries the id {"type": CHART_TYPE, ...}: dragging across any of them
sets the global range to what was selected (dashboard/app.py listens to them all).
Where a page has a ceiling or band to show (a stage budget, a baseline), `marks` adds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

import dash
import plotly.io as pio
from dash import dcc, html

from servelens.analytics.reports import series
from servelens.dashboard import data, traces_links
from servelens.dashboard.components import LOADING, SERIES_COLORS, chart_layout, empty, label, panel, register_refresh

CHART_TYPE = "timechart"
NO_DATA = "Nothing in this range yet."
CONTROL = "$control"  # a Line's `by` that follows the chart's control (a page's "group by")


@dataclass(frozen=True)
class Line:
    """One metric of a chart; `by` splits it into a line per key (the heaviest first)."""
    metric: str
    name: str
    by: str | None = None
    dash: str = "solid"


@dataclass(frozen=True)
class Chart:
    name: str  # unique on its page: the panel's ids are {prefix}-ts-{name}
    title: str
    lines: tuple[Line, ...]
    unit: str = ""  # "ms", "%", "$" or "" (a count)
    stacked: bool = False
    height: int = 220
    control: str | None = None  # the page control (`{prefix}-{control}`) whose value is CONTROL
    marks: Callable[[data.DataSource, data.Filters], list[dict[str, Any]]] | None = field(default=None, compare=False)


def chart_panel(prefix: str, chart: Chart, extra_class: str = "") -> html.Section:
    return panel(chart.title, html.Div(id=f"{prefix}-ts-{chart.name}", children=LOADING, className="timechart"),
                 extra_class=f"panel-chart {extra_class}".strip())


def charts_row(prefix: str, charts: Sequence[Chart]) -> html.Div:
    return html.Div([html.Div(id=f"{prefix}-ts-alert"),
                     html.Div(className="panels charts gap-below", children=[chart_panel(prefix, c) for c in charts])])


def _controls(charts: Sequence[Chart]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c.control for c in charts if c.control))


def fetch(source: data.DataSource, filters: data.Filters, chart: Chart, control: str | None = None,
          read_with: Mapping[str | None, Sequence[str]] | None = None) -> tuple[list[tuple[Line, dict]], list]:
    """`read_with`: per grouping, every metric the page's charts read (data.DataSource.series
    `also`), so that their request stats are one query."""
    params = filters.params()
    docs = _docs(source, chart, params, control, read_with or {})
    marks = chart.marks(source, filters) if chart.marks else []
    return docs, marks


def _lines(chart: Chart, control: str | None) -> list[Line]:
    return [Line(line.metric, line.name, control, line.dash) if line.by == CONTROL else line for line in chart.lines]


def _docs(source: data.DataSource, chart: Chart, params: dict[str, Any], control: str | None,
          read_with: Mapping[str | None, Sequence[str]]) -> list:
    return [(line, source.series(line.metric, {**params, **({"by": line.by} if line.by else {})},
                                 also=read_with.get(line.by, ())))
            for line in _lines(chart, control)]


_SCALE = {"%": 100.0}
_HOVER = {"ms": "%{y:,.0f} ms", "%": "%{y:.2f} %", "$": "$%{y:,.4f}", "": "%{y:,.4g}"}


def _drill(metric: str) -> dict[str, str]:
    """How a bucket's requests are listed when a point is clicked: the ones the metric
    is about, in the order that explains it."""
    if metric.startswith(("latency", "tpot", "queue")):
        return {"sort": "latency"}
    if metric.startswith("ttft"):
        return {"sort": "ttft"}
    if metric.startswith("cost"):
        return {"sort": "cost"}
    if metric in ("errors", "error_rate", "rate_limited"):
        return {"error": "true"}
    return {}


def _link(line: Line, key: Any, bucket: str, filters: data.Filters) -> dict[str, Any]:
    """How a click on one of the line's points opens that bucket's requests: the Traces
    page's query less its window, and the bucket's length (the browser adds since/until
    from the point: app.py). One per line, not one href per point: those were most of a
    refresh's bytes (BENCHMARKS.md "Dashboard cardinality")."""
    narrowed = {line.by: key} if line.by in traces_links.FILTER_KEYS and key is not None else {}
    units = {k: getattr(filters, k) for k in data.FILTER_KEYS if getattr(filters, k)}
    return {"href": traces_links.href(None, **{**units, **narrowed, **_drill(line.metric)}),
            "step_s": series.BUCKETS[bucket]}


# The figure as Plotly.js reads it, built as plain data: plotly.graph_objects validates
# and deep-copies its template on every figure, 50 ms each, most of a page's chart refresh
# (BENCHMARKS.md "Dashboard cardinality"). The template's layout part is read once.
# Room for a y label such as "12.5k ms" or "$0.0125", and a date label's two lines.
_MARGIN = {"l": 64, "r": 16, "t": 28, "b": 44}
_TEMPLATE = {"layout": pio.templates["plotly_white"].to_plotly_json()["layout"]}


def figure(chart: Chart, docs: Sequence[tuple[Line, dict]], marks: Sequence[dict[str, Any]],
           filters: data.Filters) -> dict[str, Any]:
    traces = []
    scale = _SCALE.get(chart.unit, 1.0)
    colors = iter(SERIES_COLORS * 4)
    for line, doc in docs:
        for s in doc["series"]:
            key = next(iter(s["key"].values()), None) if s["key"] else None
            name = line.name if key is None else f"{label(key)} · {line.name}" if len(chart.lines) > 1 else label(key)
            points = _valued_span(s["points"]) if chart.stacked else s["points"]
            trace = {"type": "scatter", "name": name, "mode": "lines", "connectgaps": False,
                     "x": [p[0] for p in points],
                     "y": [None if p[1] is None else p[1] * scale for p in points],
                     "line": {"width": 1.6, "dash": line.dash, "color": next(colors)},
                     "meta": _link(line, key, doc["bucket"], filters),
                     "hovertemplate": f"%{{fullData.name}}<br>%{{x}}: {_HOVER.get(chart.unit, _HOVER[''])}<extra></extra>"}
            if chart.stacked:
                trace["stackgroup"] = "one"
            traces.append(trace)
    since, until = filters.window()
    layout = chart_layout(chart.height, dragmode="zoom", hovermode="x unified", showlegend=len(traces) > 1)
    layout.update(template=_TEMPLATE,
                  # Margins fixed to fit the labels, not grown to them: a grown margin makes
                  # plotly.js draw the chart twice (BENCHMARKS.md, "Dashboard load in the browser").
                  margin=_MARGIN,
                  xaxis={"range": [since.isoformat(), until.isoformat()], "type": "date", "automargin": False},
                  yaxis={"rangemode": "tozero", "fixedrange": True, "automargin": False,
                         "ticksuffix": {"ms": " ms", "%": " %"}.get(chart.unit, ""),
                         "tickprefix": "$" if chart.unit == "$" else ""},
                  shapes=[_shape(mark, scale) for mark in marks],
                  annotations=[_annotation(mark, scale) for mark in marks if mark.get("text")])
    return {"data": traces, "layout": layout}


def _valued_span(points: Sequence[Sequence[Any]]) -> Sequence[Sequence[Any]]:
    """The points from a series' first value to its last. A stacked area draws a missing
    value as zero: idle GPU cost before the first GPU sample is not known to be $0, so
    the area starts where the values do (the x axis keeps the whole window)."""
    valued = [i for i, p in enumerate(points) if p[1] is not None]
    return points[valued[0]:valued[-1] + 1] if valued else []


def _shape(mark: dict[str, Any], scale: float) -> dict[str, Any]:
    color = mark.get("color", "#c0392b")
    if "y" in mark:  # a ceiling: a dotted line across the chart
        y = mark["y"] * scale
        return {"type": "line", "xref": "x domain", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y,
                "line": {"dash": "dot", "color": color}}
    # an episode: a shaded span
    return {"type": "rect", "xref": "x", "x0": mark["x0"], "x1": mark["x1"], "yref": "y domain", "y0": 0, "y1": 1,
            "fillcolor": color, "opacity": 0.12, "line": {"width": 0}, "layer": "above"}


def _annotation(mark: dict[str, Any], scale: float) -> dict[str, Any]:
    """A mark's text at its top left, as Plotly's add_hline/add_vrect place it."""
    where = ({"xref": "x domain", "x": 0, "yref": "y", "y": mark["y"] * scale, "yanchor": "bottom"} if "y" in mark
             else {"xref": "x", "x": mark["x0"], "yref": "y domain", "y": 1, "yanchor": "top"})
    return {"text": label(mark["text"]), "showarrow": False, "xanchor": "left", **where}


def render(chart: Chart, prefix: str, fetched: tuple[list[tuple[Line, dict]], list], filters: data.Filters) -> tuple:
    docs, marks = fetched
    docs, valueless = _with_values(docs)
    if not any(doc["series"] for _, doc in docs):
        return (empty(NO_DATA),)
    omitted = sum(doc.get("omitted", 0) for _, doc in docs)
    notes = [f"{omitted} smaller series not drawn"] if omitted else []
    if valueless:  # e.g. the queue wait of a deployment that reports none: said, not drawn
        shown = ", ".join(valueless[:MAX_NAMED])
        more = f" and {len(valueless) - MAX_NAMED} more" if len(valueless) > MAX_NAMED else ""
        notes.append(f"No value in this range for {shown}{more}")
    note = html.Div("; ".join(notes), className="muted") if notes else None
    return (html.Div([graph_of(prefix, chart, docs, marks, filters), note]),)


MAX_NAMED = 5  # series named in a chart's note; the rest counted


def _with_values(docs: Sequence[tuple[Line, dict]]) -> tuple[list[tuple[Line, dict]], list[str]]:
    """The docs without their series that hold no value at all (a legend entry with no
    line reads as a line still loading), and those series' group labels, once each."""
    kept, valueless = [], {}
    for line, doc in docs:
        series = []
        for s in doc["series"]:
            if any(p[1] is not None for p in s["points"]):
                series.append(s)
            else:
                valueless[label(next(iter(s["key"].values()), None)) if s["key"] else line.name] = None
        kept.append((line, {**doc, "series": series}))
    return kept, list(valueless)


def graph_of(prefix: str, chart: Chart, docs: Sequence[tuple[Line, dict]], marks: Sequence[dict[str, Any]],
             filters: data.Filters) -> dcc.Graph:
    return dcc.Graph(id={"type": CHART_TYPE, "page": prefix, "name": chart.name},
                     figure=figure(chart, docs, marks, filters),
                     config={"displayModeBar": False, "scrollZoom": False})


def register(app: dash.Dash, prefix: str, charts: Sequence[Chart]) -> None:
    """One refresh for a page's charts: one reading of the store (data.one_reading), so they
    share their queries (the request stats of one grouping and bucket are read once,
    analytics/reports/series.py), and a page's refreshes stay within what the server runs at
    once (dashboard.guard)."""
    controls = _controls(charts)

    def fetch_all(source: data.DataSource, filters: data.Filters, *values: str | None) -> list:
        chosen = dict(zip(controls, values))
        picked = [(c, chosen.get(c.control) if c.control else None) for c in charts]
        read_with: dict[str | None, list[str]] = {}
        for chart, control in picked:
            for line in _lines(chart, control):
                read_with.setdefault(line.by, []).append(line.metric)
        return [fetch(source, filters, c, control, read_with) for c, control in picked]

    def render_all(fetched: list, filters: data.Filters) -> tuple:
        return tuple(render(c, prefix, f, filters)[0] for c, f in zip(charts, fetched))

    register_refresh(app, prefix, tuple(f"ts-{c.name}" for c in charts), fetch_all, render_all,
                     controls=controls, alert_name="ts-alert")


def zoomed_range(relayout: Any) -> tuple[datetime, datetime] | None:
    """The time range a drag selected on a chart (its relayoutData), else None."""
    if not isinstance(relayout, dict):
        return None
    lo, hi = relayout.get("xaxis.range[0]"), relayout.get("xaxis.range[1]")
    if lo is None and isinstance(relayout.get("xaxis.range"), list) and len(relayout["xaxis.range"]) == 2:
        lo, hi = relayout["xaxis.range"]
    if not isinstance(lo, str) or not isinstance(hi, str):
        return None
    try:
        since, until = (data.parse_chart_time(v) for v in (lo, hi))
    except ValueError:
        return None
    return (since, until) if since < until else None
