"""What the dashboard's pages share: number formatters, the table, headline cards, badges,
chart helpers, and the one refresh callback every page registers.

A plain module: unlike a page (which registers itself with Dash Pages on import), it can be
imported without an app, so tests take the formatters from here.
"""

from __future__ import annotations

import functools
import logging
import math
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, dash_table, dcc, html

from servelens.analytics.query import QueryError
from servelens.dashboard import data
from servelens.dashboard.guard import Refused

log = logging.getLogger(__name__)

REFRESH_MS = 10_000  # every page re-reads its reports this often
NULL = "—"  # a null number: no data for it in the window, never a zero
LOADING = "…"
NO_REQUESTS = "No requests in this window."
NOT_SUMMABLE = "not summable across groups"
CHART_GROUPS = 10  # a chart draws this many groups at most (its table lists data.TOP_N)
LOAD_FAILED = "Could not load data"

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


def plain(value: Any) -> str:
    """A text column's formatter for values that are not names: shown as they are ("" for
    none), where a formatter `str` marks a name column ("(none)" when missing)."""
    return "" if value is None else str(value)


TEXT_FORMATS = (str, plain)  # left-aligned columns; any other formatter is a number's


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
    NULL for a missing value). For short lists; a report's groups go through top_table.

    Cells that are all text make one DataTable (see top_table); cells that hold components
    (badges, links) an html.Table."""
    if not rows:
        return empty(empty_text)
    numeric = [key for key, _, fmt in columns if fmt not in TEXT_FORMATS]
    cells = [{key: show(row.get(key), fmt) if fmt is not str else (row.get(key) or "(none)")
              for key, _, fmt in columns} for row in rows]
    if all(isinstance(value, str) for row in cells for value in row.values()):
        return _grid(cells, columns, numeric)
    return html.Table(className="data-table", children=[
        html.Thead(html.Tr([html.Th(label, className="num" if key in numeric else None)
                            for key, label, _ in columns])),
        html.Tbody([
            html.Tr([html.Td(row[key], className="num" if key in numeric else None) for key, _, _ in columns])
            for row in cells
        ]),
    ])


def _grid(cells: list[dict[str, str]], columns: tuple, numeric: Sequence[str],
          tooltips: list[dict[str, str]] | None = None, styles: Sequence[dict[str, Any]] = ()) -> dash_table.DataTable:
    """Text cells as one DataTable, styled as the pages' tables; flagged text (FLAGS) in red."""
    # only the columns that hold a flag (alone, or among others joined by " · "): the table
    # evaluates each conditional style per cell
    flagged = [key for key, _, fmt in columns if fmt in TEXT_FORMATS
               and any(part in FLAGS for row in cells for part in row[key].split(" · "))]
    return dash_table.DataTable(
        data=cells,
        columns=[{"id": key, "name": name} for key, name, _ in columns],
        cell_selectable=False, style_as_list_view=True, fill_width=True,
        **({"tooltip_data": tooltips, "tooltip_delay": 300, "tooltip_duration": None} if tooltips else {}),
        style_table={"overflowX": "auto"},
        style_cell={"fontFamily": FONT["family"], "fontSize": "13px", "padding": "6px 8px", "textAlign": "left",
                    "border": "none", "borderBottom": "1px solid #f0f2f5", "color": FONT["color"]},
        style_header={"fontWeight": 500, "color": "#6b7385", "backgroundColor": "white",
                      "borderBottom": "1px solid #e3e6eb"},
        style_cell_conditional=[{"if": {"column_id": key}, "textAlign": "right"} for key in numeric],
        style_data_conditional=[
            *styles,
            *({"if": {"filter_query": f'{{{key}}} contains "{flag}"', "column_id": key}, "color": "#c0392b"}
              for key in flagged for flag in FLAGS),
        ],
    )


# Text a top-N table shows in red (a flag, as badges are in the other tables).
FLAGS = ("over budget", "regressed")


