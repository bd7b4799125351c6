"""A chart over time draws the series that hold a value in the range; a group with none
(a model that reports no TTFT, a deployment with no queue) is named in the chart's note,
not drawn as an empty legend entry. Spans go through the real OTLP/HTTP receiver."""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from servelens.dashboard import data, timecharts
from servelens.dashboard.app import create_app
from tests.dashboard.conftest import make_traffic, send

pytestmark = pytest.mark.integration


def _texts(component) -> list[str]:
    if isinstance(component, str):
        return [component]
    children = getattr(component, "children", None)
    children = children if isinstance(children, list) else [children]
    return [t for c in children if c is not None for t in _texts(c)]


def test_a_group_without_a_value_is_named_not_drawn(otlp_http, store, settings):
    traffic = [replace(r, ttft=None) if r.model == "llama-3-8b" else r
               for r in make_traffic(60, seed=5, ago=(120, 3 * 3600))]
    send(otlp_http, traffic)
    create_app(settings, None)  # Dash Pages imports a page for an app, not before
    latency = importlib.import_module("servelens.dashboard.pages.latency")
    source = data.DataSource(settings, store)
    filters = data.Filters(range="6h")
    chart = next(c for c in latency.CHARTS if c.name == "ttft")
    fetched = data.one_reading(lambda: timecharts.fetch(source, filters, chart, "model"))
    (drawn,) = timecharts.render(chart, "lat", fetched, filters)
    graph, note = drawn.children
    names = {t["name"] for t in graph.figure["data"]}
    assert names == {"gpt-4o-mini", "gpt-4o"}
    assert all(any(y is not None for y in t["y"]) for t in graph.figure["data"])
    assert _texts(note) == ["No value in this range for llama-3-8b"]


def test_a_stacked_area_starts_and_ends_where_its_values_do():
    """A stacked area draws a missing value as zero: idle GPU cost before the first GPU
    sample (null in the series) is drawn from the first value, not as $0 before it. An
    unstacked line keeps every point (a null there is a gap)."""
    hours = [f"2026-12-06T{h:02d}:00:00Z" for h in range(6)]
    values = [None, None, 1.5, None, 2.0, None]
    doc = {"bucket": "1h", "series": [{"key": {"deployment": "d1"}, "points": [list(p) for p in zip(hours, values)]}]}
    line = timecharts.Line("idle_cost_usd", "idle", "deployment")
    stacked = timecharts.Chart("idle", "Idle cost over time", (line,), unit="$", stacked=True)
    (trace,) = timecharts.figure(stacked, [(line, doc)], [], data.Filters(range="24h"))["data"]
    assert trace["x"] == hours[2:5] and trace["y"] == [1.5, None, 2.0]
    (trace,) = timecharts.figure(replace(stacked, stacked=False), [(line, doc)], [], data.Filters(range="24h"))["data"]
    assert trace["x"] == hours and trace["y"] == values
