"""Workload: how traffic arrives and what it asks for, per service."""

from __future__ import annotations

import dash
from dash import html

from servelens.dashboard import data, timecharts
from servelens.dashboard.components import (LOADING, NO_REQUESTS, DataBar, integer, page, panel, pct, register_refresh,
                                            search_box, top_table, updated_line)
from servelens.dashboard.timecharts import Chart, Line

dash.register_page(__name__, path="/workload", name="Workload", title="Workload · servelens")


def _rps(value: float) -> str:
    """A rate in the largest unit that keeps it at 1 or above (sparse traffic: per hour)."""
    if value >= 1:
        return f"{value:,.1f}/s"
    if value * 60 >= 1:
        return f"{value * 60:,.1f}/min"
    return f"{value * 3600:,.2f}/h"


def _ratio(value: float) -> str:
    return f"{value:,.1f}×"


def _tokens(value: float) -> str:
    return f"{value:,.0f}"  # interpolated quantiles: round, don't truncate


def _prompt_output(value: float) -> str:
    return f"{value:,.1f} : 1"


COLUMNS = (
    ("service", "Service", str), ("requests", "Requests", integer),
    ("arrival_rps_mean", "Arrivals mean", _rps), ("arrival_rps_peak", "Peak", lambda v: f"{v:,}/s"),
    ("peak_to_average", "Peak/avg (1 min)", _ratio), ("burstiness", "Burstiness", lambda v: f"{v:,.2f}"),
    ("input_tokens_p50", "Input p50", _tokens), ("input_tokens_p99", "Input p99", _tokens),
    ("output_tokens_p50", "Output p50", _tokens), ("output_tokens_p99", "Output p99", _tokens),
    ("prompt_to_output_ratio", "Prompt:output", _prompt_output),
    ("prefix_reuse_rate", "Prefix reuse", pct), ("batch_share", "Batch", pct),
)


# The table's token percentiles carry bars on one scale (prompts against answers); the
# arrivals are read over time in their chart, where a bar of the mean beside the peak
# second (often 100x apart) showed little.
TOKEN_BARS = tuple(DataBar(key, lambda row, key=key, color=color: ((row.get(key), color),))
                   for key, color in (("input_tokens_p50", "#a9c1f5"), ("input_tokens_p99", "#2f6fed"),
                                      ("output_tokens_p50", "#b9e0c6"), ("output_tokens_p99", "#2d9a5b")))


CHARTS = (
    Chart("arrivals", "Arrival rate over time (requests/s)", (Line("arrival_rps", "arrivals", "service"),)),
    Chart("tokens", "Tokens over time", (Line("input_tokens", "input"), Line("output_tokens", "output", dash="dot"))),
)


def layout(**_query: str) -> html.Div:
    return page(
        "wl", "Workload shape",
        timecharts.charts_row("wl", CHARTS),
        panel("By service", search_box("wl-search", "services"), html.Div(id="wl-table", children=LOADING),
              extra_class="gap-below"),
    )


def fetch(source: data.DataSource, filters: data.Filters, search: str | None) -> data.Top:
    return source.top("workload", filters, "service", "requests", search)


def render(top: data.Top, filters: data.Filters) -> tuple:
    return top_table(top, COLUMNS, NO_REQUESTS, "services", "requests", TOKEN_BARS), updated_line(filters)


def register_callbacks(app: dash.Dash) -> None:
    register_refresh(app, "wl", ("table", "updated"), fetch, render, controls=("search",))
    timecharts.register(app, "wl", CHARTS)