@dataclass(frozen=True)
class DataBar:
    """A bar under a numeric column's cells, as a table cell's bar gauge: `segments(row)`
    gives its parts [(value, colour)], laid end to end. Every bar of a table shares one
    scale (the largest total of its groups; an "other" row has none), so cells compare
    across rows and across the bar columns. A style of the table's own, where a chart
    beside it cost the browser a plotly figure's drawing (BENCHMARKS.md, "Dashboard load
    in the browser")."""

    column: str
    segments: Callable[[dict[str, Any]], Sequence[tuple[float | None, str]]]


BAR_HEIGHT = "4px"


def bar_styles(rows: Sequence[dict[str, Any]], bars: Sequence[DataBar]) -> list[dict[str, Any]]:
    """style_data_conditional entries drawing `bars` for each row (by row index)."""
    def parts(row: dict[str, Any], bar: DataBar) -> list[tuple[float, str]]:
        return [(v, c) for v, c in bar.segments(row) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]

    drawn = [(i, bar, parts(row, bar)) for i, row in enumerate(rows) if not row.get("_other") for bar in bars]
    scale = max((sum(v for v, _ in p) for _, _, p in drawn), default=0.0)
    styles = []
    for i, bar, segments in drawn:
        if not segments or scale <= 0:
            continue
        stops, at = [], 0.0
        for value, colour in segments:
            end = at + 100 * value / scale
            stops.append(f"{colour} {at:.2f}%, {colour} {end:.2f}%")
            at = end
        stops.append(f"transparent {at:.2f}%")
        # The bar's gradient under a white layer that leaves its bottom BAR_HEIGHT showing:
        # the table passes no background-size through.
        styles.append({"if": {"row_index": i, "column_id": bar.column},
                       "backgroundImage": f"linear-gradient(to bottom, white calc(100% - {BAR_HEIGHT}), "
                                          f"transparent calc(100% - {BAR_HEIGHT})), "
                                          f"linear-gradient(90deg, {', '.join(stops)})"})
    return styles


def _cell_text(row: dict[str, Any], key: str, fmt: Callable[[Any], Any], not_summed: Sequence[str]) -> str:
    if row.get("_other") and key in not_summed:
        return "" if fmt in TEXT_FORMATS else NULL
    if fmt is str:
        return str(row.get(key) or "(none)")
    return plain(row.get(key)) if fmt is plain else show(row.get(key), fmt)


def top_table(top: data.Top, columns: tuple, empty_text: str, what: str, measure: str,
              bars: Sequence[DataBar] = ()) -> html.Div:
    """A top-N table (columns as for `table`, every cell text): its rows, the "other"
    row, and a line saying what was cut and why a number of the "other" row is missing
    (also on hover). what: the groups ("models"); measure: the order; bars: drawn under
    those columns' cells (DataBar).

    One DataTable, not an html.Table: the Dash renderer pays per component on every
    update, and 27 rows x 10 cells as html components cost ~0.4 s more to draw."""
    if not top.groups:
        return html.Div(empty(f"No {what} match “{top.search}”." if top.search else empty_text))
    rows = top.with_other()
    numeric = [key for key, _, fmt in columns if fmt not in TEXT_FORMATS]
    missing = [key for key in numeric if key in top.not_summed]
    note = f"{integer(top.groups)} {what}"
    if top.other:
        note = f"Top {len(top.rows)} of {note} by {measure}; the other {integer(top.hidden)} in one row"
        if missing:
            names = ", ".join(name for key, name, _ in columns if key in missing)
            note += f" ({names}: {NOT_SUMMABLE}, shown as {NULL})"
    grid = _grid([{key: _cell_text(row, key, fmt, top.not_summed) for key, _, fmt in columns} for row in rows],
                 columns, numeric,
                 tooltips=[{key: NOT_SUMMABLE for key in missing} if row.get("_other") else {} for row in rows],
                 styles=[*bar_styles(rows, bars),
                         *([{"if": {"row_index": len(rows) - 1}, "color": "#6b7385", "fontStyle": "italic"}]
                           if top.other else [])])
    return html.Div([grid, html.Div(note + ".", className="muted table-note")], className="top-table")


def search_box(element_id: str, what: str) -> dcc.Input:
    """A filter over a top-N table's groups (a control of register_refresh)."""
    return dcc.Input(id=element_id, type="search", debounce=True, placeholder=f"Filter {what}…",
                     maxLength=data.MAX_VALUE_CHARS, className="search-box")


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


# When the answer being rendered was computed (a shared answer can be a few seconds old).
_AS_OF: ContextVar[datetime | None] = ContextVar("servelens_as_of", default=None)


def updated_line(filters: data.Filters, *details: str) -> str:
    """The page header's note: the window, any details, and when the numbers were read."""
    read = _AS_OF.get() or datetime.now(timezone.utc)
    return " · ".join((filters.describe(), *details, f"updated {read:%H:%M:%S} UTC"))


# --- Charts --------------------------------------------------------------------------------

FONT = dict(family="-apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, Arial, sans-serif", size=12,
            color="#1d2330")
SERIES_COLORS = ("#2f6fed", "#e08a1e", "#2d9a5b", "#8e6fd8", "#c0392b", "#17a2b8", "#6b7385", "#d35fa0")


_MARKUP = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def label(value: Any) -> str:
    """A value from the data as chart text. Plotly reads a subset of HTML in every label
    (names, ticks, text, hover: <a href>, <b>, <span style>): escape it so a span
    attribute shows as typed, never as a link or styling. "(none)" for a missing value."""
    return "(none)" if value is None or value == "" else str(value).translate(_MARKUP)


def labels(rows: list[dict[str, Any]], key: str) -> list[str]:
    return [label(row.get(key)) for row in rows]


def chart_layout(height: int, **extra: Any) -> dict[str, Any]:
    return dict(template="plotly_white", height=height, font=FONT, margin=dict(l=8, r=16, t=28, b=8),
                legend=dict(orientation="h", x=0, y=1.02, yanchor="bottom", traceorder="normal"), **extra)


def graph(figure: go.Figure) -> dcc.Graph:
    return dcc.Graph(figure=figure, config={"displayModeBar": False})


def metric_bars(rows: list[dict[str, Any]], key: str, metrics: tuple[tuple[str, str], ...], text: Any,
                **xaxis: Any) -> go.Figure:
    """Horizontal bars, one group per metric and one colour per `key` value: reads well with
    a few services (the first eight; the tables list more). `text` formats each bar's label;
    xaxis: e.g. type="log"."""
    metric_labels = [name for _, name in metrics]
    fig = go.Figure([
        go.Bar(name=label(row.get(key)), y=metric_labels, x=[row.get(field) for field, _ in metrics],
               orientation="h", marker_color=color, cliponaxis=False, textposition="outside",
               text=[text(row.get(field)) if row.get(field) is not None else "" for field, _ in metrics],
               # the name by reference: a value from the data never becomes template text
               hovertemplate="%{fullData.name} · %{y}: %{text}<extra></extra>")
        for row, color in zip(rows, SERIES_COLORS)
    ])
    fig.update_layout(**chart_layout(60 + len(metrics) * (18 + 22 * min(len(rows), len(SERIES_COLORS))),
                                     barmode="group", bargap=0.3, showlegend=len(rows) > 1))
    fig.update_layout(margin=dict(r=48))  # room for the labels outside the longest bar
    fig.update_yaxes(autorange="reversed", ticklabelstandoff=6)
    fig.update_xaxes(**xaxis)
    return fig


# --- The refresh callback ------------------------------------------------------------------


def alert(text: str) -> html.Div:
    return html.Div(text, className="alert")


def quarantine_note(quarantine: dict[str, int]) -> html.Div | None:
    """Rows the store refused are in no number on the page: say so, and where they are."""
    if not quarantine["quarantined_batches"]:
        return None
    return alert(f"{quarantine['quarantined_rows']:,} acknowledged rows in {quarantine['quarantined_batches']:,} "
                 "batches were refused by the store and set aside (not counted here): `servelens spool list`")


def register_refresh(app: dash.Dash, prefix: str, outputs: Sequence[str], fetch: Callable[..., Any],
                     render: Callable[[Any, data.Filters], Sequence[Any]], controls: Sequence[str] = (),
                     alert_name: str = "alert", cache: bool = True) -> None:
    """Register a page's refresh: on the global filters, the page's dcc.Interval
    `{prefix}-refresh` and the value of `{prefix}-{name}` for each name in controls,
    fetch(source, filters, *control values) reads reports through dashboard.data and
    render(fetched, filters) returns the children of `{prefix}-{name}` for each name in
    outputs, in order. Both run under the app's guard (a deadline, panics caught). When
    they fail, those outputs keep their last children and `{prefix}-{alert_name}` says so
    in general terms (the log has the detail); otherwise the alert is cleared. A control
    value that is not a short string (not one the page sends) reaches fetch as None.

    A page whose parts cost differently registers one refresh per part, each with its own
    alert_name: the browser runs them side by side and draws each as it arrives. The
    "alert" refresh, which every page has, also pauses the interval in a hidden tab.

    What fetch returns is shared by every reader with the same filters, controls and scope
    (DataSource.answer, dashboard/results_cache.py), so fetch must only read and render
    must not change what it is given; `cache=False` for a part that shows the effect of
    an action at once (a job's progress, the users an admin just added)."""
    if cache:
        app.server.extensions.setdefault(_REFRESHES, []).append((prefix, alert_name, len(controls), fetch))

    @app.callback(
        *(Output(f"{prefix}-{name}", "children") for name in outputs),
        Output(f"{prefix}-{alert_name}", "children"),
        Input(data.FILTERS_ID, "data"),
        Input(f"{prefix}-refresh", "n_intervals"),
        *(Input(f"{prefix}-{name}", "value") for name in controls),
    )
    def refresh(filters_data: Any, _tick: Any, *values: Any) -> tuple:
        filters = data.Filters.from_store(filters_data)
        source = data.current()

        cleaned = tuple(data.clean(v) for v in values)

        compute = functools.partial(_read, fetch, source, filters, cleaned)

        def load() -> tuple:
            if not cache:
                return (*render(compute(), filters), None)
            fetched, computed = source.answer((prefix, alert_name, cleaned), filters, compute)
            token = _AS_OF.set(computed)
            try:
                return (*render(fetched, filters), None)
            finally:
                _AS_OF.reset(token)

        try:
            return source.guard.call(f"refresh of the {prefix} page", load)
        except Refused as exc:  # keep the last numbers, say they are stale
            message = f"{LOAD_FAILED}: {exc.message}."
        except QueryError:  # a parameter the page itself never sends
            log.warning("refresh of the %s page: parameters refused", prefix, exc_info=True)
            message = f"{LOAD_FAILED}: invalid parameters."
        return (*(dash.no_update,) * len(outputs), alert(message))

    if alert_name == "alert":
        pause_when_hidden(app, f"{prefix}-refresh")


def _read(fetch: Callable[..., Any], source: data.DataSource, filters: data.Filters, values: tuple) -> Any:
    """A refresh's fetch as one reading of the store (data.one_reading)."""
    return data.one_reading(lambda: fetch(source, filters, *values))


_REFRESHES = "servelens.refreshes"  # app.server.extensions: the cached refreshes, for keep_warm


def keep_warm(app: dash.Dash, source: data.DataSource, prefix: str) -> None:
    """Keep the default view (default filters, controls unset) of page `prefix` computed."""
    filters = data.Filters()
    for owner, alert_name, controls, fetch in app.server.extensions.get(_REFRESHES, ()):
        if owner == prefix:
            unset = (None,) * controls
            source.answers.pin(source.answer_key((prefix, alert_name, unset), filters),
                               functools.partial(_read, fetch, source, filters, unset))


def pause_when_hidden(app: dash.Dash, interval_id: str) -> None:
    """Disable the dcc.Interval `interval_id` while the tab is hidden (no refreshes nobody
    sees); when it shows again, tick once at once so the numbers are fresh."""
    app.clientside_callback(
        """function (visible, n) {
            if (visible === false) { return [true, window.dash_clientside.no_update]; }
            return [false, (n || 0) + 1];
        }""",
        Output(interval_id, "disabled"),
        Output(interval_id, "n_intervals"),
        Input(data.VISIBLE_ID, "data"),
        State(interval_id, "n_intervals"),
        prevent_initial_call=True,
    )
